"""Policy routing that TPROXY and ambient capture need, as data (``ip rule`` + local routes).

Invariants: meshctl's rules and routes carry the routing protocol ``RTPROT_MESHCTL`` so the
adapter can find (check), reconcile and remove exactly what it added and nothing else; a plan
lists what must exist, per family, and ``lines()`` spells it as the ``ip`` commands it stands for.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.core.capture.rules import Family
from meshctl.core.capture.settings import (
    AMBIENT_CONN_MARK,
    AMBIENT_MARK_MASK,
    AMBIENT_ROUTE_TABLE,
    AMBIENT_RULE_PRIORITY,
    CaptureSettings,
)

# rtnetlink "protocol" of meshctl's rules and routes: an unassigned value in iproute2's
# rt_protos (0-4 kernel/boot/static, 8-18 and 42, 99, 186-192 are routing daemons).
RTPROT_MESHCTL = 0x4D
FULL_MASK = 0xFFFFFFFF


@dataclass(frozen=True, slots=True, order=True)
class PolicyRule:
    """``ip rule add fwmark MARK/MASK [pref N] lookup TABLE``."""

    family: Family
    fwmark: int
    mask: int
    table: int
    priority: int | None = None

    def line(self) -> str:
        ip = "ip" if self.family is Family.IPV4 else "ip -6"
        mark = (
            hex(self.fwmark) if self.mask == FULL_MASK else f"{hex(self.fwmark)}/{hex(self.mask)}"
        )
        pref = f" pref {self.priority}" if self.priority is not None else ""
        return f"{ip} rule add fwmark {mark}{pref} lookup {self.table}"


@dataclass(frozen=True, slots=True, order=True)
class LocalRoute:
    """``ip route add local default dev lo table TABLE``: deliver everything locally."""

    family: Family
    table: int

    def line(self) -> str:
        ip = "ip" if self.family is Family.IPV4 else "ip -6"
        return f"{ip} route add local default dev lo table {self.table}"


@dataclass(frozen=True, slots=True, order=True)
class LoopbackAddress:
    """An extra address on ``lo`` (``::6/128``: IPv6's inbound passthrough source)."""

    family: Family
    address: str
    prefixlen: int

    def line(self) -> str:
        ip = "ip" if self.family is Family.IPV4 else "ip -6"
        return f"{ip} addr add {self.address}/{self.prefixlen} dev lo"


@dataclass(frozen=True, slots=True)
class Routing:
    rules: tuple[PolicyRule, ...] = ()
    routes: tuple[LocalRoute, ...] = ()
    addresses: tuple[LoopbackAddress, ...] = ()

    def lines(self) -> list[str]:
        return [
            *(r.line() for r in self.rules),
            *(r.line() for r in self.routes),
            *(a.line() for a in self.addresses),
        ]

    def is_empty(self) -> bool:
        return not (self.rules or self.routes or self.addresses)


def plan(s: CaptureSettings, families: tuple[Family, ...]) -> Routing:
    """What ``s`` needs beyond iptables: TPROXY's and ambient's return route, ``::6`` on lo."""
    if s.mode == "ambient":
        return Routing(
            rules=tuple(
                PolicyRule(
                    f,
                    AMBIENT_CONN_MARK,
                    AMBIENT_MARK_MASK,
                    AMBIENT_ROUTE_TABLE,
                    AMBIENT_RULE_PRIORITY,
                )
                for f in families
            ),
            routes=tuple(LocalRoute(f, AMBIENT_ROUTE_TABLE) for f in families),
        )
    addresses = tuple(LoopbackAddress(f, "::6", 128) for f in families if f is Family.IPV6)
    if not s.tproxy:
        return Routing(addresses=addresses)
    return Routing(
        rules=tuple(
            PolicyRule(f, s.tproxy_mark, FULL_MASK, s.tproxy_route_table) for f in families
        ),
        routes=tuple(LocalRoute(f, s.tproxy_route_table) for f in families),
        addresses=addresses,
    )
