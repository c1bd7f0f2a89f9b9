"""Inbound plaintext (:15006): captured non-mesh traffic to our workload.

Owns one check and one hop: the connection's original destination (``SO_ORIGINAL_DST``) must be
a real port of ours, the Service it is counted under is guessed from that port (no client proxy
says which was dialled), L4 authorization runs without a peer identity (so ``principals`` never
match and ``notPrincipals: ["*"]`` refuses plaintext), then plain TCP to the original destination.
Invariant: a connection that was not redirected (no original destination) or that targets one
of our own ports is refused, never looped back into us.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshctl.core.mesh.addresses import ip as parse_ip
from meshctl.core.mesh.authz import ConnectionFacts, evaluate
from meshctl.core.mesh.inbound_service import inbound_service
from meshctl.proxy.original_dst import original_dst
from meshctl.proxy.relay import Accepted
from meshctl.proxy.telemetry import Flow, Peer

from .outbound import splice

if TYPE_CHECKING:
    from .served import Served


class InboundPlaintext:
    """The :15006 listener."""

    def __init__(self, rt: Served) -> None:
        self.rt = rt

    def accepted(self, acc: Accepted) -> None:
        self.rt.spawn(self._route(acc))

    async def _route(self, acc: Accepted) -> None:
        rt = self.rt
        peer = acc.peer
        dst = original_dst(acc.sock)
        src = Peer((peer[0], peer[1]), rt.store.workload_by_ip(peer[0]))
        if dst is None or dst[1] in rt.own_ports:
            where = f"{dst[0]}:{dst[1]}" if dst else "no original destination"
            Flow(rt.telemetry, direction="inbound", src=src, dst=Peer(dst or ("0.0.0.0", 0))).fail(  # noqa: S104
                "SELF", f"refused plaintext connection: {where}"
            )
            acc.refuse()
            return
        # No client proxy told us which Service was dialled: ztunnel's guess by target port.
        service = inbound_service(rt.store, rt.me, dst[1])
        flow = Flow(
            rt.telemetry,
            direction="inbound",
            src=src,
            dst=Peer(dst, rt.me, rt.identity),
            service=service,
        )
        facts = ConnectionFacts(
            source=None,
            source_ip=parse_ip(peer[0]),
            destination_ip=parse_ip(dst[0]),
            destination_port=dst[1],
        )
        decision = evaluate(rt.store.policies_for(rt.me) if rt.me else [], facts)
        if not decision.allowed:
            flow.fail("DENY", decision.reason)
            acc.refuse()
            return
        await splice(rt, acc, flow, dst, inbound=True)
