"""TCPRoute on a TCP listener: the port's oldest route takes every connection, weights kept,
no route or no backend said in the reason."""

from __future__ import annotations

from typing import Any

from meshctl.core.gateway.matching import Outcome, tcp

from .cluster import condition, gateway, gateway_class, listener, route, rule, run, service, status


def _tcp_route(name: str, *backends: str, created: str, **extra: Any) -> dict[str, Any]:
    obj = route(name, rule(*backends), created=created, **extra)
    obj["kind"] = "TCPRoute"
    return obj


def _run(*routes: dict[str, Any]):
    return run(
        gateway_class(),
        gateway(listener("tcp", 9000, "TCP")),
        *routes,
        service("db", "infra", 5432),
        service("db2", "infra", 5432),
    )


def test_the_oldest_tcp_route_takes_the_port_with_its_weights():
    newer = _tcp_route("newer", "db2:5432", created="2026-01-02T00:00:00Z")
    older = _tcp_route("older", "db:5432", "db2:5432", created="2026-01-01T00:00:00Z")
    older["spec"]["rules"][0]["backendRefs"][0]["weight"] = 3
    result = _run(newer, older)
    decision = tcp(result.gateways[("infra", "gw")], 9000)
    assert decision.outcome is Outcome.FORWARD
    assert decision.reason == "TCPRoute infra/older rules[0]"
    assert [(b.name, b.weight) for b in decision.backends] == [("db", 3), ("db2", 1)]
    accepted = status(result, "TCPRoute", "newer")["parents"][0]["conditions"]
    assert condition(accepted, "Accepted") == ("True", "Accepted")


def test_a_port_without_a_route_or_a_listener_is_no_route():
    table = _run().gateways[("infra", "gw")]
    assert tcp(table, 9000).reason == "no-route (no TCPRoute attached)"
    assert tcp(table, 9001).reason == "no-route (no listener on port 9001)"


def test_a_route_whose_backend_is_missing_is_no_backend():
    result = _run(_tcp_route("gone", "nowhere:5432", created="2026-01-01T00:00:00Z"))
    decision = tcp(result.gateways[("infra", "gw")], 9000)
    assert decision.outcome is Outcome.NO_BACKEND
    assert "BackendNotFound" in decision.reason
    resolved = status(result, "TCPRoute", "gone")["parents"][0]["conditions"]
    assert condition(resolved, "ResolvedRefs") == ("False", "BackendNotFound")


def test_a_tcp_route_does_not_attach_to_an_http_listener():
    result = run(
        gateway_class(),
        gateway(listener()),
        _tcp_route("db", "db:5432", created="2026-01-01T00:00:00Z"),
        service("db", "infra", 5432),
    )
    accepted = status(result, "TCPRoute", "db")["parents"][0]["conditions"]
    assert condition(accepted, "Accepted") == ("False", "NotAllowedByListeners")
