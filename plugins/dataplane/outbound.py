"""Outbound (:15001): captured connections from our workload, routed by original destination.

Owns the routing of one accepted connection: a service VIP picks an endpoint and maps the port
to its target port; a workload that speaks HBONE is reached through a pooled tunnel to
``<podIP>:15008`` with ``CONNECT <podIP>:<port>``; a workload without the mesh gets plain TCP; an
unknown destination passes through. Invariants: a connection to one of our own ports on a local
address is refused (it would loop through us forever); no byte is read from the client before
its route exists; every accepted connection ends as exactly one opened or failed ``Flow``. A
tunnel the peer refused unprocessed (REFUSED_STREAM: it sent GOAWAY, draining, as the stream
left) is opened once more on another pooled connection with the bytes already sent: a node
proxy handing its pods to the next one must not cost the connections that raced its GOAWAY.
"""

from __future__ import annotations

import logging
import random
from collections.abc import Callable
from typing import TYPE_CHECKING

from meshctl.core.mesh.addresses import ip as parse_ip
from meshctl.core.mesh.store import NoHealthyEndpointError
from meshctl.core.wire.hbone.headers import format_authority, format_forwarded
from meshctl.proxy.original_dst import original_dst
from meshctl.proxy.pool import DialError
from meshctl.proxy.relay import Accepted, AppStream, Splice, dial
from meshctl.proxy.telemetry import Flow, Peer
from meshctl.proxy.tunnel import REFUSED_REASON, TunnelProtocol

if TYPE_CHECKING:
    from .served import Served

log = logging.getLogger(__name__)

REPLAY_LIMIT = 256 * 1024  # app bytes kept until the tunnel opens, to open it again if refused


class Outbound:
    """The :15001 listener's routing."""

    def __init__(self, rt: Served) -> None:
        self.rt = rt

    def accepted(self, acc: Accepted) -> None:
        self.rt.spawn(self._route(acc))

    async def _route(self, acc: Accepted) -> None:
        rt = self.rt
        local = acc.local
        dst = original_dst(acc.sock) or local
        src = Peer(acc.peer, rt.me, rt.identity)
        if self._is_self_call(dst, local[0]):
            flow = Flow(rt.telemetry, direction="outbound", src=src, dst=Peer(dst))
            flow.fail("SELF", f"refused: {dst[0]}:{dst[1]} is this proxy's own port")
            acc.refuse()
            return
        try:
            route = rt.store.resolve(dst[0], dst[1], pick=random.choice)
        except NoHealthyEndpointError as exc:
            Flow(rt.telemetry, direction="outbound", src=src, dst=Peer(dst)).fail("NR", str(exc))
            acc.refuse()
            return
        identity = route.workload.identity if route.workload else None
        if route.kind == "hbone":
            # As ztunnel logs it: dst.addr is where our TCP connection goes (the peer's :15008),
            # dst.hbone_addr the CONNECT authority (the workload's address and target port).
            flow = Flow(
                rt.telemetry,
                direction="outbound",
                src=src,
                dst=Peer(route.hbone_addr, route.workload, identity),
                service=route.service,
                mtls=True,
                hbone_addr=route.addr,
            )
            await self._tunnel(
                acc,
                flow,
                route.addr,
                route.hbone_addr,
                route.service.hostname if route.service else None,
            )
        else:
            target = Peer(route.addr, route.workload, identity)
            flow = Flow(
                rt.telemetry, direction="outbound", src=src, dst=target, service=route.service
            )
            await splice(rt, acc, flow, route.addr)

    def _is_self_call(self, dst: tuple[str, int], local_ip: str) -> bool:
        if dst[1] not in self.rt.own_ports:
            return False
        ip = parse_ip(dst[0])
        return ip.is_loopback or dst[0] == local_ip or self.rt.is_local_ip(dst[0])

    async def _tunnel(
        self,
        acc: Accepted,
        flow: Flow,
        addr: tuple[str, int],
        hbone_addr: tuple[str, int],
        host: str | None,
    ) -> None:
        rt = self.rt
        if flow.dst.identity is None:  # resolve() returns hbone only for known workloads
            flow.fail("NR", "HBONE destination without an identity")
            acc.refuse()
            return
        key = (rt.identity, flow.dst.identity, hbone_addr)
        try:
            conn = await rt.pool.connection(key)
        except DialError as exc:
            flow.fail(exc.flags, str(exc))
            acc.refuse()
            return

        def refused(status: int) -> None:
            flags = {400: "BAD_REQUEST", 401: "DENY", 503: "CONNECT"}.get(status, f"HTTP_{status}")
            flow.fail(flags, f"peer answered HTTP {status}")

        headers = [
            ("forwarded", format_forwarded(flow.src.addr[0], flow.src.addr[1], host=host)),
            ("baggage", rt.baggage),
        ]
        authority = format_authority(*addr)

        async def reopen(stream: _OutboundStream) -> None:
            try:
                again = await rt.pool.connection(key)
            except DialError as exc:
                stream.reopen_failed(exc.flags, str(exc))
                return
            stream.bind(again, again.open(authority, headers, stream))

        app = _OutboundStream(flow, refused, reopen=lambda s: rt.spawn(reopen(s)))
        # Open before the first await: the pool promised this connection room for one stream
        # now, and other waiters are handed the same connection.
        sid = conn.open(authority, headers, app)
        app.bind(conn, sid)
        try:
            await acc.hand_over(app)
        except OSError as exc:
            conn.reset(sid)
            flow.fail("CLIENT", f"client connection failed: {exc}")


