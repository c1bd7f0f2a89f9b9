"""Workload discovery for the proxies: Istio's Delta ADS served from the control plane's store.

Owns ``envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources`` (types
``istio.workload.Address`` and ``istio.security.Authorization``, and ``meshctl.gateway.v1.
GatewayConfig`` for the gateway proxies, from ``gateway_configs``): each stream is authenticated
like a CA call, gets a scope (a node proxy: its node's workloads; any other caller: its own pod),
and a ``core.delta.DeltaStream`` decides what it is sent. The store is its source's (``Discovery``
owns it): this servicer only reads snapshots, and on each change the source makes it pushes to
every stream only the names that changed. Invariants: one task per stream
writes, so responses leave in the order they were decided; a slow stream does not hold up the
others or the sources (its pending changes merge until it can take them); a stream's failure or
a client's reset ends that stream only; every resource is encoded once per version however many
streams get it; StreamAggregatedResources (state of the world) is refused as UNIMPLEMENTED;
gateway config requests wait until the controller has published once (never a false removal).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from meshctl import rpc  # first: it quiets grpc's C core logging before grpc loads

# isort: split
from google.protobuf import any_pb2

from meshctl import gateway_wire, xds
from meshctl.core.mesh.store import Listener, Store, Update
from meshctl.core.pki.callers import Caller, CallerError
from meshctl.core.pki.issued import IssuedLedger, requester_of
from meshctl.core.proxystatus import syncz
from meshctl.core.xds import delta
from meshctl.core.xds.resources import (
    ADDRESS_TYPE,
    AUTHORIZATION_TYPE,
    AddressCatalog,
    PolicyCatalog,
    ProxyScope,
    changed_names,
    policy_view,
    touches,
)
from meshctl.core.xds.syncstatus import SyncBook
from meshctl.proto import xds_pb2, xds_pb2_grpc

from .gateway_configs import GatewayCatalog, GatewayConfigs
from .metrics import Metrics

log = logging.getLogger(__name__)

_BODY_CACHE = 20_000  # encoded resources kept (by key and version)
# A response this large (a full state: a stream's first, on every reconnect) is encoded once
# and the bytes written to every stream it is decided for alike (same resources, versions,
# nonce and generation): a restart's reconnecting fleet costs one encoding, not one per stream.
_SHARED_MIN = 64
_SHARED_KEEP = 4  # such encodings kept (newest first out last)


@dataclass(frozen=True, slots=True, kw_only=True)
class DebugSettings:
    """The sync report's side: who may ask, this replica's name, the CA's records."""

    namespace: str = ""  # the control plane's: its service accounts may ask
    replica: str = ""  # this replica's pod name
    issued: IssuedLedger | None = None
    stale_after: float = syncz.DEFAULT_STALE_AFTER


class StoreView(Protocol):
    """The store as its readers see it (``core.mesh.store.LiveStore``, owned by its source)."""

    @property
    def current(self) -> Store: ...

    def subscribe(self, listener: Listener) -> None: ...


class Callers(Protocol):
    """Caller authentication as the CA does it (``authn.Authenticator``)."""

    async def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Caller: ...

    def is_node_proxy(self, caller: Caller) -> bool: ...

    async def node_of(self, caller: Caller) -> str: ...


async def scope_for(caller: Caller, callers: Callers, *, cluster_id: str) -> ProxyScope:
    """Whose policies a caller enforces: a node proxy's node (its pod's, from the API), else
    its own pod; a token bound to no pod gets the global policies only."""
    if callers.is_node_proxy(caller):
        return ProxyScope(node=await callers.node_of(caller))
    if caller.pod_name:
        uid = f"{cluster_id}//Pod/{caller.namespace}/{caller.pod_name}"
        return ProxyScope(workloads=frozenset({uid}))
    return ProxyScope()


def _who(caller: Caller) -> str:
    return caller.account + (f" (pod {caller.pod_name})" if caller.pod_name else "")


def _short(type_url: str) -> str:
    return type_url.rsplit(".", 1)[-1]


