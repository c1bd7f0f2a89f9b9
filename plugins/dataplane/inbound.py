"""Inbound HBONE (:15008): mTLS-terminated HTTP/2 CONNECT tunnels into our workload.

Owns the server side: the TLS handshake (done here with ``start_tls`` so a failed or slow
handshake is counted, not just logged by the event loop), the peer identity rule (a SPIFFE ID in
our trust domain), and the per-request verdicts: not CONNECT or a malformed ``:authority`` ->
400 (in the core), an ``:authority`` that is not our workload -> 400, authorization denied ->
401, upstream connect failure -> 503, else 200 and a byte stream. A request's flow is counted
under the Service the client's proxy says it dialled (``forwarded: host=``) if our workload backs
it (``core/inbound_service.py``). Invariant: every accepted socket ends as a counted failure or as
tunnels that each end as an opened or failed ``Flow``.
"""

from __future__ import annotations

import ipaddress
import logging
import ssl
import time
from typing import TYPE_CHECKING

from meshctl.core.mesh.addresses import ip as parse_ip
from meshctl.core.mesh.authz import ConnectionFacts, evaluate
from meshctl.core.mesh.inbound_service import inbound_service
from meshctl.core.pki.identity import IdentityError, SpiffeId, peer_identity
from meshctl.core.wire.hbone import TunnelRequested
from meshctl.core.wire.hbone.headers import parse_forwarded_host
from meshctl.proxy import tls
from meshctl.proxy.relay import Accepted, AppStream, dial
from meshctl.proxy.telemetry import Flow, Peer
from meshctl.proxy.tunnel import TunnelProtocol

if TYPE_CHECKING:
    from .served import Served

log = logging.getLogger(__name__)


