"""The supervisor <-> data-plane message channel: a small, versioned schema and its framing.

Owns the wire between ``meshctl ztunnel run`` and its data-plane subprocess (the role ztunnel's
``zds.proto`` plays for the node agent). A frame is a 4-byte big-endian length and a UTF-8 JSON
object ``{"v": VERSION, "type": <kind>, ...}``. Invariants: a frame above ``MAX_FRAME`` or with an
unknown version, type or field is a ``ChannelError`` (the reader closes; the supervisor restarts
the data plane); message records are frozen and round-trip exactly through ``encode``/``Decoder``.
Certificates travel as PEM text inside the channel only; ``repr`` of ``Certs`` hides the key.
Version 2 added node (ambient) mode: per-identity ``Certs`` and the pod messages, which travel on
a second, SOCK_SEQPACKET channel, one frame per packet with the pod's descriptors (netns first,
then its listeners, in ``PodAdd.roles`` order) attached as SCM_RIGHTS.
"""

from __future__ import annotations

import json
import struct
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from meshctl.core.mesh.localconfig import LocalConfig
    from meshctl.core.mesh.render import PlainUpdate
    from meshctl.core.wire.dump import (
        CertificateFacts,
        Connections,
        DiscoveryFacts,
        WorkerReport,
    )

VERSION = 2
MAX_FRAME = 16 * 1024 * 1024
_HEADER = struct.Struct(">I")


