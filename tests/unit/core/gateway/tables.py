"""Route tables built straight from model values, for the matching tests (no translation)."""

from __future__ import annotations

from meshctl.core.gateway import table
from meshctl.core.gateway.hostnames import ANY
from meshctl.core.gateway.model import (
    Backend,
    HeaderMatch,
    Listener,
    PathMatch,
    PathType,
    Protocol,
    QueryMatch,
    Route,
    RouteKey,
    RouteMatch,
    RouteTable,
    Rule,
    SecretRef,
)


def backend(name: str, *, weight: int = 1, problem: str = "", namespace: str = "ns") -> Backend:
    return Backend(namespace=namespace, name=name, port=80, weight=weight, problem=problem)


def exact(value: str, **kw: object) -> RouteMatch:
    return RouteMatch(path=PathMatch(PathType.EXACT, value), **kw)  # type: ignore[arg-type]


def prefix(value: str, **kw: object) -> RouteMatch:
    return RouteMatch(path=PathMatch(PathType.PREFIX, value), **kw)  # type: ignore[arg-type]


def headers(**pairs: str) -> tuple[HeaderMatch, ...]:
    return tuple(HeaderMatch(k.replace("_", "-"), v) for k, v in pairs.items())


def query(**pairs: str) -> tuple[QueryMatch, ...]:
    return tuple(QueryMatch(k, v) for k, v in pairs.items())


def route(
    name: str,
    *rules: tuple[tuple[RouteMatch, ...], str],
    namespace: str = "ns",
    created: str = "2026-01-01T00:00:00Z",
    hostnames: tuple[str, ...] = (),
) -> Route:
    """A route whose rule i has the given matches and sends to the backend named."""
    return Route(
        key=RouteKey("HTTPRoute", namespace, name),
        created=created,
        hostnames=hostnames,
        rules=tuple(
            Rule(index=i, matches=matches, backends=(backend(to),))
            for i, (matches, to) in enumerate(rules)
        ),
    )


def listener(
    name: str = "http",
    *,
    port: int = 80,
    hostname: str = ANY,
    https: bool = False,
    certificates: tuple[str, ...] = (),
) -> Listener:
    return Listener(
        owner="ns/gw",
        name=name,
        port=port,
        protocol=Protocol.HTTPS if https else Protocol.HTTP,
        hostname=hostname,
        certificates=tuple(SecretRef("ns", c) for c in certificates),
    )


def single(*routes: Route, hostname: str = ANY) -> RouteTable:
    """One HTTP listener on port 80 with every route attached."""
    return table.build([(listener(hostname=hostname), routes)])