class Inbound:
    """The :15008 listener."""

    def __init__(self, rt: Served) -> None:
        self.rt = rt
        self.tunnels: set[TunnelProtocol] = set()

    def accepted(self, acc: Accepted) -> None:
        self.rt.spawn(self._handshake(acc))

    async def _handshake(self, acc: Accepted) -> None:
        rt = self.rt
        src = Peer(acc.peer, rt.store.workload_by_ip(acc.peer[0]))
        contexts = rt.contexts
        if contexts is None:
            Flow(rt.telemetry, direction="inbound", src=src, dst=self._me()).fail(
                "TLS", "no certificates yet"
            )
            acc.refuse()
            return
        refusal: list[str] = []

        def check_peer(proto: TunnelProtocol) -> bool:
            td = rt.identity.trust_domain
            try:
                proto.peer = _client_identity(proto.extra_info("ssl_object"), td)
            except IdentityError as exc:
                # Also the GOAWAY's debug data: the client's logs name both identities.
                proto.error = f"client identity refused: {exc}; expected spiffe://{td}/ns/*/sa/*"
                refusal.append(f"peer refused: {exc}")
                return False
            return True

        proto = TunnelProtocol(
            client=False,
            settings=rt.tunnel_settings,
            on_connected=check_peer,
            # The addresses as accepted: every stream's flow names them, without a syscall each.
            on_request=lambda proto, ev: self._request(proto, ev, acc),
            on_rejected=lambda proto, ev: self._flow(proto, acc).fail("BAD_REQUEST", ev.reason),
            on_closed=self.tunnels.discard,
        )
        flow = Flow(rt.telemetry, direction="inbound", src=src, dst=self._me(), mtls=True)
        limit = rt.config.handshake_timeout
        try:
            await acc.hand_over(proto, ssl=contexts.server, handshake_timeout=limit)
        except (OSError, TimeoutError, ConnectionError) as exc:  # ssl.SSLError is an OSError
            # The loop reports its own timeout as a generic abort: tell it apart by its words or
            # the clock (uvloop's clock is cached per iteration, so the timer may fire a little
            # before ``limit`` has passed on ours when the loop is busy).
            slow = time.monotonic() - flow.started >= limit or _loop_timeout(exc)
            reason = f"handshake timed out after {limit:g}s" if slow else _tls_reason(exc)
            refusal.append(f"TLS handshake failed: {reason}")
        if refusal:
            flow.fail("TLS", refusal[0])
            return
        self.tunnels.add(proto)
        if rt.draining:
            proto.goaway()

    def _me(self) -> Peer:
        rt = self.rt
        ip = rt.me.workload_ips[0] if rt.me and rt.me.workload_ips else "0.0.0.0"  # noqa: S104
        return Peer((str(ip), 0), rt.me, rt.identity)

    def _flow(
        self,
        proto: TunnelProtocol,
        acc: Accepted,
        ev: TunnelRequested | None = None,
        *,
        ours: bool = False,
    ) -> Flow:
        """The flow of one CONNECT as ztunnel reports it: ``dst.addr`` the address the client's
        TCP connection reached (our :15008), ``dst.hbone_addr`` the CONNECT authority and, for a
        request to our workload (``ours``), the Service the client's proxy dialled (or one by
        port: ``inbound_service``)."""
        rt = self.rt
        identity = proto.peer if isinstance(proto.peer, SpiffeId) else None
        src = Peer(acc.peer, rt.store.workload_by_ip(acc.peer[0]), identity)
        target, service = None, None
        if ev is not None:
            target = (str(ev.authority.ip), ev.authority.port)
            if ours:
                forwarded = ev.headers.get("forwarded")
                claimed = parse_forwarded_host(forwarded) if forwarded else None
                service = inbound_service(rt.store, rt.me, ev.authority.port, claimed)
        return Flow(
            rt.telemetry,
            direction="inbound",
            src=src,
            dst=Peer(acc.local, rt.me, rt.identity),
            service=service,
            mtls=True,
            hbone_addr=target,
        )

    def _request(self, proto: TunnelProtocol, ev: TunnelRequested, acc: Accepted) -> None:
        rt = self.rt
        addr = (str(ev.authority.ip), ev.authority.port)
        ours = self._is_ours(acc, ev.authority.ip) and ev.authority.port not in rt.own_ports
        flow = self._flow(proto, acc, ev, ours=ours)
        if rt.draining:
            proto.respond(ev.stream_id, 503)
            flow.fail("DRAIN", "proxy is draining")
            return
        if not ours:
            proto.respond(ev.stream_id, 400)
            flow.fail("BAD_REQUEST", f"authority {ev.authority} is not this workload")
            return
        facts = ConnectionFacts(
            source=flow.src.identity,
            source_ip=parse_ip(flow.src.addr[0]),
            destination_ip=ev.authority.ip,
            destination_port=ev.authority.port,
        )
        decision = evaluate(rt.store.policies_for(rt.me) if rt.me else [], facts)
        for name in decision.dry_run_denials:
            log.info("dry-run policy %s would deny %s -> %s", name, flow.src.identity, ev.authority)
        if not decision.allowed:
            proto.respond(ev.stream_id, 401)
            flow.fail("DENY", decision.reason)
            return
        app = AppStream(
            from_app=flow.response_bytes,
            to_app=flow.request_bytes,
            on_done=flow.close,
        )
        proto.attach(ev.stream_id, app)
        app.bind(proto, ev.stream_id)
        rt.spawn(self._connect(proto, ev.stream_id, app, flow, addr))

    def _is_ours(self, acc: Accepted, ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
        me = self.rt.me
        if me is not None and me.workload_ips:
            return ip in me.workload_ips
        # No workload record yet: the address the client reached must be the one it asks for.
        return str(ip) == acc.local[0]

    async def _connect(
        self, proto: TunnelProtocol, sid: int, app: AppStream, flow: Flow, addr: tuple[str, int]
    ) -> None:
        rt = self.rt
        try:
            sock = rt.upstream_socket(addr[0], inbound=True, source=flow.src.addr[0])
            await dial(sock, addr, app, rt.config.connect_timeout)
        except (OSError, TimeoutError) as exc:
            if sid in proto.sinks:
                proto.respond(sid, 503)
            flow.fail("CONNECT", f"upstream {addr[0]}:{addr[1]}: {exc or 'timeout'}")
            return
        if sid not in proto.sinks:  # the client gave up while we connected
            flow.fail("CLIENT", "stream reset before the upstream answered")
            return
        flow.open()
        proto.respond(sid, 200)


def _loop_timeout(exc: BaseException) -> bool:
    """The event loop's own handshake timeout (asyncio's and uvloop's words for it)."""
    return isinstance(exc, ConnectionAbortedError) and "taking longer" in str(exc)


def _tls_reason(exc: BaseException) -> str:
    if isinstance(exc, TimeoutError):
        return "handshake timed out"
    if isinstance(exc, ssl.SSLError):
        return exc.reason or str(exc)
    return str(exc) or type(exc).__name__


def _client_identity(ssl_object: object, trust_domain: str) -> SpiffeId:
    """The SPIFFE identity a verified client certificate proves, on an h2 connection."""
    if tls.alpn(ssl_object) != tls.ALPN_H2:
        raise IdentityError("client did not negotiate ALPN h2")
    return peer_identity(tls.uri_sans(ssl_object), trust_domain=trust_domain)
