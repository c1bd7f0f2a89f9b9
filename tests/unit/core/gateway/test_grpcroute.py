"""GRPCRoute through translation and matching: method and header matches with GRPCRoute's
precedence, listener ∩ route hostnames, weights, filters, status and supportedKinds, and which
requests take GRPCRoute rows (gRPC calls only)."""

from __future__ import annotations

from typing import Any

import pytest

from meshctl.core.gateway import grpc
from meshctl.core.gateway.matching import Outcome, Request, match
from meshctl.core.gateway.model import RouteTable, RpcMatch
from meshctl.core.gateway.render import table_data

from .cluster import (
    condition,
    gateway,
    gateway_class,
    listener,
    listener_status,
    route,
    rule,
    run,
    service,
    status,
)

ECHO = "gateway_api_conformance.echo_basic.grpcecho.GrpcEcho"
GRPC_HEADERS = (("content-type", "application/grpc"), ("te", "trailers"))


def grpc_route(name: str, *rules: dict[str, Any], **extra: Any) -> dict[str, Any]:
    obj = route(name, *rules, **extra)
    obj["kind"] = "GRPCRoute"
    return obj


def grpc_rule(
    *backends: str,
    service: str = "",
    method: str = "",
    headers: dict[str, str] | None = None,
    **extra: Any,
) -> dict[str, Any]:
    out = rule(*backends, **extra)
    one: dict[str, Any] = {}
    if service or method:
        one["method"] = {k: v for k, v in (("service", service), ("method", method)) if v}
    if headers:
        one["headers"] = [{"name": n, "value": v} for n, v in headers.items()]
    if one:
        out["matches"] = [one]
    return out


def _services() -> list[dict[str, Any]]:
    return [service(n, "infra", 8080) for n in ("v1", "v2", "v3")]


def _table(*objects: dict[str, Any], listeners: list[dict[str, Any]] | None = None):
    result = run(gateway_class(), gateway(*(listeners or [listener()])), *objects, *_services())
    return result, result.gateways[("infra", "gw")]


def call(
    table: RouteTable, path: str, host: str = "gw.example", **headers: str
) -> tuple[Outcome, str]:
    decision = match(
        table,
        Request(
            port=80,
            host=host,
            path=path,
            method="POST",
            headers=(*GRPC_HEADERS, *headers.items()),
            grpc=True,
        ),
    )
    backend = decision.backends[0].name if decision.backends else ""
    return decision.outcome, backend


def test_exact_method_matches_route_each_method_and_an_unmatched_one_has_no_route():
    _, table = _table(
        grpc_route(
            "exact",
            grpc_rule("v1:8080", service=ECHO, method="Echo"),
            grpc_rule("v2:8080", service=ECHO, method="EchoTwo"),
        )
    )
    assert call(table, f"/{ECHO}/Echo") == (Outcome.FORWARD, "v1")
    assert call(table, f"/{ECHO}/EchoTwo") == (Outcome.FORWARD, "v2")
    assert call(table, f"/{ECHO}/EchoThree") == (Outcome.NO_ROUTE, "")


def test_a_service_only_or_method_only_match_takes_any_method_or_any_service():
    _, table = _table(
        grpc_route(
            "partial",
            grpc_rule("v1:8080", service="pkg.A"),
            grpc_rule("v2:8080", method="Get"),
        )
    )
    assert call(table, "/pkg.A/Anything") == (Outcome.FORWARD, "v1")
    assert call(table, "/pkg.B/Get") == (Outcome.FORWARD, "v2")
    assert call(table, "/pkg.AB/Put") == (Outcome.NO_ROUTE, "")
    assert call(table, "/pkg.B/Get/extra") == (Outcome.NO_ROUTE, "")


def test_more_header_matches_win_over_rule_order_as_grpcroute_precedence_says():
    # The conformance suite's grpcroute-header-matching rules, in its order.
    _, table = _table(
        grpc_route(
            "headers",
            grpc_rule("v1:8080", headers={"version": "one"}),
            grpc_rule("v2:8080", headers={"version": "two"}),
            grpc_rule("v1:8080", headers={"version": "two", "color": "orange"}),
        )
    )
    path = f"/{ECHO}/Echo"
    assert call(table, path, version="one") == (Outcome.FORWARD, "v1")
    assert call(table, path, version="two") == (Outcome.FORWARD, "v2")
    assert call(table, path, version="two", color="orange") == (Outcome.FORWARD, "v1")
    assert call(table, path, color="orange") == (Outcome.NO_ROUTE, "")


