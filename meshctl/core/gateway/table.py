"""The route table: routes attached to listeners, laid out per port, host and precedence.

Owns the API's ordering. Within a host, rows (one per match of a rule) sort by: Exact path
before any prefix, the longer prefix (in characters) first, a method match, more header
matches, more query matches; then across routes the oldest ``creationTimestamp``, then
``namespace/name`` alphabetically; within a route the first rule (and the first match).
GRPCRoute rows (after every other row: the API merges no GRPCRoute with an HTTPRoute) sort by
GRPCRoute's own criteria: the longer matched service, then the longer method (in characters),
more header matches; then the same route and rule tie-breaks.
Hosts of a listener sort most specific first (exact, longer wildcards, then any host), as do
the listeners of a port. Invariants: pure; the order is total, so the table does not depend on
the order routes arrive in; a route appears under a listener only for the hostnames it shares
with that listener.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from . import hostnames
from .model import (
    GRPC_KIND,
    Entry,
    Listener,
    ListenerRoutes,
    PathType,
    PortTable,
    Route,
    RouteTable,
    VirtualHost,
)

_UNDATED = "~"  # sorts after every RFC 3339 timestamp: a route without one is the newest


def effective_hostnames(
    listener_hostname: str, route_hostnames: Sequence[str], *, one_label: bool = False
) -> tuple[str, ...]:
    """The hostnames a route serves on a listener: each of its own the listener's covers (or
    the listener's, when the route's is the wider wildcard); the listener's own when the route
    names none. Empty: the route does not attach (NoMatchingListenerHostname)."""
    if not route_hostnames:
        return (listener_hostname,)
    out: list[str] = []
    for name in route_hostnames:
        common = hostnames.intersection(listener_hostname, name, one_label=one_label)
        if common is not None and common not in out:
            out.append(common)
    return tuple(out)


def precedence(entry: Entry) -> tuple[int, int, int, int, int, int, str, str, int, int]:
    """Sort key of a row within a host: the earlier key wins a request both rows match."""
    match = entry.match
    if entry.route.kind == GRPC_KIND:
        rpc = match.rpc
        specific: tuple[int, int, int, int, int, int] = (
            1,
            -len(rpc.service) if rpc is not None else 0,
            -len(rpc.method) if rpc is not None else 0,
            -len(match.headers),
            0,
            0,
        )
    else:
        specific = (
            0,
            0 if match.path.type is PathType.EXACT else 1,
            -len(match.path.value),
            0 if match.method else 1,
            -len(match.headers),
            -len(match.query),
        )
    return (
        *specific,
        entry.created or _UNDATED,
        f"{entry.route.namespace}/{entry.route.name}",
        entry.rule.index,
        entry.match_index,
    )


def listener_routes(
    listener: Listener, routes: Iterable[Route], *, one_label: bool = False
) -> ListenerRoutes:
    """A listener's hosts and their rows, from the routes attached to it."""
    hosts: dict[str, list[Entry]] = {}
    for route in routes:
        for host in effective_hostnames(listener.hostname, route.hostnames, one_label=one_label):
            rows = hosts.setdefault(host, [])
            for rule in route.rules:
                for i, match in enumerate(rule.matches):
                    rows.append(
                        Entry(
                            route=route.key,
                            created=route.created,
                            rule=rule,
                            match_index=i,
                            match=match,
                        )
                    )
    ordered = sorted(hosts, key=hostnames.precedence)
    return ListenerRoutes(
        listener=listener,
        hosts=tuple(
            VirtualHost(hostname=h, entries=tuple(sorted(hosts[h], key=precedence)))
            for h in ordered
        ),
    )


def build(
    served: Iterable[tuple[Listener, Iterable[Route]]],
    *,
    one_label: bool = False,
    misdirected_by_listener: bool = False,
    default: Entry | None = None,
) -> RouteTable:
    """The table of a proxy from its listeners (distinct per port and hostname: the caller
    leaves conflicted ones out) and the routes attached to each."""
    by_port: dict[int, list[ListenerRoutes]] = {}
    for listener, routes in served:
        by_port.setdefault(listener.port, []).append(
            listener_routes(listener, routes, one_label=one_label)
        )
    ports = []
    for port in sorted(by_port):
        listeners = sorted(
            by_port[port],
            key=lambda lr: (hostnames.precedence(lr.listener.hostname), lr.listener.label),
        )
        ports.append(
            PortTable(
                port=port,
                protocol=listeners[0].listener.protocol,
                listeners=tuple(listeners),
                default=default,
            )
        )
    return RouteTable(
        ports=tuple(ports),
        one_label_wildcards=one_label,
        misdirected_by_listener=misdirected_by_listener,
    )
