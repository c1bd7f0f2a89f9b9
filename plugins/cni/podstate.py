"""The node agent's record of each pod on its node, and the file that outlives the agent.

Owns ``PodState`` (what the agent knows and has done for one pod: its sandbox's netns, the
descriptor held open while captured, whether its rules are in place and a node proxy serves it,
the annotation written, the last failure reported) and ``StateFile`` (``ambient-pods.json`` in
the run directory: the netns paths the plugin reported, so a restarted agent enrolls running
pods again). Invariants: the file is replaced atomically and lists only pods with a netns; a
record whose netns is gone is not resumed; a failure to write it is logged, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from meshctl.core.wire import zds

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Pod

log = logging.getLogger(__name__)

STATE_FILE = "ambient-pods.json"
ENROLL_FAILED = "AmbientEnrollmentFailed"
REMOVAL_FAILED = "AmbientRemovalFailed"


class EnrollmentError(Exception):
    """A pod could not be enrolled (or removed: ``reason``); ``retry``: whether trying again
    later can help."""

    def __init__(self, message: str, *, retry: bool, reason: str = ENROLL_FAILED) -> None:
        super().__init__(message)
        self.retry = retry
        self.reason = reason


@dataclass(eq=False)
class PodState:
    uid: str
    namespace: str
    name: str
    netns: str = ""  # the path the plugin reported
    container: str = ""
    ips: tuple[str, ...] = ()
    pod: Pod | None = None  # the latest object seen
    fd: int | None = None  # the netns, held open while captured (the proxy's snapshot needs it)
    captured: bool = False  # in-pod rules and SNAT entry in place
    served: bool = False  # a node proxy acknowledged it
    annotated: str | None = None
    reported: str = ""  # the last failure an event was recorded for
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)  # one pod's steps at a time

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def info(self) -> zds.WorkloadInfo:
        spec: Mapping[str, object] = (self.pod or {}).get("spec") or {}
        # serviceAccount: the field's deprecated name, which old manifests still carry.
        sa = str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")
        return zds.WorkloadInfo(self.name, self.namespace, sa)


class StateFile:
    """``<run_dir>/ambient-pods.json``: each pod's netns, container and IPs, by uid."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self) -> list[PodState]:
        """The records whose netns still exists (a sandbox gone meanwhile: nothing to resume)."""
        try:
            data = json.loads(self.path.read_text())
        except (OSError, ValueError):
            return []
        out = []
        for uid, entry in (data.get("pods") or {}).items() if isinstance(data, dict) else ():
            if not isinstance(entry, dict) or not Path(str(entry.get("netns", ""))).exists():
                continue
            state = PodState(str(uid), str(entry.get("namespace")), str(entry.get("name")))
            state.netns = str(entry["netns"])
            state.ips = tuple(str(ip) for ip in entry.get("ips") or ())
            state.container = str(entry.get("containerId", ""))
            out.append(state)
        log.info("resumed %d pod netns records from %s", len(out), self.path)
        return out

    def save(self, pods: Iterable[PodState]) -> None:
        data = {
            "pods": {
                s.uid: {
                    "namespace": s.namespace,
                    "name": s.name,
                    "netns": s.netns,
                    "ips": list(s.ips),
                    "containerId": s.container,
                }
                for s in pods
                if s.netns
            }
        }
        tmp = self.path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(data))
            tmp.replace(self.path)
        except OSError as exc:
            log.warning("cannot save %s: %s", self.path, exc.strerror or exc)

    def remove(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
