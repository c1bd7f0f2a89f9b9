"""Istio's ZDS (node agent -> node proxy) as values and the node proxy's rules for it.

Owns the messages of ``istio.workload.zds`` as plain records (the adapter ``meshctl.net.zds``
turns them into protobuf packets and back) and ``ProxySession``: the node proxy's side of one
connection, which decides for every request what to do and which faults end the connection
(ztunnel's ``inpod`` rules, shared notes istio-protos.md §7). Invariants: an ``add`` carries
exactly one netns descriptor and nothing else carries any; ``add`` without workload info, ``keep``
after the snapshot and a second ``snapshot_sent`` are protocol errors that stop the session for
good; a snapshot removes exactly the pods that were running but were neither added nor kept in it.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from enum import Enum

VERSION_V1 = 1
MAX_PACKET = 1024  # ztunnel reads each request into a buffer of this size; longer is truncated
DEFAULT_DIR = "/var/run/ztunnel"  # the node agents share it (a hostPath on every node)
DEFAULT_SOCKET = f"{DEFAULT_DIR}/ztunnel.sock"


@dataclass(frozen=True, slots=True)
class WorkloadInfo:
    """Who a pod is: its name, namespace and service account (its identity's parts)."""

    name: str
    namespace: str
    service_account: str

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True, slots=True)
class Add:
    """Start proxying for pod ``uid``; the packet carries the pod's netns descriptor."""

    uid: str
    info: WorkloadInfo | None  # required by ztunnel; None only when a peer left it out


@dataclass(frozen=True, slots=True)
class Keep:
    """Part of a snapshot: keep proxying ``uid`` (the agent cannot open its netns again)."""

    uid: str


@dataclass(frozen=True, slots=True)
class Delete:
    """Stop proxying for pod ``uid``."""

    uid: str


@dataclass(frozen=True, slots=True)
class SnapshotSent:
    """Every running pod has been named: the rest go."""


Request = Add | Keep | Delete | SnapshotSent


@dataclass(frozen=True, slots=True)
class Ack:
    """The answer to every request: empty ``error`` acknowledges, text refuses with a reason."""

    error: str = ""

    @property
    def ok(self) -> bool:
        return not self.error


class ZdsError(ValueError):
    """A packet that is not a ZDS message of the expected kind (``str()`` says what is wrong)."""


class Fault(Enum):
    """How a bad request ends things: drop the connection and reconnect, or stop for good."""

    RECONNECT = "reconnect"
    STOP = "stop"


@dataclass(frozen=True, slots=True)
class Verdict:
    """What the node proxy does with one request.

    ``action`` is ``add``, ``keep``, ``delete`` or ``snapshot`` when the request is acceptable;
    ``remove`` lists the pods to stop when a snapshot completes. With ``fault`` the request is
    refused (NACK ``reason``) and the connection dropped (``RECONNECT``) or the manager stopped
    (``STOP``, ztunnel's ProtocolError).
    """

    action: str = ""
    remove: frozenset[str] = frozenset()
    fault: Fault | None = None
    reason: str = ""


class ProxySession:
    """The node proxy's view of one connection to the agent: before and after the snapshot."""

    def __init__(self) -> None:
        self.snapshot_done = False
        self._named: set[str] = set()  # added or kept during the snapshot

    def receive(  # noqa: PLR0911 (one verdict per rule of the protocol)
        self, request: Request, fds: int, *, running: Collection[str]
    ) -> Verdict:
        """Judge ``request`` that arrived with ``fds`` descriptors; ``running`` are the pods
        proxied now (for the snapshot's removals)."""
        if isinstance(request, Add):
            if fds != 1:
                what = "no" if fds == 0 else f"{fds}"
                return _fault(
                    Fault.RECONNECT, f"add {request.uid}: {what} netns descriptors, want 1"
                )
        elif fds:
            return _fault(Fault.RECONNECT, f"{_kind(request)}: unexpected file descriptor")
        if isinstance(request, Add):
            if request.info is None:
                return _fault(Fault.STOP, f"add {request.uid}: workload_info is required")
            if not self.snapshot_done:
                self._named.add(request.uid)
            return Verdict(action="add")
        if isinstance(request, Keep):
            if self.snapshot_done:
                return _fault(Fault.STOP, f"keep {request.uid} after the snapshot")
            self._named.add(request.uid)
            return Verdict(action="keep")
        if isinstance(request, Delete):
            self._named.discard(request.uid)  # before the snapshot: no longer part of it
            return Verdict(action="delete")
        if self.snapshot_done:
            return _fault(Fault.STOP, "a second snapshot_sent")
        self.snapshot_done = True
        remove = frozenset(uid for uid in running if uid not in self._named)
        self._named.clear()
        return Verdict(action="snapshot", remove=remove)


def _fault(kind: Fault, reason: str) -> Verdict:
    return Verdict(fault=kind, reason=reason)


def _kind(request: Request) -> str:
    return {Add: "add", Keep: "keep", Delete: "del", SnapshotSent: "snapshot_sent"}[type(request)]
