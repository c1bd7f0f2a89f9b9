"""The data plane's ``/config_dump``: the JSON its admin port answers, in ztunnel's names.

Owns the shape of the dump and of its parts: each certificate's facts, the open connections
(flows) of a worker, the discovery client's state, the per-identity certificate summaries and,
in node mode, each enrolled pod's state. The data plane writes it (``plugins/dataplane/admin``),
the supervisor channel carries parts of it between processes (``channel``), and ``meshctl
verify`` and the demo read it from a proxy they did not build, so for a reader every field of
the whole dump may be absent (``total=False``). Imported for types only: the data plane and the
CNI plugin do not pay for defining these at start-up.
"""

from __future__ import annotations

from typing import NotRequired, TypedDict


class CertificateFacts(TypedDict):
    """One certificate as the supervisor describes it (hexadecimal serial, ISO 8601 times)."""

    serialNumber: str
    validFrom: str
    expirationTime: str
    uriSans: list[str]


class FlowEnd(TypedDict):
    addr: str
    workload: str | None  # NAMESPACE/NAME
    identity: str | None  # SPIFFE id


class FlowFacts(TypedDict):
    """One open connection: both ends, bytes so far."""

    direction: str
    src: FlowEnd
    dst: FlowEnd
    hboneAddr: str | None
    service: str | None
    mutualTls: bool
    bytesReceived: int
    bytesSent: int
    durationSeconds: float
    worker: NotRequired[int]  # which worker holds it (``/config_dump`` adds it)


class Connections(TypedDict):
    """One worker's connections."""

    inbound_tunnels: int
    pooled: int
    open: int
    flows: list[FlowFacts]


class WorkerReport(TypedDict):
    """A ``Report``'s fields, as ``Gathered`` carries them."""

    worker: int
    pid: int
    connections: Connections


class TypeFacts(TypedDict):
    """The discovery client's state of one resource type."""

    subscription: str
    acked: bool
    lastAckedNonce: str
    resources: int
    responses: int
    nacks: int
    lastNack: str


class DiscoveryFacts(TypedDict):
    """The discovery client's state."""

    address: str
    node: str
    connected: bool
    connections: int
    lastError: str
    synced: bool
    waitingFor: list[str]  # types not ACKed yet
    types: dict[str, TypeFacts]


class CertSourceFacts(TypedDict):
    kind: str  # "files" or "ca"
    caAddress: str
    renewing: bool
    lastError: str
    failingSince: str
    lastSuccess: str
    nextRefresh: str


class CertDump(TypedDict):
    """One certificate in ``/config_dump``: ztunnel's ``CertDump`` (base64 of the PEM, decimal
    serial, RFC 3339 times in UTC) and meshctl's ``uriSans``."""

    pem: str
    serialNumber: str
    validFrom: str
    expirationTime: str
    uriSans: list[str]


class CertificateSummary(TypedDict):
    """One identity's certificates in ``/config_dump`` (ztunnel's ``CertsDump``) and, for the
    sidecar's own, where they come from (``source``, meshctl's)."""

    identity: str
    state: str  # Available, Expired, Unavailable (none yet)
    certChain: list[CertDump]
    rootCerts: list[CertDump]
    source: NotRequired[CertSourceFacts]


class Endpoint(TypedDict):
    """A workload as an endpoint of a service (ztunnel's ``Endpoint``)."""

    workloadUid: str
    port: dict[str, int]  # service port -> target port
    status: str  # Healthy | Unhealthy


class PodInfo(TypedDict):
    name: str
    namespace: str
    serviceAccount: str


class InboundConnection(TypedDict):
    """An open connection to an enrolled pod (ztunnel's ``InboundConnectionDump``)."""

    src: str
    originalDst: str | None  # the service the client asked for
    actualDst: str
    protocol: str  # HBONE | TCP


class OutboundConnection(TypedDict):
    """An open connection from an enrolled pod (ztunnel's ``OutboundConnection``)."""

    src: str
    originalDst: str
    actualDst: str  # the HBONE tunnel's address, or the destination itself
    protocol: str  # HBONE | TCP


class PodConnections(TypedDict):
    inbound: list[InboundConnection]
    outbound: list[OutboundConnection]


class PodState(TypedDict):
    """One enrolled pod (node mode): ztunnel's ``workloadState`` entry (``state``, ``info``)
    and meshctl's facts of it (netns, listeners, identity and its certificates)."""

    info: PodInfo
    state: str  # Up | Pending
    connections: NotRequired[PodConnections]  # while Up (``/config_dump`` adds them)
    netns: str
    listeners: dict[str, str]  # role -> address
    identity: str
    certificate: CertificateSummary


class WorkerShare(TypedDict):
    index: int
    pid: int
    inboundTunnels: int
    pooled: int
    open: int


class WorkerFacts(TypedDict):
    index: int
    of: int
    pid: int


class StateSections(TypedDict):
    """What the workload store holds, as ztunnel's ``ProxyState`` serializes it."""

    workloads: list[dict[str, object]]
    services: list[dict[str, object]]
    stagedServices: dict[str, dict[str, Endpoint]]
    policies: list[dict[str, object]]


class ConfigDump(TypedDict, total=False):
    """``/config_dump``: ztunnel's shape, and each worker's share of the connections (the data
    plane writes every field but the last three's mode-dependent ones; a reader may find any
    absent)."""

    version: str
    config: dict[str, object]
    worker: WorkerFacts  # the one that answered
    workloads: list[dict[str, object]]
    services: list[dict[str, object]]
    stagedServices: dict[str, dict[str, Endpoint]]
    policies: list[dict[str, object]]
    certificates: list[CertificateSummary]
    xds: DiscoveryFacts | dict[str, object]  # {} without a discovery client
    connections: Connections
    workers: list[WorkerShare]
    workersMissing: list[int]
    identity: str  # sidecar mode: the workload's
    listeners: dict[str, str]  # sidecar mode: role -> address (node mode: per pod, below)
    workloadState: dict[str, PodState]  # node mode: uid -> pod
    podsSynced: bool
