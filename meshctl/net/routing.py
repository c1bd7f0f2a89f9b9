"""Policy routing through pyroute2: read, reconcile and remove meshctl's ip rules and routes.

Invariants: meshctl only ever touches rules and routes tagged ``RTPROT_MESHCTL`` (and adds the
``::6`` loopback address, which it leaves in place on clean, as istio-iptables does); everything
runs on a netlink socket opened in the calling thread's namespace; no pyroute2 object leaves.
"""

from __future__ import annotations

import contextlib
import errno
import socket
from collections.abc import Iterator
from typing import Any

from meshctl.core.capture.routing import (
    FULL_MASK,
    RTPROT_MESHCTL,
    LocalRoute,
    LoopbackAddress,
    PolicyRule,
    Routing,
)
from meshctl.core.capture.rules import Family
from meshctl.errors import NetError

_AF = {Family.IPV4: socket.AF_INET, Family.IPV6: socket.AF_INET6}
_RTN_LOCAL = 2
_SCOPE_HOST = 254  # local routes must be host-scoped or the kernel answers EINVAL
_KNOWN_ADDRESSES = (LoopbackAddress(Family.IPV6, "::6", 128),)


@contextlib.contextmanager
def _ipr() -> Iterator[Any]:
    from pyroute2 import IPRoute

    with IPRoute() as ipr:
        yield ipr


def read(families: tuple[Family, ...] = (Family.IPV4, Family.IPV6)) -> Routing:
    """meshctl's rules and routes, and which of its loopback addresses exist."""
    rules: list[PolicyRule] = []
    routes: list[LocalRoute] = []
    addresses: list[LoopbackAddress] = []
    with _ipr() as ipr:
        lo = _lo(ipr)
        for family in families:
            for msg in ipr.get_rules(family=_AF[family]):
                if msg.get_attr("FRA_PROTOCOL") != RTPROT_MESHCTL:
                    continue
                mask = msg.get_attr("FRA_FWMASK")
                rules.append(
                    PolicyRule(
                        family,
                        msg.get_attr("FRA_FWMARK") or 0,
                        FULL_MASK if mask is None else mask,
                        msg.get_attr("FRA_TABLE") or msg["table"],
                        msg.get_attr("FRA_PRIORITY"),
                    )
                )
            for msg in ipr.get_routes(family=_AF[family]):
                if msg["proto"] == RTPROT_MESHCTL and msg["type"] == _RTN_LOCAL:
                    routes.append(LocalRoute(family, msg.get_attr("RTA_TABLE") or msg["table"]))
            present = {
                (a.get_attr("IFA_ADDRESS"), a["prefixlen"])
                for a in ipr.get_addr(family=_AF[family], index=lo)
            }
            addresses += [
                a
                for a in _KNOWN_ADDRESSES
                if a.family is family and (a.address, a.prefixlen) in present
            ]
    return Routing(tuple(sorted(rules, key=_key)), tuple(sorted(routes)), tuple(sorted(addresses)))


def _key(rule: PolicyRule) -> tuple[str, int, int, int, int]:
    return (rule.family.value, rule.fwmark, rule.mask, rule.table, rule.priority or 0)


def _same(want: PolicyRule, have: PolicyRule) -> bool:
    """Equal, except that a rule wanted without a priority accepts the one the kernel chose."""
    if want.priority is None:
        return (want.family, want.fwmark, want.mask, want.table) == (
            have.family, have.fwmark, have.mask, have.table,
        )  # fmt: skip
    return want == have


def changes(installed: Routing, desired: Routing) -> list[str]:
    """What reconciling would do, as ``ip`` commands (``+`` add, ``-`` delete); empty: in sync."""
    out: list[str] = []
    for rule in installed.rules:
        if not any(_same(w, rule) for w in desired.rules):
            out.append("- " + rule.line().replace(" add ", " del "))
    for rule in desired.rules:
        if not any(_same(rule, h) for h in installed.rules):
            out.append("+ " + rule.line())
    for route in installed.routes:
        if route not in desired.routes:
            out.append("- " + route.line().replace(" add ", " del "))
    for route in desired.routes:
        if route not in installed.routes:
            out.append("+ " + route.line())
    out.extend("+ " + a.line() for a in desired.addresses if a not in installed.addresses)
    return out


def reconcile(installed: Routing, desired: Routing) -> list[str]:
    """Make the namespace's routing hold ``desired``; returns what changed (see ``changes``)."""
    done = changes(installed, desired)
    if not done:
        return done
    with _ipr() as ipr:
        lo = _lo(ipr)
        for rule in installed.rules:
            if not any(_same(w, rule) for w in desired.rules):
                _call(ipr.rule, "del", rule.line(), **_rule_args(rule))
        for route in installed.routes:
            if route not in desired.routes:
                _call(ipr.route, "del", route.line(), **_route_args(route, lo))
        for address in desired.addresses:
            if address not in installed.addresses:
                _call(
                    ipr.addr, "add", address.line(), index=lo, address=address.address,
                    prefixlen=address.prefixlen, family=_AF[address.family],
                )  # fmt: skip
        for route in desired.routes:
            if route not in installed.routes:
                _call(ipr.route, "add", route.line(), **_route_args(route, lo))
        for rule in desired.rules:
            if not any(_same(rule, h) for h in installed.rules):
                _call(ipr.rule, "add", rule.line(), **_rule_args(rule))
    return done


def _rule_args(rule: PolicyRule) -> dict[str, Any]:
    args: dict[str, Any] = {
        "family": _AF[rule.family],
        "fwmark": rule.fwmark,
        "fwmask": rule.mask,
        "table": rule.table,
        "protocol": RTPROT_MESHCTL,
    }
    if rule.priority is not None:
        args["priority"] = rule.priority
    return args


def _route_args(route: LocalRoute, lo: int) -> dict[str, Any]:
    return {
        "family": _AF[route.family],
        "dst": "0.0.0.0/0" if route.family is Family.IPV4 else "::/0",
        "type": "local",
        "scope": _SCOPE_HOST,
        "table": route.table,
        "oif": lo,
        "proto": RTPROT_MESHCTL,
    }


def _lo(ipr: Any) -> int:
    found = ipr.link_lookup(ifname="lo")
    if not found:
        raise NetError("this namespace has no 'lo' interface", hint="is this a network namespace?")
    return int(found[0])


def _call(method: Any, verb: str, line: str, **kwargs: Any) -> None:
    from pyroute2.netlink.exceptions import NetlinkError

    try:
        method(verb, **kwargs)
    except NetlinkError as exc:
        if verb == "add" and exc.code == errno.EEXIST:
            return  # already there: what we wanted
        what = line if verb == "add" else line.replace(" add ", " del ")
        hint = "run as root (CAP_NET_ADMIN)"
        if kwargs.get("family") == socket.AF_INET6:
            hint = "are lo up and IPv6 enabled here (sysctl net.ipv6.conf.all.disable_ipv6=0)?"
        raise NetError(f"{what}: {exc.args[-1] if exc.args else exc}", hint=hint) from exc
