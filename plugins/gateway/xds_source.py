"""The gateway proxy's config source: its ``GatewayConfig`` from the control plane's Delta ADS.

Owns one subscription of type ``meshctl.gateway.v1.GatewayConfig`` to exactly one resource, the
proxy's own name (``<namespace>/<gateway>``, or ``ingress``), on the same TLS + bearer-token
stream the node proxy uses (``meshctl.proxy.xds_client``'s ``XdsConfig``: address, roots, token,
headers), with Istio's router node id (``router~<ip>~<pod>.<ns>~<ns>.svc.cluster.local``) and
the name also in the node metadata (``GATEWAY``) for the control plane's logs. Each config
received is decoded and handed to ``deliver``, then ACKed; one that does not decode is NACKed
with why, and the last good one stays in force. Invariants: a removal is never delivered (the
control plane removes a config when its Gateway is gone, and then the proxy's Deployment goes
too; a proxy keeps serving its last config through a control plane's absence or restart);
reconnects use the node proxy's backoff and tell the server the version held; a config of the
version in force is acknowledged and not delivered again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field, replace

from meshctl import rpc  # first: it quiets grpc's C core logging before grpc loads

# isort: split
from google.protobuf import struct_pb2

from meshctl import gateway_wire
from meshctl.core.gateway.config import GatewayConfig
from meshctl.proto import xds_pb2, xds_pb2_grpc
from meshctl.proxy.xds_client import RECONNECT, XdsConfig

log = logging.getLogger(__name__)

Deliver = Callable[[GatewayConfig], None]


@dataclass(slots=True)
class SourceState:
    """What the proxy's admin endpoint can show of its config source."""

    gateway: str
    connected: bool = False
    connections: int = 0
    version: str = ""  # of the config in force ("" = none yet)
    last_error: str = ""
    nacks: int = 0
    received: asyncio.Event = field(default_factory=asyncio.Event)  # a config was delivered


def node(config: XdsConfig, gateway: str) -> xds_pb2.Node:
    """The node this gateway proxy presents (Istio's router id, and ``GATEWAY`` metadata)."""
    n = config.node
    ns = n.pod_namespace
    metadata = struct_pb2.Struct()
    metadata.update(
        {
            "NAME": n.pod_name,
            "NAMESPACE": ns,
            "INSTANCE_IPS": n.instance_ip,
            "NODE_NAME": n.node_name,
            "GATEWAY": gateway,
            **n.meta,
        }
    )
    return xds_pb2.Node(
        id=f"router~{n.instance_ip}~{n.pod_name}.{ns}~{ns}.svc.cluster.local", metadata=metadata
    )


def handle(
    state: SourceState, response: xds_pb2.DeltaDiscoveryResponse, deliver: Deliver
) -> xds_pb2.DeltaDiscoveryRequest:
    """Apply one response: the ACK or NACK to send back."""
    ack = xds_pb2.DeltaDiscoveryRequest(type_url=response.type_url, response_nonce=response.nonce)
    if response.type_url != gateway_wire.GATEWAY_TYPE:
        return ack  # not asked for: acknowledged and ignored, as ztunnel does
    errors = []
    for resource in response.resources:
        if resource.name != state.gateway:
            continue  # not ours (the server sends only what is subscribed)
        if resource.version and resource.version == state.version:
            continue  # held already (a reconnect: the server answers a subscribed name anyway)
        try:
            config = gateway_wire.decode(resource.resource.value)
        except gateway_wire.GatewayWireError as exc:
            errors.append(f"{resource.name}: {exc}")
            continue
        config = replace(config, version=resource.version)
        deliver(config)
        state.version = resource.version
        state.received.set()
    if state.gateway in response.removed_resources:
        log.warning(
            "gateway config: the control plane has none for %s (no such Gateway of ours yet, or "
            "it was deleted); %s",
            state.gateway,
            "serving the last one" if state.version else "nothing to serve",
        )
    if errors:
        state.nacks += 1
        state.last_error = "; ".join(errors)
        log.error("gateway config refused: %s", state.last_error)
        ack.error_detail.CopyFrom(xds_pb2.Status(message=state.last_error))
    return ack


async def follow(
    config: XdsConfig,
    gateway: str,
    deliver: Deliver,
    stop: asyncio.Event,
    state: SourceState | None = None,
) -> None:
    """Keep ``gateway``'s config coming to ``deliver`` until ``stop`` is set (reconnecting)."""
    state = state or SourceState(gateway=gateway)
    attempt = 1
    while not stop.is_set():
        attempt = await _once(config, state, deliver, stop, attempt)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), RECONNECT.delay(attempt))


async def _once(
    config: XdsConfig, state: SourceState, deliver: Deliver, stop: asyncio.Event, attempt: int
) -> int:
    roots = config.roots
    try:
        root = roots if isinstance(roots, bytes) else roots.read_bytes()
    except OSError as exc:
        _fail(state, f"cannot read the control plane's roots {roots!s}: {exc.strerror}")
        return attempt + 1
    state.connections += 1
    channel = rpc.connect(
        config.address, root_pem=root, auth=config.auth, server_name=config.server_name
    )
    try:
        got = await _stream(channel, config, state, deliver, stop)
    except rpc.RpcError as exc:
        _fail(state, f"{exc.code}: {exc.detail}")
        return attempt + 1
    except (OSError, TimeoutError) as exc:
        _fail(state, f"connection failed: {exc}")
        return attempt + 1
    finally:
        state.connected = False
        await channel.close(grace=None)
    return 1 if got else attempt + 1


def _fail(state: SourceState, message: str) -> None:
    if message != state.last_error:
        log.warning("gateway config from the control plane: %s", message)
    state.last_error = message
    state.connected = False


async def _stream(
    channel: rpc.Channel,
    config: XdsConfig,
    state: SourceState,
    deliver: Deliver,
    stop: asyncio.Event,
) -> bool:
    """One stream; whether it got any response (a clean end after that reconnects at once)."""
    stub = xds_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
    outbox: asyncio.Queue[xds_pb2.DeltaDiscoveryRequest | None] = asyncio.Queue()
    outbox.put_nowait(
        xds_pb2.DeltaDiscoveryRequest(
            type_url=gateway_wire.GATEWAY_TYPE,
            node=node(config, state.gateway),
            resource_names_subscribe=[state.gateway],
            initial_resource_versions={state.gateway: state.version} if state.version else {},
        )
    )

    async def requests() -> AsyncIterator[xds_pb2.DeltaDiscoveryRequest]:
        while (item := await outbox.get()) is not None:
            yield item

    call = stub.DeltaAggregatedResources(requests(), metadata=config.headers)
    stopping = asyncio.ensure_future(stop.wait())
    got = False
    try:
        while True:
            reading = asyncio.ensure_future(
                rpc.read(call, what="DeltaAggregatedResources", address=config.address)
            )
            done, _ = await asyncio.wait({reading, stopping}, return_when=asyncio.FIRST_COMPLETED)
            if stopping in done:
                reading.cancel()
                call.cancel()
                return got
            response = reading.result()
            if response is None:
                return got
            assert isinstance(response, xds_pb2.DeltaDiscoveryResponse)  # noqa: S101
            if not state.connected:
                state.connected, state.last_error = True, ""
                log.info("gateway config stream to %s established", config.address)
            got = True
            outbox.put_nowait(handle(state, response, deliver))
    finally:
        stopping.cancel()
        outbox.put_nowait(None)