class ChannelError(ValueError):
    """A frame broke the schema; the channel is unusable after it."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Hello:
    """Data plane -> supervisor, first frame: who is speaking and which versions it reads."""

    TYPE: ClassVar[str] = "hello"
    pid: int
    versions: tuple[int, ...] = (VERSION,)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProxyConfig:
    """Supervisor -> data plane: static settings. ``listeners`` maps a role to an inherited fd."""

    TYPE: ClassVar[str] = "config"
    mode: str  # "sidecar" (dedicated: one workload) or "node" (ambient: the node's pods)
    workload: str  # NS/NAME/SA of the one workload this proxy serves (sidecar mode; else "")
    listeners: dict[str, int]  # outbound, inbound, inbound_plaintext, readiness, metrics, admin
    cluster_id: str = "Kubernetes"
    trust_domain: str = "cluster.local"
    pool_max_streams: int = 100
    pool_idle_timeout: float = 300.0
    connect_timeout: float = 10.0
    handshake_timeout: float = 5.0
    drain_deadline: float = 5.0
    stream_window: int = 4 * 1024 * 1024
    connection_window: int = 16 * 1024 * 1024
    max_frame_size: int = 1024 * 1024
    mark: int = 0  # SO_MARK on upstream sockets, for capture rules that exempt by mark
    # Sidecar TPROXY interception: inbound deliveries leave from the client's address with this
    # SO_MARK (istio-iptables' connmark routes the app's replies back); 0: REDIRECT.
    tproxy_mark: int = 0
    worker: int = 0  # this child's index; worker 0 alone gets the HTTP listeners
    workers: int = 1
    metrics_dir: str = ""  # prometheus-client multiprocess directory shared by all workers
    app_probers: str = ""  # ISTIO_KUBE_APP_PROBERS as the injector wrote it (validated)
    pod_ip: str = ""  # where app probes go (the pod's INSTANCE_IP); "" = 127.0.0.1
    app_metrics: str = ""  # ISTIO_PROMETHEUS_ANNOTATIONS: the app's metrics to merge
    pod_channel: int = -1  # node mode: the inherited fd of the pod channel (SOCK_SEQPACKET)
    pod_ports: dict[str, int] = field(default_factory=dict)  # node mode: role -> port in pods


@dataclass(frozen=True, slots=True, kw_only=True)
class Certs:
    """Supervisor -> data plane: our workload key and chain, and the roots we trust."""

    TYPE: ClassVar[str] = "certs"
    # Whose certificate: "" for the one workload of sidecar mode, else a SPIFFE id (node mode:
    # every enrolled pod with that identity uses it).
    identity: str = ""
    cert_chain: str = field(repr=False)
    key: str = field(repr=False)
    roots: str = field(repr=False)
    generation: int = 0
    # What /config_dump shows of each certificate (``certificate_facts``), read here by the
    # supervisor so the data plane never loads an X.509 parser (``cryptography``: ~9 MB RSS).
    chain_facts: tuple[CertificateFacts, ...] = ()
    root_facts: tuple[CertificateFacts, ...] = ()


def certificate_facts(
    serial: str, not_before: str, not_after: str, uri_sans: list[str]
) -> CertificateFacts:
    """One certificate as ``/config_dump`` shows it (ztunnel's field names, ISO 8601 times)."""
    return {
        "serialNumber": serial,
        "validFrom": not_before,
        "expirationTime": not_after,
        "uriSans": uri_sans,
    }


@dataclass(frozen=True, slots=True, kw_only=True)
class CertSource:
    """Supervisor -> data plane: where the certificates come from and how their renewal goes
    (shown on readiness and ``/config_dump``); sent whenever that changes."""

    TYPE: ClassVar[str] = "cert_source"
    source: str  # "files" (a mounted directory) or "ca" (a CreateCertificate client)
    ca_address: str = ""
    renewing: bool = True  # False while the last attempt to renew failed
    last_error: str = ""  # why it failed (one line; never key material)
    failing_since: str = ""  # ISO 8601, when renewal started failing
    last_success: str = ""  # ISO 8601
    next_refresh: str = ""  # ISO 8601: half of the current certificate's lifetime


@dataclass(frozen=True, slots=True, kw_only=True)
class Workloads:
    """Supervisor -> data plane: a whole local-config document (already validated)."""

    TYPE: ClassVar[str] = "workloads"
    document: LocalConfig
    generation: int = 0


@dataclass(frozen=True, slots=True, kw_only=True)
class WorkloadUpdates:
    """Supervisor -> data plane: changes on top of the last ``Workloads``/``WorkloadUpdates``.

    Each update is ``records.update_to_plain``'s form (kind, key, version, record or None). A
    batch whose ``generation`` is not above the one applied is old news and is skipped.
    """

    TYPE: ClassVar[str] = "workload_updates"
    updates: tuple[PlainUpdate, ...]
    generation: int


@dataclass(frozen=True, slots=True, kw_only=True)
class XdsState:
    """Supervisor -> data plane: the discovery client's state, for ``/config_dump``."""

    TYPE: ClassVar[str] = "xds_state"
    state: DiscoveryFacts


@dataclass(frozen=True, slots=True, kw_only=True)
class Drain:
    """Supervisor -> data plane: stop accepting, finish open connections within ``deadline`` s."""

    TYPE: ClassVar[str] = "drain"
    deadline: float


@dataclass(frozen=True, slots=True, kw_only=True)
class Status:
    """Data plane -> supervisor: readiness and the generations it applied, or a problem."""

    TYPE: ClassVar[str] = "status"
    ready: bool
    certs_generation: int = -1
    workloads_generation: int = -1
    problem: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Drained:
    """Data plane -> supervisor, last frame: connections left when the drain ended."""

    TYPE: ClassVar[str] = "drained"
    remaining: int


# /config_dump across workers: each worker owns its connections, and only worker 0 serves the
# admin port, so it asks the supervisor to gather the others' reports (workers never talk to
# each other). ``request`` pairs each answer with its question on either hop.


@dataclass(frozen=True, slots=True, kw_only=True)
class Gather:
    """Data plane -> supervisor: collect every other worker's ``Report`` and answer ``Gathered``."""

    TYPE: ClassVar[str] = "gather"
    request: int


@dataclass(frozen=True, slots=True, kw_only=True)
class ReportRequest:
    """Supervisor -> data plane: answer with a ``Report`` of your open connections."""

    TYPE: ClassVar[str] = "report_request"
    request: int


@dataclass(frozen=True, slots=True, kw_only=True)
class Report:
    """Data plane -> supervisor: one worker's connections (the ``/config_dump`` section)."""

    TYPE: ClassVar[str] = "report"
    request: int
    worker: int
    pid: int
    connections: Connections


@dataclass(frozen=True, slots=True, kw_only=True)
class Gathered:
    """Supervisor -> data plane: the reports that arrived in time, and the workers that did not
    answer (restarting, or too slow); the asking worker's own report is not among them."""

    TYPE: ClassVar[str] = "gathered"
    request: int
    reports: tuple[WorkerReport, ...] = ()
    missing: tuple[int, ...] = ()


# Node mode: the pods the node agent handed over (ZDS), on the pod channel.


@dataclass(frozen=True, slots=True, kw_only=True)
class PodAdd:
    """Supervisor -> data plane: serve pod ``uid``; its descriptors come with the packet, one
    per entry of ``roles`` ("netns" first, then listener roles such as "outbound", "inbound6")."""

    TYPE: ClassVar[str] = "pod_add"
    uid: str
    name: str
    namespace: str
    service_account: str
    netns: str = ""  # what /config_dump shows: the namespace's identity (inode)
    roles: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class PodDelete:
    """Supervisor -> data plane: stop serving pod ``uid`` (close its listeners)."""

    TYPE: ClassVar[str] = "pod_delete"
    uid: str


@dataclass(frozen=True, slots=True, kw_only=True)
class PodsSynced:
    """Supervisor -> data plane: whether the node agent's snapshot has been applied (readiness
    waits for it; a lost agent connection makes it false until the next snapshot)."""

    TYPE: ClassVar[str] = "pods_synced"
    synced: bool
    reason: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayUpdate:
    """Supervisor -> gateway worker: the whole ``GatewayConfig`` (``meshctl.gateway_wire``'s
    bytes, base64), replacing the last one."""

    TYPE: ClassVar[str] = "gateway_config"
    version: str
    config: str = field(repr=False)


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayListeners:
    """Supervisor -> gateway worker, on the descriptor channel: the listening socket of every
    listener port, one descriptor per entry of ``ports`` in order; replaces the last set (a port
    left out is closed)."""

    TYPE: ClassVar[str] = "gateway_listeners"
    ports: tuple[int, ...]


Message = (
    Hello
    | ProxyConfig
    | Certs
    | CertSource
    | Workloads
    | WorkloadUpdates
    | XdsState
    | Drain
    | Status
    | Drained
    | Gather
    | ReportRequest
    | Report
    | Gathered
    | PodAdd
    | PodDelete
    | PodsSynced
    | GatewayUpdate
    | GatewayListeners
)
_KINDS: dict[str, type[Message]] = {
    k.TYPE: k
    for k in (
        Hello,
        ProxyConfig,
        Certs,
        CertSource,
        Workloads,
        WorkloadUpdates,
        XdsState,
        Drain,
        Status,
        Drained,
        Gather,
        ReportRequest,
        Report,
        Gathered,
        PodAdd,
        PodDelete,
        PodsSynced,
        GatewayUpdate,
        GatewayListeners,
    )
}


def encode(message: Message) -> bytes:
    """One frame for ``message``."""
    body: dict[str, object] = {"v": VERSION, "type": message.TYPE}
    for f in fields(message):
        value = getattr(message, f.name)
        body[f.name] = list(value) if isinstance(value, tuple) else value
    data = json.dumps(body, separators=(",", ":")).encode()
    if len(data) > MAX_FRAME:
        raise ChannelError(f"{message.TYPE} message is {len(data)} bytes; limit {MAX_FRAME}")
    return _HEADER.pack(len(data)) + data


def decode(body: bytes) -> Message:
    """The message in one frame's body (without the length prefix)."""
    try:
        raw = json.loads(body)
    except (ValueError, UnicodeDecodeError) as exc:
        raise ChannelError(f"frame is not JSON: {exc}") from exc
    if not isinstance(raw, dict):
        raise ChannelError("frame is not a JSON object")
    if raw.pop("v", None) != VERSION:
        raise ChannelError(f"unsupported channel version (this side speaks {VERSION})")
    kind = _KINDS.get(str(raw.pop("type", "")))
    if kind is None:
        raise ChannelError("unknown message type")
    names = {f.name: f for f in fields(kind)}
    unknown = set(raw) - set(names)
    if unknown:
        raise ChannelError(f"{kind.TYPE}: unknown field(s) {', '.join(sorted(unknown))}")
    # The JSON as sent: only the field names are checked here (by the constructor).
    values: Mapping[str, Any] = {k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()}
    try:
        return kind(**values)
    except TypeError as exc:
        raise ChannelError(f"{kind.TYPE}: {exc}") from exc


class Decoder:
    """Reassembles frames from a byte stream; ``feed`` returns the complete messages so far."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> list[Message]:
        self._buffer += data
        out: list[Message] = []
        while len(self._buffer) >= _HEADER.size:
            (length,) = _HEADER.unpack_from(self._buffer)
            if length > MAX_FRAME:
                raise ChannelError(f"frame of {length} bytes exceeds the {MAX_FRAME} limit")
            end = _HEADER.size + length
            if len(self._buffer) < end:
                break
            out.append(decode(bytes(self._buffer[_HEADER.size : end])))
            del self._buffer[:end]
        return out
