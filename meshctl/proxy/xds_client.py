"""The proxy's discovery client: Delta ADS to a control plane, exactly as Istio's ztunnel drives it.

Owns the stream (``envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources``
over TLS with the bearer token and ``clusterid`` headers, plus ``XDS_HEADER_*``), the initial
request per type in ztunnel's order with ztunnel's node id and metadata, one ACK or NACK per
response (a NACK names each refused resource and why), reconnects with ztunnel's backoff (10 ms
doubling to 15 s; back to 10 ms after a clean end or a server recycling the stream), and feeding
its source of the proxy's store (``SourcedStore``: the local config is another) from responses.
Invariants: a refused resource never reaches the store and is not recorded as held, so a
reconnect asks for it again; after a reconnect the server is told every name and version held
(``initial_resource_versions``) and sends only the difference; the client is ``synced`` once it
has ACKed a response of each type; no token is ever logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from meshctl import rpc  # first: it quiets grpc's C core logging before grpc loads

# isort: split
from google.protobuf import json_format, struct_pb2

from meshctl import config, xds
from meshctl.core.backoff import Backoff
from meshctl.core.mesh.records import Kind, Policy, Service, Workload
from meshctl.core.mesh.store import SourcedStore, Store, Update
from meshctl.core.xds.resources import AUTHORIZATION_TYPE, TYPES
from meshctl.errors import ConfigError
from meshctl.proto import xds_pb2, xds_pb2_grpc
from meshctl.structured import InputError, load_json

if TYPE_CHECKING:
    from meshctl.core.wire.dump import DiscoveryFacts, TypeFacts

log = logging.getLogger(__name__)

# Waits before the n-th connection since the last clean end (the first: 10 ms).
RECONNECT = Backoff(first=0.01, cap=15.0)
# ztunnel: these end a stream without backoff (a server recycling streams, or a GOAWAY).
_CHEAP_ENDS = ("UNKNOWN", "CANCELLED", "DEADLINE_EXCEEDED")
_CHEAP_UNAVAILABLE = ("transport is closing", "received prior goaway", "goaway")


DEFAULT_INSTANCE_IP = "1.1.1.1"  # ztunnel's default when INSTANCE_IP is unset


class DiscoverySettings(Protocol):
    """What ``build_config`` reads of a proxy's resolved settings (ztunnel's env names)."""

    @property
    def xds_address(self) -> str | None: ...  # XDS_ADDRESS
    @property
    def xds_root_ca(self) -> str: ...  # XDS_ROOT_CA: a path or PEM
    @property
    def alt_xds_hostname(self) -> str | None: ...  # ALT_XDS_HOSTNAME
    @property
    def xds_on_demand(self) -> bool: ...  # XDS_ON_DEMAND
    @property
    def auth_token(self) -> str: ...  # AUTH_TOKEN: a path or the token
    @property
    def cluster_id(self) -> str: ...  # ISTIO_META_CLUSTER_ID
    @property
    def instance_ip(self) -> str: ...  # INSTANCE_IP
    @property
    def pod_name(self) -> str | None: ...  # POD_NAME
    @property
    def pod_namespace(self) -> str | None: ...  # POD_NAMESPACE
    @property
    def node_name(self) -> str: ...  # NODE_NAME


@dataclass(frozen=True, slots=True, kw_only=True)
class NodeInfo:
    """Who this proxy is, as ztunnel tells the control plane."""

    instance_ip: str = DEFAULT_INSTANCE_IP
    pod_name: str = ""
    pod_namespace: str = ""
    node_name: str = ""
    meta: Mapping[str, str] = field(default_factory=dict)  # ISTIO_META_<K> -> K
    meta_json: Mapping[str, Any] = field(default_factory=dict)  # ISTIO_METAJSON_<K> -> K

    @property
    def id(self) -> str:
        ns = self.pod_namespace
        return f"ztunnel~{self.instance_ip}~{self.pod_name}.{ns}~{ns}.svc.cluster.local"

    def proto(self) -> xds_pb2.Node:
        metadata = struct_pb2.Struct()
        metadata.update(
            {
                "NAME": self.pod_name,
                "NAMESPACE": self.pod_namespace,
                "INSTANCE_IPS": self.instance_ip,
                "NODE_NAME": self.node_name,
                **self.meta,
            }
        )
        for key, value in self.meta_json.items():
            json_format.ParseDict(value, metadata.fields[key])
        return xds_pb2.Node(id=self.id, metadata=metadata)


@dataclass(frozen=True, slots=True, kw_only=True)
class XdsConfig:
    address: str  # host:port
    roots: Path | bytes  # the control plane's roots: a file read at every connection, or PEM
    auth: rpc.CallAuth
    node: NodeInfo
    server_name: str | None = None  # ALT_XDS_HOSTNAME
    headers: tuple[tuple[str, str], ...] = ()  # XDS_HEADER_<name>
    connect_timeout: float = 5.0


@dataclass(slots=True)
class _TypeState:
    held: dict[str, str] = field(default_factory=dict)  # name -> version (accepted)
    acked: bool = False  # on this connection
    ever_acked: bool = False
    last_nonce: str = ""
    responses: int = 0
    nacks: int = 0
    last_nack: str = ""


OnChange = Callable[[Store, list[Update]], None]


class XdsClient:
    """One proxy's discovery client. ``run`` keeps a stream up until ``stop`` is set.

    It feeds the ``source`` of ``store`` (by default a store of its own); ``on_change`` hears
    the store as it is after each response and the updates that response made to it.
    """

    def __init__(
        self,
        config: XdsConfig,
        on_change: OnChange,
        on_state: Callable[[], None],
        *,
        store: SourcedStore | None = None,
        source: str = "xds",
    ) -> None:
        self.config = config
        self.sources = store or SourcedStore((source,))
        self.source = source
        self._on_change = on_change
        self._on_state = on_state
        self._types = {t: _TypeState() for t in TYPES}
        self.connected = False
        self.connections = 0
        self.last_error = ""
        self.synced = asyncio.Event()  # every type ACKed once: the data plane may start
        self._got_response = False  # on the current connection

    @property
    def store(self) -> Store:
        """The records discovery sent (and this client holds)."""
        return self.sources.layer(self.source)

    # -- state -----------------------------------------------------------------------------------

    def state(self) -> DiscoveryFacts:
        """What ``/config_dump`` shows (ztunnel-style names)."""
        types: dict[str, TypeFacts] = {
            t: {
                "subscription": "wildcard",
                "acked": s.acked,
                "lastAckedNonce": s.last_nonce,
                "resources": len(s.held),
                "responses": s.responses,
                "nacks": s.nacks,
                "lastNack": s.last_nack,
            }
            for t, s in self._types.items()
        }
        return {
            "address": self.config.address,
            "node": self.config.node.id,
            "connected": self.connected,
            "connections": self.connections,
            "lastError": self.last_error,
            "synced": self.synced.is_set(),
            "waitingFor": [
                t.rsplit(".", 1)[-1] for t, s in self._types.items() if not s.ever_acked
            ],
            "types": types,
        }

    # -- the loop --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        attempt = 1
        while not stop.is_set():
            attempt = await self._once(stop, attempt)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RECONNECT.delay(attempt))

    async def _once(self, stop: asyncio.Event, attempt: int) -> int:
        """One connection; returns which attempt the next one is (ztunnel's rules: 1 after a
        clean end, one more after a failure)."""
        roots = self.config.roots
        try:
            root = roots if isinstance(roots, bytes) else roots.read_bytes()
        except OSError as exc:
            self._fail(f"cannot read the control plane's roots {roots!s}: {exc.strerror}")
            return attempt + 1
        self.connections += 1
        channel = rpc.connect(
            self.config.address,
            root_pem=root,
            auth=self.config.auth,
            server_name=self.config.server_name,
        )
        try:
            await self._stream(channel, stop)
        except rpc.RpcError as exc:
            code, detail = exc.code, exc.detail
            mismatch = rpc.hostname_mismatch(detail, self.config.address, self.config.server_name)
            self._fail(f"{code}: {detail}" if mismatch is None else "; ".join(mismatch))
            cheap = code in _CHEAP_ENDS or (
                code == "UNAVAILABLE"
                and any(s in detail.lower() for s in _CHEAP_UNAVAILABLE)
                and self._got_response
            )
            return 1 if cheap else attempt + 1
        except (OSError, TimeoutError) as exc:
            self._fail(f"connection failed: {exc}")
            return attempt + 1
        finally:
            self.connected = False
            await channel.close(grace=None)
            self._on_state()
        if not stop.is_set():
            log.warning("discovery stream to %s ended; reconnecting", self.config.address)
        return 1

    def _fail(self, message: str) -> None:
        if message != self.last_error:
            log.warning("discovery at %s: %s", self.config.address, message)
        self.last_error = message
        self.connected = False
        self._on_state()

    async def _stream(self, channel: rpc.Channel, stop: asyncio.Event) -> None:
        stub = xds_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
        outbox: asyncio.Queue[xds_pb2.DeltaDiscoveryRequest | None] = asyncio.Queue()
        for type_url in TYPES:
            state = self._types[type_url]
            state.acked = False
            outbox.put_nowait(
                xds_pb2.DeltaDiscoveryRequest(
                    type_url=type_url,
                    node=self.config.node.proto(),
                    initial_resource_versions=state.held,
                )
            )

        async def requests() -> AsyncIterator[xds_pb2.DeltaDiscoveryRequest]:
            while (item := await outbox.get()) is not None:
                yield item

        self._got_response = False
        call = stub.DeltaAggregatedResources(requests(), metadata=self.config.headers)
        stopping = asyncio.ensure_future(stop.wait())
        try:
            while True:
                reading = asyncio.ensure_future(
                    rpc.read(call, what="DeltaAggregatedResources", address=self.config.address)
                )
                done, _ = await asyncio.wait(
                    {reading, stopping}, return_when=asyncio.FIRST_COMPLETED
                )
                if stopping in done:
                    reading.cancel()
                    call.cancel()
                    return
                response = reading.result()
                if response is None:
                    return  # ended with OK (a failed call raises from read())
                assert isinstance(response, xds_pb2.DeltaDiscoveryResponse)  # noqa: S101
                if not self.connected:
                    self.connected, self.last_error = True, ""
                    log.info("discovery stream to %s established", self.config.address)
                self._got_response = True
                outbox.put_nowait(self.handle(response))
                self._on_state()
        finally:
            stopping.cancel()
            outbox.put_nowait(None)

    # -- responses -------------------------------------------------------------------------------

    def handle(self, response: xds_pb2.DeltaDiscoveryResponse) -> xds_pb2.DeltaDiscoveryRequest:
        """Apply one response to the store; the ACK or NACK to send back."""
        type_url = response.type_url
        state = self._types.get(type_url)
        if state is None:
            log.warning("discovery sent unknown type %s; acknowledged", type_url)
            return xds_pb2.DeltaDiscoveryRequest(type_url=type_url, response_nonce=response.nonce)
        state.responses += 1
        updates, rejects = self._decode(type_url, response.resources, state)
        for name in response.removed_resources:
            state.held.pop(name, None)
            kinds = (
                (Kind.POLICY,) if type_url == AUTHORIZATION_TYPE else (Kind.WORKLOAD, Kind.SERVICE)
            )
            for kind in kinds:
                # An alias names no record: removing it changes nothing (as in ztunnel).
                if self.store.get(kind, name) is not None:
                    updates.append(Update(kind=kind, key=name))
                    break
        if updates:
            changed = self.sources.apply(self.source, updates)
            if changed:
                self._on_change(self.sources.current, changed)
        ack = xds_pb2.DeltaDiscoveryRequest(type_url=type_url, response_nonce=response.nonce)
        if rejects:
            message = "; ".join(rejects)
            state.nacks += 1
            state.last_nack = message
            log.error("discovery: refusing %s (nonce %s): %s", type_url, response.nonce, message)
            ack.error_detail.CopyFrom(xds_pb2.Status(message=message))
            return ack
        state.acked = state.ever_acked = True
        state.last_nonce = response.nonce
        if all(s.ever_acked for s in self._types.values()):
            self.synced.set()
        return ack

    def _decode(
        self,
        type_url: str,
        resources: Sequence[xds_pb2.Resource],
        state: _TypeState,
    ) -> tuple[list[Update], list[str]]:
        updates: list[Update] = []
        rejects: list[str] = []
        for res in resources:
            if not res.HasField("resource"):
                rejects.append(f"{res.name}: XDS payload without resource")
                continue
            try:
                record = xds.unpack(type_url, res.resource)
            except xds.WireError as exc:
                rejects.append(f"{res.name}: {exc}")
                continue
            kind = _kind(record)
            key = record.uid if isinstance(record, Workload) else record.key
            updates.append(Update(kind=kind, key=key, record=record, version=res.version))
            state.held[res.name] = res.version
        return updates, rejects


def _kind(record: Workload | Service | Policy) -> Kind:
    if isinstance(record, Workload):
        return Kind.WORKLOAD
    return Kind.SERVICE if isinstance(record, Service) else Kind.POLICY


def address_of(url: str) -> str:
    """``https://host:port`` or ``host:port`` -> ``host:port`` (ztunnel's XDS_ADDRESS is a URL).

    ``ValueError`` for a plaintext ``http://`` URL (discovery here is TLS only) or no port.
    """
    if url.startswith("http://"):
        raise ValueError("plaintext discovery (http://) is not supported; use https:// (15012)")
    address = url.removeprefix("https://").rstrip("/")
    host, colon, port = address.rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ValueError(f"{url!r} is not HOST:PORT")
    return address


def build_config(settings: DiscoverySettings, env: Mapping[str, str] | None = None) -> XdsConfig:
    """The client's configuration from the proxy's settings and Istio's env families
    (``ISTIO_META_*``, ``ISTIO_METAJSON_*``, ``XDS_HEADER_*``); ``ConfigError`` says what is
    wrong."""
    try:
        address = address_of(settings.xds_address or "")
    except ValueError as exc:
        raise ConfigError(
            f"--xds-address: {exc}",
            hint="e.g. --xds-address meshctl-controlplane.meshctl-system.svc:15012",
        ) from exc
    if settings.xds_on_demand:
        raise ConfigError(
            "XDS_ON_DEMAND=true is not supported: this data plane needs every workload up front",
            hint="unset XDS_ON_DEMAND (wildcard discovery, ztunnel's default)",
        )
    roots: Path | bytes
    if settings.xds_root_ca.lstrip().startswith("-----BEGIN"):
        roots = settings.xds_root_ca.encode()
    elif settings.xds_root_ca == "SYSTEM":
        raise ConfigError(
            "XDS_ROOT_CA=SYSTEM is not supported",
            hint="point XDS_ROOT_CA at the mesh root (the meshctl-ca-root-cert ConfigMap)",
        )
    else:
        roots = Path(settings.xds_root_ca)
        if not roots.is_file():
            raise ConfigError(
                f"the control plane's root certificate {roots} is missing",
                hint="mount the meshctl-ca-root-cert ConfigMap there, or set XDS_ROOT_CA",
            )
    meta_json: dict[str, object] = {}  # any JSON value, as Istio reads it
    for key, text in config.env_with_prefix("ISTIO_METAJSON_", env).items():
        try:
            meta_json[key] = load_json(text, f"ISTIO_METAJSON_{key}")
        except InputError as exc:
            raise ConfigError(
                f"ISTIO_METAJSON_{key} is not JSON: {exc.problem}", hint="fix its value"
            ) from exc
    headers = tuple(
        (name.lower().replace("_", "-"), value)
        for name, value in config.env_with_prefix("XDS_HEADER_", env).items()
    )
    node = NodeInfo(
        instance_ip=settings.instance_ip or DEFAULT_INSTANCE_IP,
        pod_name=settings.pod_name or "",
        pod_namespace=settings.pod_namespace or "",
        node_name=settings.node_name,
        meta=config.env_with_prefix("ISTIO_META_", env),
        meta_json=meta_json,
    )
    return XdsConfig(
        address=address,
        roots=roots,
        auth=rpc.CallAuth.from_setting(settings.auth_token, cluster_id=settings.cluster_id),
        node=node,
        server_name=settings.alt_xds_hostname,
        headers=headers,
    )