@dataclass(slots=True, eq=False)  # identity: streams live in a set
class _Stream:
    caller: Caller
    scope: ProxyScope
    state: delta.DeltaStream = field(default_factory=delta.DeltaStream)
    inbox: list[delta.Request] = field(default_factory=list)
    deferred: list[delta.Request] = field(default_factory=list)  # gateway configs, not yet known
    # type URL -> names changed since the stream last took its changes (None: check all).
    changed: dict[str, set[str] | None] = field(default_factory=dict)
    since: float = 0.0  # when the oldest untaken change happened
    view: frozenset[str] = frozenset()
    wake: asyncio.Event = field(default_factory=asyncio.Event)
    # What proxy-status shows: per type, what was sent and how the proxy answered.
    book: SyncBook = field(default_factory=SyncBook)
    node_id: str = ""  # the Node the proxy sent first
    node_name: str = ""  # its NODE_NAME metadata
    connected_at: float = field(default_factory=time.monotonic)


class DiscoveryServer(xds_pb2_grpc.AggregatedDiscoveryServiceServicer):
    """The servicer; register with ``rpc.Server.add(add_..._to_server, server)``."""

    def __init__(
        self,
        store: StoreView,
        *,
        callers: Callers,
        cluster_id: str = "Kubernetes",
        metrics: Metrics | None = None,
        synced: asyncio.Event | None = None,
        gateways: GatewayConfigs | None = None,
        ingress_namespace: str = "",
        debug: DebugSettings | None = None,
    ) -> None:
        """``synced``: set by the store's source once the store is whole (None: it is).
        ``gateways``: the gateway controller's configs (None: that type has no resources);
        ``ingress_namespace``: where the ``ingress`` proxy's callers run; ``debug``: who may
        ask for the sync report, and what it names (None: nobody may)."""
        self._source = store
        self._gateways = gateways
        self._ingress_namespace = ingress_namespace
        self._callers = callers
        self._cluster_id = cluster_id
        self._debug = debug
        self.metrics = metrics
        self._streams: set[_Stream] = set()
        self._bodies: OrderedDict[tuple[str, str, str], any_pb2.Any] = OrderedDict()
        self._encoded: OrderedDict[tuple[delta.Response, str], bytes] = OrderedDict()
        self._views: dict[ProxyScope, frozenset[str]] = {}  # for the current store generation
        # Streams are answered once the store is whole (the source sets it after its first
        # lists), so no proxy ever takes a half-built store for the mesh.
        if synced is None:
            synced = asyncio.Event()
            synced.set()
        self.synced = synced
        self.closing = False  # draining: every stream ends so its proxy reconnects elsewhere
        store.subscribe(self._changed)
        if gateways is not None:
            gateways.subscribe(self._gateways_changed)

    # -- the store side --------------------------------------------------------------------------

    @property
    def store(self) -> Store:
        """The source's current snapshot."""
        return self._source.current

    def _changed(self, old: Store, new: Store, updates: Sequence[Update]) -> None:
        """The source changed the store: let every stream know which names changed."""
        self._views.clear()
        changed = changed_names(old, new, updates)
        now = time.monotonic()
        for stream in self._streams:
            _merge(stream, ADDRESS_TYPE, changed[ADDRESS_TYPE])
            names = set(changed[AUTHORIZATION_TYPE])
            if touches(stream.scope, old, new, updates):
                view = self._view(stream.scope)
                names |= view ^ stream.view
                stream.view = view
            _merge(stream, AUTHORIZATION_TYPE, names)
            if not stream.since:
                stream.since = now
            stream.wake.set()

    def _gateways_changed(self, names: set[str]) -> None:
        """The controller published: streams holding or wanting those configs are refreshed."""
        now = time.monotonic()
        for stream in self._streams:
            _merge(stream, gateway_wire.GATEWAY_TYPE, set(names))
            if not stream.since:
                stream.since = now
            stream.wake.set()

    def close_streams(self) -> None:
        """End every stream with UNAVAILABLE (and refuse new ones): called on drain, once the
        server sent its GOAWAY and stopped accepting, so proxies reconnect to another replica
        at once instead of when the drain deadline cancels their calls."""
        self.closing = True
        for stream in self._streams:
            stream.wake.set()

    @property
    def connected(self) -> int:
        return len(self._streams)

    def _view(self, scope: ProxyScope) -> frozenset[str]:
        view = self._views.get(scope)
        if view is None:
            view = self._views[scope] = policy_view(self.store, scope)
        return view

    def _catalog(self, stream: _Stream, type_url: str) -> delta.Catalog:
        if type_url == ADDRESS_TYPE:
            return AddressCatalog(self.store, stream.scope)
        if type_url == AUTHORIZATION_TYPE:
            return PolicyCatalog(self.store, stream.view)
        if type_url == gateway_wire.GATEWAY_TYPE and self._gateways is not None:
            return GatewayCatalog(
                self._gateways.current, stream.caller, ingress_namespace=self._ingress_namespace
            )
        return _Empty()

    def _body(self, type_url: str, key: str, version: str) -> any_pb2.Any:
        cache_key = (type_url, key, version)
        body = self._bodies.get(cache_key)
        if body is None and type_url == gateway_wire.GATEWAY_TYPE:
            config = self._gateways.current.get(key) if self._gateways is not None else None
            if config is None:  # decided on this very publish: cannot happen
                raise LookupError(f"{type_url} {key} vanished")
            body = self._bodies[cache_key] = any_pb2.Any(
                type_url=type_url, value=gateway_wire.encode(config)
            )
        if body is None:
            record = (
                AddressCatalog(self.store).record(key)
                if type_url == ADDRESS_TYPE
                else self.store.policy_by_key(key)
            )
            if record is None:  # decided on this very store: cannot happen
                raise LookupError(f"{type_url} {key} vanished")
            body = self._bodies[cache_key] = xds.pack(type_url, record)
            if len(self._bodies) > _BODY_CACHE:
                self._bodies.popitem(last=False)
        return body

    def _encode(
        self, response: delta.Response, version: str
    ) -> xds_pb2.DeltaDiscoveryResponse | bytes:
        """The message to write; a large one as bytes, encoded once for every stream."""
        if len(response.resources) < _SHARED_MIN:
            return self._message(response, version)
        key = (response, version)  # by value: Response is frozen
        data = self._encoded.get(key)
        if data is None:
            data = self._encoded[key] = self._message(response, version).SerializeToString()
            while len(self._encoded) > _SHARED_KEEP:
                self._encoded.popitem(last=False)
        else:
            self._encoded.move_to_end(key)
        return data

    def _message(self, response: delta.Response, version: str) -> xds_pb2.DeltaDiscoveryResponse:
        bodies = {
            r.key: self._body(response.type_url, r.key, r.version) for r in response.resources
        }
        return xds.response_to_proto(response, bodies, system_version=version)

    # -- the gRPC side ---------------------------------------------------------------------------

    # Both methods write with ``context.write`` instead of yielding (grpc.aio allows either):
    # the generated stub types them as iterators, hence the ignores.
    async def StreamAggregatedResources(  # type: ignore[override]  # noqa: N802 (gRPC name)
        self,
        request_iterator: AsyncIterator[xds_pb2.DiscoveryRequest],
        context: rpc.ServicerContext[xds_pb2.DiscoveryRequest, xds_pb2.DiscoveryResponse],
    ) -> None:
        """Only istiod's debug request ``istio.io/debug/syncz`` (what istioctl proxy-status
        sends), one answer per request; any other type is UNIMPLEMENTED."""
        caller: Caller | None = None
        answered = 0
        async for request in request_iterator:
            if request.type_url != syncz.SYNCZ_TYPE or self._debug is None:
                await rpc.abort(
                    context,
                    "UNIMPLEMENTED",
                    "state-of-the-world ADS serves istio.io/debug/syncz only; "
                    "use DeltaAggregatedResources (as ztunnel does)",
                )
            if caller is None:
                try:
                    caller = await self._callers.authenticate(rpc.call_metadata(context))
                    syncz.authorize_debug(caller, self._debug.namespace)
                except CallerError as exc:
                    log.info("syncz refused (%s) for %s: %s", exc.status, rpc.peer(context), exc)
                    await rpc.abort(context, exc.status, exc.message)
            body = syncz.encode(self.sync_report())
            answered += 1
            await context.write(
                xds_pb2.DiscoveryResponse(
                    version_info=str(self.store.generation),
                    type_url=syncz.SYNCZ_TYPE,
                    nonce=str(answered),
                    resources=[any_pb2.Any(type_url=syncz.REPORT_TYPE, value=body)],
                )
            )

    def sync_report(self) -> syncz.Report:
        """Every stream of this replica and what its CA signed (``core.proxystatus.syncz``)."""
        debug = self._debug or DebugSettings()
        now = time.monotonic()
        stale = debug.stale_after
        proxies: list[syncz.ProxyFacts] = []
        for stream in self._streams:
            caller = stream.caller
            if self._callers.is_node_proxy(caller):
                kind, node = "node proxy", stream.scope.node or stream.node_name
            else:
                gateway = gateway_wire.GATEWAY_TYPE in stream.book.types()
                kind, node = ("gateway" if gateway else "sidecar"), stream.node_name
            proxies.append(
                {
                    "id": stream.node_id,
                    "requester": requester_of(caller),
                    "account": caller.account,
                    "identity": str(caller.identity),
                    "kind": kind,
                    "node": node or caller.node_name,
                    "connectedAgo": round(now - stream.connected_at, 3),
                    "status": str(stream.book.status(now, stale)),
                    "types": stream.book.facts(now, stale),  # type: ignore[typeddict-item]
                }
            )
        proxies.sort(key=lambda p: (p["requester"], p["id"]))
        issued = debug.issued.entries() if debug.issued is not None else []
        return {
            "controlPlane": debug.replica,
            "generation": self.store.generation,
            "staleAfterSeconds": stale,
            "proxies": proxies,
            "certificates": [i.facts() for i in issued],  # type: ignore[misc]
        }

    async def DeltaAggregatedResources(  # type: ignore[override]  # noqa: N802 (gRPC name)
        self,
        request_iterator: AsyncIterator[xds_pb2.DeltaDiscoveryRequest],
        context: rpc.ServicerContext[xds_pb2.DeltaDiscoveryRequest, xds_pb2.DeltaDiscoveryResponse],
    ) -> None:
        try:
            caller = await self._callers.authenticate(rpc.call_metadata(context))
            scope = await scope_for(caller, self._callers, cluster_id=self._cluster_id)
        except CallerError as exc:
            log.info("discovery refused (%s) for %s: %s", exc.status, rpc.peer(context), exc)
            await rpc.abort(context, exc.status, exc.message)
        await self.synced.wait()
        if self.closing:
            await rpc.abort(context, "UNAVAILABLE", _DRAINING)
        stream = _Stream(caller=caller, scope=scope, view=self._view(scope))
        self._streams.add(stream)
        if self.metrics:
            self.metrics.connected_proxies.set(len(self._streams))
        log.info("discovery: %s connected (%d streams)", _who(caller), len(self._streams))
        reader = asyncio.ensure_future(self._read(stream, request_iterator))
        try:
            await self._write(stream, context, reader)
        except _Abort as exc:
            log.warning("discovery: %s: %s", _who(caller), exc)
            await rpc.abort(context, exc.code, str(exc))
        finally:
            reader.cancel()
            self._streams.discard(stream)
            if self.metrics:
                self.metrics.connected_proxies.set(len(self._streams))
            log.info("discovery: %s disconnected (%d streams)", _who(caller), len(self._streams))

    async def _read(
        self, stream: _Stream, requests: AsyncIterator[xds_pb2.DeltaDiscoveryRequest]
    ) -> None:
        async for message in requests:
            if not stream.node_id and message.HasField("node"):
                stream.node_id = message.node.id
                name = message.node.metadata.fields.get("NODE_NAME")
                stream.node_name = name.string_value if name is not None else ""
            stream.inbox.append(xds.request_from_proto(message))
            stream.wake.set()

    async def _write(
        self,
        stream: _Stream,
        context: rpc.ServicerContext[xds_pb2.DeltaDiscoveryRequest, xds_pb2.DeltaDiscoveryResponse],
        reader: asyncio.Future[None],
    ) -> None:
        while True:
            waking = asyncio.ensure_future(stream.wake.wait())
            waiting: set[asyncio.Future[Any]] = {waking, reader}
            await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            waking.cancel()
            stream.wake.clear()
            if self.closing:
                raise _Abort("UNAVAILABLE", _DRAINING)
            for response in self._decide(stream):
                await self._send(stream, context, response)
            if reader.done() and not stream.inbox:
                error = None if reader.cancelled() else reader.exception()
                if error is not None and not isinstance(error, asyncio.CancelledError):
                    log.debug("discovery: %s: stream read failed: %s", _who(stream.caller), error)
                return  # the client closed its side, or reset the stream

    def _decide(self, stream: _Stream) -> Iterable[tuple[delta.Response, float]]:
        """Requests first (in order), then the changes merged since the last call."""
        gateways_known = self._gateways is None or self._gateways.synced.is_set()
        if gateways_known and stream.deferred:
            stream.inbox[:0], stream.deferred = stream.deferred, []
        while stream.inbox:
            request = stream.inbox.pop(0)
            if request.type_url == gateway_wire.GATEWAY_TYPE and not gateways_known:
                stream.deferred.append(request)
                continue
            try:
                outcome = stream.state.receive(request, self._catalog(stream, request.type_url))
            except delta.DeltaProtocolError as exc:
                raise _Abort("INVALID_ARGUMENT", str(exc)) from exc
            stream.book.subscribed(request.type_url)
            if request.nonce:
                stream.book.answered(
                    request.type_url,
                    nonce=request.nonce,
                    error=request.error,
                    at=time.monotonic(),
                )
            self._note(stream, request, outcome)
            if outcome.response is not None:
                yield outcome.response, 0.0
        changed, since = stream.changed, stream.since
        stream.changed, stream.since = {}, 0.0
        for type_url, names in changed.items():
            response = stream.state.refresh(type_url, self._catalog(stream, type_url), names)
            if response is not None:
                yield response, since

    def _note(self, stream: _Stream, request: delta.Request, outcome: delta.Outcome) -> None:
        if outcome.nacked or (request.error is not None and request.nonce):
            names = ", ".join(f"{r.name}@{r.version}" for r in outcome.nacked) or "?"
            log.warning(
                "discovery: %s refused %s (%s): %s; not resending those versions",
                _who(stream.caller),
                _short(request.type_url),
                names,
                outcome.error,
            )
            if self.metrics:
                self.metrics.xds_rejects.labels(_short(request.type_url)).inc()
        elif outcome.unknown_nonce:
            log.debug(
                "discovery: %s acknowledged unknown nonce %s", _who(stream.caller), request.nonce
            )

    async def _send(
        self,
        stream: _Stream,
        context: rpc.ServicerContext[xds_pb2.DeltaDiscoveryRequest, xds_pb2.DeltaDiscoveryResponse],
        decided: tuple[delta.Response, float],
    ) -> None:
        response, since = decided
        version = str(self.store.generation)
        await context.write(self._encode(response, version))  # type: ignore[arg-type]
        stream.book.sent(
            response.type_url, nonce=response.nonce, version=version, at=time.monotonic()
        )
        if self.metrics:
            kind = _short(response.type_url)
            self.metrics.pushes.labels(kind).inc()
            if since:
                self.metrics.xds_push_time.labels(kind).observe(time.monotonic() - since)


_DRAINING = "the control plane is shutting down: reconnect (to another replica)"


class _Abort(Exception):  # noqa: N818
    def __init__(self, code: str, message: str) -> None:  # code: a gRPC status name
        super().__init__(message)
        self.code = code


def _merge(stream: _Stream, type_url: str, names: set[str]) -> None:
    if not names:
        return
    current = stream.changed.get(type_url, set())
    if current is not None:
        current |= names
        stream.changed[type_url] = current


class _Empty(delta.Plain):
    """The catalog of a type this server does not serve: nothing exists."""

    def resolve(self, name: str) -> tuple[str, str] | None:
        return None

    def view(self) -> Iterable[str]:
        return ()

    def in_view(self, key: str) -> bool:
        return False
