"""Verify's ambient checks of the CNI node agent: can a pod be enrolled on every node, and is
any pod left redirected for a node proxy that is gone.

Reads each node agent's ``/status?dry-run=1`` through the API server's pod proxy (the agent's
health: its netns directory, netns the runtime pins where it cannot see them, a node proxy on
ZDS, the node's rules, a dry-run enrollment) and every pod's ``ambient.istio.io/redirection``
annotation. Invariant: read-only, and each failure names the node or pod and the fix.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, cast

from meshctl.core.k8s import ambient
from meshctl.core.k8s.install.checks import Result
from meshctl.core.k8s.install.context import CheckContext
from meshctl.errors import KubeError

from .health import AgentStatus
from .manifest import NAME, READINESS_PORT, CniValues

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Pod


def agent_status(ctx: CheckContext, pod: Pod, *, dry_run: bool = False) -> AgentStatus:
    """The agent's ``/status`` (with ``dry_run``: also a dry-run enrollment)."""
    from meshctl.kube import api

    meta = pod["metadata"]
    path = (
        f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}:{READINESS_PORT}/proxy/status"
    )
    query = [("dry-run", "1")] if dry_run else []
    return cast(AgentStatus, api.request(ctx.kube, "GET", path, query=query, timeout=10))


def running_agents(ctx: CheckContext) -> list[Pod]:
    items = ctx.of("cni", "DaemonSet")
    live = ctx.live(items[0]) if items else None
    if live is None:
        return []
    return [p for p in ctx.cluster.pods(live) if (p.get("status") or {}).get("phase") == "Running"]


def _ambient(ctx: CheckContext) -> bool:
    return ctx.values.enabled("cni") and ctx.values.own("cni", CniValues).ambient


def enrollable(ctx: CheckContext) -> Result:
    """Every node's agent could enroll an ambient pod now."""
    if not _ambient(ctx):
        return Result.skip("ambient mode is not part of this install")
    agents = running_agents(ctx)
    if not agents:
        return Result.fail(
            "no ambient node agent is running",
            hint=f"see 'kubectl -n {ctx.values.namespace} get pods "
            f"-l app.kubernetes.io/name={NAME}'",
        )
    problems: list[str] = []
    failing: list[str] = []
    for pod in agents:
        node = (pod.get("spec") or {}).get("nodeName", "?")
        try:
            health = (agent_status(ctx, pod, dry_run=True) or {}).get("ambient")
        except (KubeError, json.JSONDecodeError) as exc:
            problems.append(f"node {node}: cannot read the agent's status: {exc}")
            continue
        if not isinstance(health, dict):
            problems.append(f"node {node}: the agent reports no ambient health (an older agent?)")
            continue
        problems += [f"node {node}: {p}" for p in health.get("problems") or ()]
        failing += [f"node {node}: pod {f}" for f in health.get("failing") or ()]
    if problems:
        return Result.fail(
            f"{len(problems)} problem(s) stop ambient pods from being enrolled",
            hint="each line names the node and the fix; the agent's log says more "
            f"('kubectl -n {ctx.values.namespace} logs ds/{NAME}')",
            details=problems + failing,
        )
    if failing:
        return Result.warn(
            f"{len(failing)} pod(s) failed their last enrollment or removal",
            hint="each line says why; the pods' events (AmbientEnrollmentFailed, "
            "AmbientRemovalFailed) too",
            details=failing,
        )
    return Result.ok(f"{len(agents)} node{'s' * (len(agents) != 1)} (dry-run enrollment)")


def leftovers(ctx: CheckContext) -> Result:
    """No pod is redirected for a node proxy that is gone (an agent removed without releasing
    its pods: killed, or from an older meshctl)."""
    from meshctl.kube import objects
    from meshctl.kube.resources import PODS

    pods, _ = objects.list_objects(ctx.kube, PODS)
    # Nodes where an ambient agent runs now (installed already, or before a re-install).
    served = [str((p.get("spec") or {}).get("nodeName")) for p in pods if ambient.runs_agent(p)]
    left = ambient.left_captured(pods, served)
    if left:
        return Result.fail(
            f"{len(left)} pod(s) are still redirected to a node proxy that is gone, so they "
            "refuse every connection",
            hint="restart them ('kubectl delete pod', or 'kubectl rollout restart' of their "
            "workload), or install ambient mode again: its node agent releases or re-enrolls "
            "them",
            details=left[:20] + ([f"... and {len(left) - 20} more"] if len(left) > 20 else []),
        )
    return Result.ok()
