from __future__ import annotations

from meshctl.core.gateway.backends import route_backend, service_backend
from meshctl.core.k8s.cluster.services import ServiceFacts, ServicePort

SERVICES = {
    ("app", "api"): ServiceFacts(
        namespace="app", name="api", ports=(ServicePort(port=80, name="http"),)
    ),
    ("app", "ext"): ServiceFacts(namespace="app", name="ext", external_name=True),
}


def _problem(backend):
    return (backend.problem, backend.detail)


def test_a_service_port_resolves_by_number_or_by_name():
    assert service_backend(SERVICES, "app", "api", port=80).resolved
    by_name = service_backend(SERVICES, "app", "api", port_name="http")
    assert (by_name.resolved, by_name.port) == (True, 80)


def test_what_does_not_resolve_says_why():
    assert _problem(service_backend(SERVICES, "app", "gone", port=80)) == (
        "BackendNotFound",
        "Service app/gone not found",
    )
    assert _problem(service_backend(SERVICES, "app", "api", port=81)) == (
        "BackendNotFound",
        "Service app/api has no port 81",
    )
    assert _problem(service_backend(SERVICES, "app", "ext", port=80)) == (
        "BackendNotFound",
        "Service app/ext is ExternalName",
    )
    assert service_backend(SERVICES, "app", "api").problem == "BackendNotFound"


def test_route_backends_take_the_api_defaults_and_refuse_other_kinds():
    ok = route_backend(
        {"name": "api", "port": 80},
        route_kind="HTTPRoute",
        route_namespace="app",
        services=SERVICES,
        grants=[],
    )
    assert (ok.resolved, ok.weight, ok.namespace) == (True, 1, "app")
    kind = route_backend(
        {"group": "example.io", "kind": "Bucket", "name": "b"},
        route_kind="HTTPRoute",
        route_namespace="app",
        services=SERVICES,
        grants=[],
    )
    assert _problem(kind) == ("InvalidKind", "Bucket.example.io app/b is not a Service")
    denied = route_backend(
        {"name": "api", "namespace": "app", "port": 80, "weight": 5},
        route_kind="HTTPRoute",
        route_namespace="web",
        services=SERVICES,
        grants=[],
    )
    assert (denied.problem, denied.weight) == ("RefNotPermitted", 5)
