"""What the node agent says about its health: ``/status`` (its ``ambient``), which verify reads.

Owns the report: the netns directory and whether it can be read, netns the runtime pins where
the agent cannot see them, node proxies connected over ZDS, the node's probe rules, pods
failing, and on request a dry-run enrollment (each captured pod's rules compared with what an
enrollment would write, or, with none, an enrollment into a fresh namespace of the agent's
own). Invariants: nothing is written; every problem is one sentence that says what to do.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from pathlib import Path
from typing import TypedDict

from meshctl.core.k8s import ambient
from meshctl.core.k8s.inject.errors import InvalidAnnotationError

from .kernelsteps import Kernel, KernelError
from .podstate import PodState

DRY_RUN_LIMIT = 50  # captured pods compared at most


class DryRun(TypedDict, total=False):
    ok: bool
    error: str  # the enrollment failed
    pods: int  # captured pods compared
    drifted: list[str]  # those whose rules are not what an enrollment writes


class EnrollmentRecord(TypedDict):
    """One pod as the agent holds it (``/status``'s ``pods``)."""

    namespace: str
    name: str
    uid: str
    captured: bool
    served: bool  # a node proxy acknowledged it
    redirection: str  # the annotation written (or, without an API server, that would be)
    error: str  # the last failure reported, or ""


class HealthReport(TypedDict, total=False):
    """``/status``'s ``ambient``: what ``meshctl verify`` reads of each node agent."""

    netnsDir: str
    netnsDirReadable: bool | None  # None: no netns directory configured
    netnsUnseen: dict[str, str]  # where the runtime pins netns -> a pod pinned there
    nodeProxies: int
    failing: list[str]
    dryRun: DryRun
    problems: list[str]


async def health_report(
    pods: Collection[PodState],
    *,
    netns_dir: str,
    netns_unseen: Mapping[str, str],
    proxies: int,
    zds_socket: str,
    kernel: Kernel,
    ipv6: bool,
    dry_run: bool = False,
) -> HealthReport:
    """Whether a pod can be enrolled on this node now, and what stands in the way."""
    problems: list[str] = []
    readable: bool | None = None
    if netns_dir:
        try:
            next(Path(netns_dir).iterdir(), None)
            readable = True
        except OSError as exc:
            readable = False
            problems.append(f"cannot read the netns directory {netns_dir}: {exc.strerror}")
    for where, pod in sorted(netns_unseen.items()):
        problems.append(
            f"the runtime pins pod netns in {where} (pod {pod}), which the node agent "
            f"does not mount ({netns_dir}): set components.cni.netnsDir={where}"
        )
    if not proxies:
        problems.append(f"no node proxy is connected on {zds_socket}")
    if kernel.host_error:
        problems.append(f"the node's probe rules are not in place: {kernel.host_error}")
    failing = sorted(f"{s.ref}: {s.reported}" for s in pods if s.reported)
    report: HealthReport = {
        "netnsDir": netns_dir,
        "netnsDirReadable": readable,
        "netnsUnseen": dict(sorted(netns_unseen.items())),
        "nodeProxies": proxies,
        "failing": failing,
    }
    if dry_run:
        report["dryRun"] = await _dry_run(pods, kernel, ipv6, problems)
    report["problems"] = problems
    return report


async def _dry_run(
    pods: Collection[PodState], kernel: Kernel, ipv6: bool, problems: list[str]
) -> DryRun:
    captured = [s for s in pods if s.captured and s.netns][:DRY_RUN_LIMIT]
    drifted: list[str] = []
    try:
        for state in captured:
            capture = ambient.capture_settings(state.pod or {}, ipv6=ipv6)
            if await kernel.dry_run_pod(state.netns, capture):
                drifted.append(state.ref)
        if not captured:
            await kernel.dry_run_pod(None, ambient.capture_settings({}))
    except (KernelError, InvalidAnnotationError) as exc:
        problems.append(f"a dry-run enrollment failed: {exc}")
        return {"ok": False, "error": str(exc)}
    if drifted:
        problems.append(
            f"{len(drifted)} captured pod(s) lack their capture rules: {', '.join(drifted)}"
        )
    return {"ok": not drifted, "pods": len(captured), "drifted": drifted}


class AgentStatus(TypedDict, total=False):
    """The node agent's ``/status``: the installer's readiness and repairs, and in ambient mode
    each pod's enrollment and (``ambient``) this health report."""

    ready: bool
    reason: str
    repairs: int  # within the conflict window
    repairWindowSeconds: float
    conflictRepairs: int  # more than this many repairs: another component fights ours
    pods: list[EnrollmentRecord]
    ambient: HealthReport