def test_a_longer_service_then_a_longer_method_take_precedence_across_routes():
    _, table = _table(
        grpc_route("any", grpc_rule("v3:8080"), created="2025-01-01T00:00:00Z"),
        grpc_route("method", grpc_rule("v2:8080", method="Echo")),
        grpc_route("service", grpc_rule("v1:8080", service=ECHO)),
    )
    assert call(table, f"/{ECHO}/Echo") == (Outcome.FORWARD, "v1")
    assert call(table, "/other.Svc/Echo") == (Outcome.FORWARD, "v2")
    assert call(table, "/other.Svc/Other") == (Outcome.FORWARD, "v3")


def test_grpcroute_rows_take_grpc_calls_only_and_httproutes_still_carry_grpc_elsewhere():
    _, table = _table(
        grpc_route("rpc", grpc_rule("v1:8080", service=ECHO), hostnames=["rpc.example"]),
        route("web", rule("v2:8080")),
    )
    assert call(table, f"/{ECHO}/Echo", host="rpc.example") == (Outcome.FORWARD, "v1")
    plain = match(table, Request(port=80, host="rpc.example", path=f"/{ECHO}/Echo"))
    assert plain.outcome is Outcome.NO_ROUTE  # an HTTP request never takes a GRPCRoute row
    # a host without GRPCRoute rows: the HTTPRoute carries the gRPC call
    assert call(table, f"/{ECHO}/Echo", host="web.example") == (Outcome.FORWARD, "v2")
    rows = table_data(table)["ports"][0]["listeners"][0]["hosts"][0]["routes"]
    assert rows[0]["match"] == f"grpc {ECHO}/*"


def test_listener_hostnames_intersect_grpcroute_hostnames():
    listeners = [
        listener("one", hostname="bar.com"),
        listener("two", hostname="foo.bar.com"),
        listener("wild", hostname="*.bar.com"),
    ]
    _, table = _table(
        grpc_route("v1", grpc_rule("v1:8080"), parents=[_parent("one")]),
        grpc_route("v2", grpc_rule("v2:8080"), parents=[_parent("two")]),
        grpc_route("v3", grpc_rule("v3:8080"), parents=[_parent("wild")]),
        listeners=listeners,
    )
    path = f"/{ECHO}/Echo"
    assert call(table, path, host="bar.com") == (Outcome.FORWARD, "v1")
    assert call(table, path, host="foo.bar.com") == (Outcome.FORWARD, "v2")
    assert call(table, path, host="a.b.bar.com") == (Outcome.FORWARD, "v3")
    assert call(table, path, host="foo.com") == (Outcome.NO_ROUTE, "")


def _parent(section: str) -> dict[str, Any]:
    return {"name": "gw", "namespace": "infra", "sectionName": section}


def test_weights_and_header_filters_are_kept_and_a_zero_weight_takes_nothing():
    weighted = grpc_rule(
        "v1:8080",
        "v2:8080",
        "v3:8080",
        filters=[
            {
                "type": "RequestHeaderModifier",
                "requestHeaderModifier": {"set": [{"name": "x-a", "value": "1"}]},
            }
        ],
    )
    for ref, weight in zip(weighted["backendRefs"], (70, 30, 0), strict=True):
        ref["weight"] = weight
    _, table = _table(grpc_route("w", weighted))
    decision = match(
        table,
        Request(port=80, host="h", path=f"/{ECHO}/Echo", headers=GRPC_HEADERS, grpc=True),
    )
    assert [(b.name, b.weight) for b in decision.backends] == [("v1", 70), ("v2", 30)]
    assert decision.filters.request_headers is not None
    assert decision.filters.request_headers.set == (("x-a", "1"),)