class _OutboundStream(AppStream):
    """The client side's app stream: the flow opens on 200 and fails on a refusal."""

    def __init__(
        self,
        flow: Flow,
        refused: object,
        reopen: Callable[[_OutboundStream], None] | None = None,
    ) -> None:
        super().__init__(
            from_app=flow.request_bytes,
            to_app=flow.response_bytes,
            on_done=flow.close,
        )
        self.flow = flow
        self._refused = refused
        self._reopen = reopen  # once: a second refusal fails the flow
        # What went into the tunnel before it opened (None: too much to keep, or opened).
        self._replay: list[bytes] | None = []

    def bind(self, tunnel: TunnelProtocol, sid: int) -> None:
        self._keep(self._early)
        super().bind(tunnel, sid)

    def data_received(self, data: bytes) -> None:
        if self.tunnel is not None:
            self._keep([data])
        super().data_received(data)

    def tunnel_opened(self) -> None:
        self._replay = None
        self.flow.open()

    def reopen_failed(self, flags: str, reason: str) -> None:
        self.flow.fail(flags, reason)
        super().tunnel_reset(reason)

    def tunnel_refused(self, status: int) -> None:
        if callable(self._refused):
            self._refused(status)
        super().tunnel_refused(status)

    def tunnel_reset(self, reason: str) -> None:
        reopen, replay = self._reopen, self._replay
        if (
            reason == REFUSED_REASON
            and self.flow.state == "new"
            and reopen is not None
            and replay is not None
        ):
            # Never processed by the peer: the same bytes on another connection (the pool
            # no longer hands out one that is going away).
            self._reopen = None
            self._release_credit()
            self.tunnel = None
            self._early, self._replay = [*replay, *self._early], []
            log.debug("tunnel refused unprocessed (%s); opening it again", reason)
            reopen(self)
            return
        if self.flow.state == "new":
            self.flow.fail(self.tunnel.flags if self.tunnel is not None else "RESET", reason)
        super().tunnel_reset(reason)

    def _keep(self, chunks: list[bytes]) -> None:
        if self._replay is None or not chunks:
            return
        self._replay.extend(chunks)
        if sum(map(len, self._replay)) > REPLAY_LIMIT:
            self._replay = None  # a refusal now fails the flow


async def splice(
    rt: Served, acc: Accepted, flow: Flow, addr: tuple[str, int], *, inbound: bool = False
) -> None:
    """Plain TCP to ``addr`` for ``acc`` (passthrough, TCP workloads; ``inbound`` plaintext)."""
    client = Splice(flow.request_bytes, on_done=flow.close)
    upstream = Splice(flow.response_bytes)
    try:
        sock = rt.upstream_socket(addr[0], inbound=inbound, source=acc.peer[0] if inbound else None)
        await dial(sock, addr, upstream, rt.config.connect_timeout)
    except (OSError, TimeoutError) as exc:
        flow.fail("CONNECT", f"cannot connect to {addr[0]}:{addr[1]}: {exc or 'timeout'}")
        acc.refuse()
        return
    try:
        await acc.hand_over(client)
    except OSError as exc:
        flow.fail("CLIENT", f"client connection failed: {exc}")
        if upstream.transport is not None:
            upstream.transport.close()
        return
    flow.open()
    Splice.pair(client, upstream)
