"""The whole translation: bad objects are skipped and said, and input order does not matter."""

from __future__ import annotations

from meshctl.core.gateway import render
from meshctl.core.gateway.translate import Cluster, translate

from .cluster import NOW, cluster, gateway, gateway_class, listener, route, rule, run, service


def test_malformed_objects_are_skipped_with_a_problem_line_and_the_rest_is_served():
    broken_route = route("broken")
    broken_route["spec"]["hostnames"] = [7]
    broken_gateway = gateway(name="bad")
    broken_gateway["spec"]["listeners"] = [{"port": 80, "protocol": "HTTP"}]  # no name
    result = run(
        gateway_class(),
        gateway(),
        broken_gateway,
        route(),
        broken_route,
        service(),
        {"kind": "Service", "metadata": {"name": "x"}},  # no namespace
    )
    assert result.problems == (
        "Gateway bad skipped: spec.listeners[] without a name",
        "HTTPRoute broken skipped: spec.hostnames[] is not a string",
        "Service x skipped: Service without metadata.namespace and metadata.name",
    )
    assert ("infra", "gw") in result.gateways


def test_garbage_in_any_list_never_raises():
    junk = [None, 3, "text", [], {"metadata": 5}, {"metadata": {"name": 1}}, {"spec": []}]
    kinds = ("gateway_classes", "gateways", "http_routes", "reference_grants", "services")
    kinds += ("namespaces", "ingress_classes", "ingresses")
    lists = dict.fromkeys(kinds, junk)
    result = translate(Cluster(**lists), now=NOW)  # type: ignore[arg-type]
    assert result.gateways == {}
    assert result.problems


def test_the_output_does_not_depend_on_the_order_of_the_input():
    objects = [
        gateway_class(),
        gateway(listener(), listener("other", 8080, hostname="*.example.com")),
        route("a", rule("svc", path="/a")),
        route("b", rule("svc", path="/a"), hostnames=["x.example.com"]),
        route("c", rule("missing", path="/")),
        service(),
    ]
    first = translate(cluster(*objects), now=NOW)
    shuffled = objects[3:][::-1] + objects[:3]
    second = translate(cluster(*shuffled), now=NOW)
    assert first.statuses == second.statuses
    assert {k: render.table_data(t) for k, t in first.gateways.items()} == {
        k: render.table_data(t) for k, t in second.gateways.items()
    }