def test_grpcroute_status_counts_on_listeners_whose_supported_kinds_name_it():
    result, _ = _table(grpc_route("rpc", grpc_rule("v1:8080")))
    conditions = status(result, "GRPCRoute", "rpc")["parents"][0]["conditions"]
    assert condition(conditions, "Accepted") == ("True", "Accepted")
    assert condition(conditions, "ResolvedRefs") == ("True", "ResolvedRefs")
    assert all(c["observedGeneration"] == 1 for c in conditions)
    http = listener_status(result, "http")
    assert http["attachedRoutes"] == 1
    assert {"group": "gateway.networking.k8s.io", "kind": "GRPCRoute"} in http["supportedKinds"]


def test_a_listener_taking_only_httproutes_refuses_a_grpcroute():
    only_http = listener(allowedRoutes={"kinds": [{"kind": "HTTPRoute"}]})
    result, _ = _table(grpc_route("rpc", grpc_rule("v1:8080")), listeners=[only_http])
    conditions = status(result, "GRPCRoute", "rpc")["parents"][0]["conditions"]
    assert condition(conditions, "Accepted") == ("False", "NotAllowedByListeners")
    assert listener_status(result, "http")["attachedRoutes"] == 0


@pytest.mark.parametrize(
    ("change", "reason"),
    [
        ({"method": {"type": "RegularExpression", "service": "a.*"}}, "UnsupportedValue"),
        (
            {"headers": [{"type": "RegularExpression", "name": "a", "value": "b"}]},
            "UnsupportedValue",
        ),
    ],
)
def test_regular_expression_matches_are_refused(change: dict[str, Any], reason: str):
    refused = grpc_rule("v1:8080")
    refused["matches"] = [change]
    result, _ = _table(grpc_route("rpc", refused))
    conditions = status(result, "GRPCRoute", "rpc")["parents"][0]["conditions"]
    assert condition(conditions, "Accepted") == ("False", reason)


def test_a_missing_backend_is_resolved_refs_false_and_no_backend():
    result, table = _table(grpc_route("rpc", grpc_rule("gone:8080")))
    conditions = status(result, "GRPCRoute", "rpc")["parents"][0]["conditions"]
    assert condition(conditions, "ResolvedRefs") == ("False", "BackendNotFound")
    assert call(table, f"/{ECHO}/Echo")[0] is Outcome.NO_BACKEND


@pytest.mark.parametrize(
    ("rpc", "path", "holds"),
    [
        (RpcMatch(service="a.B", method="C"), "/a.B/C", True),
        (RpcMatch(service="a.B", method="C"), "/a.B/CD", False),
        (RpcMatch(service="a.B"), "/a.B/", False),
        (RpcMatch(method="C"), "//C", False),
        (RpcMatch(method="C"), "/x/C", True),
        (RpcMatch(), "/anything", True),
        (RpcMatch(service="a.B"), "a.B/C", False),
    ],
)
def test_method_match_on_the_path(rpc: RpcMatch, path: str, holds: bool):
    assert grpc.method_holds(rpc, path) is holds


def test_grpc_calls_are_http2_with_a_grpc_content_type():
    assert grpc.is_grpc("HTTP/2", [("content-type", "application/grpc")])
    assert grpc.is_grpc("HTTP/2", [("content-type", "application/grpc+proto")])
    assert not grpc.is_grpc("HTTP/2", [("content-type", "application/grpc-web")])
    assert not grpc.is_grpc("HTTP/1.1", [("content-type", "application/grpc")])
    assert not grpc.is_grpc("HTTP/2", [("content-type", "application/json")])


def test_the_gateways_own_answers_map_to_grpc_codes_in_a_trailers_only_head():
    assert grpc.code_for(404) is grpc.Code.UNIMPLEMENTED
    for status_code in (500, 502, 503, 504):
        assert grpc.code_for(status_code) is grpc.Code.UNAVAILABLE
    assert grpc.code_for(418) is grpc.Code.UNKNOWN
    head = grpc.trailers_only(grpc.Code.UNAVAILABLE, "no-endpoint (a 100%)\n")
    assert head == [
        ("content-type", "application/grpc"),
        ("grpc-status", "14"),
        ("grpc-message", "no-endpoint (a 100%25)%0A"),
    ]
