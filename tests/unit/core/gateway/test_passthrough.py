"""TLS passthrough by SNI: the listener and host steps of HTTP matching on the ClientHello's
server name (exact and ``*.`` wildcards, listener ∩ route hostnames), the oldest route on a
host, and the outcomes for no SNI, an unknown name and a route without backends."""

from __future__ import annotations

from meshctl.core.gateway import table
from meshctl.core.gateway.hostnames import ANY, server_name_host
from meshctl.core.gateway.matching import Decision, Outcome, passthrough
from meshctl.core.gateway.model import Listener, Protocol, Route, RouteKey, RouteTable, Rule
from tests.unit.core.gateway.tables import backend


def tls_listener(name: str, hostname: str = ANY, port: int = 443) -> Listener:
    # the model has no TLS protocol of its own yet: passthrough matching does not read it
    return Listener(owner="ns/gw", name=name, port=port, protocol=Protocol.HTTPS, hostname=hostname)


def tls_route(
    name: str,
    to: str,
    hostnames: tuple[str, ...] = (),
    created: str = "2026-01-01T00:00:00Z",
    weight: int = 1,
) -> Route:
    return Route(
        key=RouteKey("TLSRoute", "ns", name),
        created=created,
        hostnames=hostnames,
        rules=(Rule(index=0, backends=(backend(to, weight=weight),) if to else ()),),
    )


def build(*served: tuple[Listener, list[Route]]) -> RouteTable:
    return table.build(served)


def forwarded_to(decision: Decision) -> str:
    assert decision.outcome is Outcome.FORWARD, decision.reason
    assert decision.status == 0
    return ",".join(b.name for b in decision.backends)


def test_an_exact_route_hostname_takes_its_sni() -> None:
    rt = build((tls_listener("tls"), [tls_route("a", "svc-a", ("a.example.com",))]))
    got = passthrough(rt, 443, "a.example.com")
    assert forwarded_to(got) == "svc-a"
    assert (got.hostname, got.reason) == ("a.example.com", "TLSRoute ns/a rules[0]")


def test_a_wildcard_listener_takes_only_the_route_hostnames_inside_it() -> None:
    rt = build(
        (tls_listener("tls", "*.example.com"), [tls_route("a", "svc-a", ("a.example.com",))])
    )
    assert forwarded_to(passthrough(rt, 443, "a.example.com")) == "svc-a"
    other = passthrough(rt, 443, "b.example.com")
    assert other.outcome is Outcome.NO_ROUTE
    assert other.reason == "no-route (sni b.example.com: no route)"
    assert other.listener is not None
    assert other.listener.name == "tls"


def test_listener_and_route_wildcards_intersect() -> None:
    rt = build(
        (tls_listener("tls", "*.example.com"), [tls_route("a", "svc-a", ("*.a.example.com",))])
    )
    assert forwarded_to(passthrough(rt, 443, "x.a.example.com")) == "svc-a"
    assert passthrough(rt, 443, "a.example.com").outcome is Outcome.NO_ROUTE
    apex = passthrough(rt, 443, "example.com")  # a wildcard never names its own suffix
    assert apex.reason == "no-route (sni example.com: no listener)"


def test_the_most_specific_listener_takes_the_sni() -> None:
    rt = build(
        (tls_listener("wide", "*.example.com"), [tls_route("wide", "svc-wide")]),
        (tls_listener("narrow", "a.example.com"), [tls_route("narrow", "svc-narrow")]),
    )
    assert forwarded_to(passthrough(rt, 443, "a.example.com")) == "svc-narrow"
    assert forwarded_to(passthrough(rt, 443, "b.example.com")) == "svc-wide"


def test_the_sni_compares_lower_case_without_a_trailing_dot() -> None:
    rt = build((tls_listener("tls"), [tls_route("a", "svc-a", ("a.example.com",))]))
    assert forwarded_to(passthrough(rt, 443, "A.Example.COM.")) == "svc-a"
    assert server_name_host("A.Example.COM.") == "a.example.com"
    assert server_name_host("") == ""


def test_no_sni_is_taken_only_where_no_hostname_is_named() -> None:
    open_table = build((tls_listener("tls"), [tls_route("default", "svc-default")]))
    assert forwarded_to(passthrough(open_table, 443, "")) == "svc-default"
    named = build((tls_listener("tls"), [tls_route("a", "svc-a", ("a.example.com",))]))
    assert passthrough(named, 443, "").reason == "no-route (sni (none): no route)"
    by_listener = build((tls_listener("tls", "a.example.com"), [tls_route("a", "svc-a")]))
    assert passthrough(by_listener, 443, "").reason == "no-route (sni (none): no listener)"


def test_the_oldest_route_on_a_host_wins() -> None:
    rt = build(
        (
            tls_listener("tls"),
            [
                tls_route("new", "svc-new", ("a.example.com",), created="2026-02-01T00:00:00Z"),
                tls_route("old", "svc-old", ("a.example.com",), created="2026-01-01T00:00:00Z"),
            ],
        )
    )
    assert forwarded_to(passthrough(rt, 443, "a.example.com")) == "svc-old"


def test_no_listener_on_the_port_is_no_route() -> None:
    rt = build((tls_listener("tls"), [tls_route("a", "svc-a")]))
    assert passthrough(rt, 8443, "a.example.com").reason == "no-route (no listener on port 8443)"


def test_a_route_without_usable_backends_is_no_backend_without_an_http_status() -> None:
    rt = build((tls_listener("tls"), [tls_route("a", "")]))
    got = passthrough(rt, 443, "a.example.com")
    assert (got.outcome, got.status) == (Outcome.NO_BACKEND, 0)
    assert got.reason == "no-backend (TLSRoute ns/a rules[0]: no backendRefs)"
    zero = build((tls_listener("tls"), [tls_route("a", "svc-a", weight=0)]))
    assert passthrough(zero, 443, "a.example.com").reason.endswith("every weight is 0)")
    missing = Route(
        key=RouteKey("TLSRoute", "ns", "m"),
        rules=(Rule(index=0, backends=(backend("gone", problem="BackendNotFound"),)),),
    )
    got = passthrough(build((tls_listener("tls"), [missing])), 443, "a.example.com")
    assert got.reason == "no-backend (TLSRoute ns/m rules[0]: BackendNotFound ns/gone:80)"
