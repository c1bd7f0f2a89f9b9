"""Ingress on the gateway's engine: the Kubernetes docs' path examples, hosts, classes, TLS,
the default backend and status."""

from __future__ import annotations

from typing import Any

import pytest

from meshctl.core.gateway.gateways import CertificateFacts
from meshctl.core.gateway.matching import Outcome, Request, match

from .cluster import CREATED, run, service, status

NETWORKING = "networking.k8s.io/v1"


def ingress(
    name: str = "web",
    *rules: dict[str, Any],
    namespace: str = "web",
    class_name: str | None = "meshctl",
    created: str = CREATED,
    **spec: Any,
) -> dict[str, Any]:
    body: dict[str, Any] = {"rules": list(rules)} | spec
    if class_name is not None:
        body["ingressClassName"] = class_name
    return {
        "apiVersion": NETWORKING,
        "kind": "Ingress",
        "metadata": {"name": name, "namespace": namespace, "creationTimestamp": created},
        "spec": body,
    }


def http(*paths: tuple[str, str, str], host: str = "") -> dict[str, Any]:
    """A rule: (pathType, path, service) per path, service port 80."""
    rule: dict[str, Any] = {
        "http": {
            "paths": [
                {
                    "pathType": kind,
                    "path": path,
                    "backend": {"service": {"name": svc, "port": {"number": 80}}},
                }
                for kind, path, svc in paths
            ]
        }
    }
    if host:
        rule["host"] = host
    return rule


DEFAULT = {"service": {"name": "default", "port": {"number": 80}}}


def _services(*names: str):
    return [service(n, "web") for n in (*names, "default")]


def _to(result, path="/", host="example.com", port=80, **kw):
    decision = match(result.ingress, Request(port=port, host=host, path=path, **kw))
    if decision.outcome is not Outcome.FORWARD:
        return decision.outcome
    return decision.backends[0].name


# The Kubernetes Ingress docs' "Examples" table: (paths, request path, expected service);
# "default" is the defaultBackend (no rule matched).
DOCS_EXAMPLES = [
    ([("Prefix", "/")], "/any/path", "p0"),
    ([("Exact", "/foo")], "/foo", "p0"),
    ([("Exact", "/foo")], "/bar", "default"),
    ([("Exact", "/foo")], "/foo/", "default"),
    ([("Exact", "/foo/")], "/foo", "default"),
    ([("Prefix", "/foo")], "/foo", "p0"),
    ([("Prefix", "/foo")], "/foo/", "p0"),
    ([("Prefix", "/foo/")], "/foo", "p0"),
    ([("Prefix", "/foo/")], "/foo/", "p0"),
    ([("Prefix", "/aaa/bb")], "/aaa/bbb", "default"),
    ([("Prefix", "/aaa/bbb")], "/aaa/bbb", "p0"),
    ([("Prefix", "/aaa/bbb/")], "/aaa/bbb", "p0"),  # ignores the rule's trailing slash
    ([("Prefix", "/aaa/bbb")], "/aaa/bbb/", "p0"),  # matches the request's trailing slash
    ([("Prefix", "/aaa/bbb")], "/aaa/bbb/ccc", "p0"),  # matches a subpath
    ([("Prefix", "/aaa/bbb")], "/aaa/bbbxyz", "default"),  # not a string prefix
    ([("Prefix", "/"), ("Prefix", "/aaa")], "/aaa/ccc", "p1"),
    ([("Prefix", "/"), ("Prefix", "/aaa"), ("Prefix", "/aaa/bbb")], "/aaa/bbb", "p2"),
    ([("Prefix", "/"), ("Prefix", "/aaa"), ("Prefix", "/aaa/bbb")], "/ccc", "p0"),
    ([("Prefix", "/aaa")], "/ccc", "default"),
    ([("Prefix", "/foo"), ("Exact", "/foo")], "/foo", "p1"),  # Exact preferred
]


@pytest.mark.parametrize(("paths", "request_path", "expected"), DOCS_EXAMPLES)
def test_the_kubernetes_docs_path_examples(paths, request_path, expected):
    names = [f"p{i}" for i in range(len(paths))]
    rule = http(*[(kind, path, names[i]) for i, (kind, path) in enumerate(paths)])
    result = run(ingress("web", rule, defaultBackend=DEFAULT), *_services(*names))
    assert _to(result, request_path) == expected


def test_implementation_specific_is_the_element_wise_prefix():
    rule = http(("ImplementationSpecific", "/foo", "p0"))
    result = run(ingress("web", rule), *_services("p0"))
    assert _to(result, "/foo/bar") == "p0"
    assert _to(result, "/foobar") is Outcome.NO_ROUTE


def test_the_longest_path_wins_across_ingresses_of_a_host_then_the_oldest():
    old = ingress("old", http(("Prefix", "/a", "old")), created="2025-01-01T00:00:00Z")
    new = ingress("new", http(("Prefix", "/a/b", "new"), ("Prefix", "/a", "newer")))
    result = run(new, old, *_services("old", "new", "newer"))
    assert _to(result, "/a/b/c") == "new"
    assert _to(result, "/a/x") == "old"


@pytest.mark.parametrize(
    ("host", "expected"),
    [
        ("foo.bar.com", "exact"),
        ("FOO.bar.com:8080", "exact"),
        ("baz.bar.com", "wild"),
        ("a.baz.bar.com", "any"),  # the wildcard stands for one label only
        ("bar.com", "any"),
        ("other.org", "any"),
    ],
)
def test_host_rules_exact_then_one_label_wildcard_then_no_host(host, expected):
    result = run(
        ingress(
            "web",
            http(("Prefix", "/", "exact"), host="foo.bar.com"),
            http(("Prefix", "/", "wild"), host="*.bar.com"),
            http(("Prefix", "/", "any")),
        ),
        *_services("exact", "wild", "any"),
    )
    assert _to(result, host=host) == expected


def test_a_host_rule_does_not_fall_through_to_host_less_rules():
    result = run(
        ingress(
            "web",
            http(("Exact", "/only", "exact"), host="foo.bar.com"),
            http(("Prefix", "/", "any")),
        ),
        *_services("exact", "any"),
    )
    assert _to(result, "/other", host="foo.bar.com") is Outcome.NO_ROUTE


def test_classes_ours_by_name_annotation_or_default():
    rule = http(("Prefix", "/", "svc"))
    theirs = ingress("theirs", rule, class_name="nginx")
    legacy = ingress("legacy", rule, class_name=None)
    legacy["metadata"]["annotations"] = {"kubernetes.io/ingress.class": "meshctl"}
    classless = ingress("classless", rule, class_name=None)
    result = run(ingress("named", rule), theirs, legacy, classless, *_services("svc"))
    assert {u.name for u in result.statuses if u.kind == "Ingress"} == {"named", "legacy"}
    default_class = {
        "kind": "IngressClass",
        "metadata": {
            "name": "meshctl",
            "annotations": {"ingressclass.kubernetes.io/is-default-class": "true"},
        },
        "spec": {"controller": "meshctl.io/ingress-controller"},
    }
    result = run(theirs, classless, default_class, *_services("svc"))
    assert {u.name for u in result.statuses if u.kind == "Ingress"} == {"classless"}


def test_status_carries_the_gateway_addresses():
    result = run(ingress("web", http(("Prefix", "/", "svc"))), *_services("svc"))
    assert status(result, "Ingress", "web", "web") == {
        "loadBalancer": {"ingress": [{"ip": "10.96.0.10"}]}
    }


def test_the_oldest_default_backend_takes_what_nothing_matches_on_every_port():
    other = {"service": {"name": "other", "port": {"number": 80}}}
    tls = [{"hosts": ["a.example.com"], "secretName": "a"}]
    result = run(
        ingress("new", defaultBackend=other, tls=tls),
        ingress("old", defaultBackend=DEFAULT, created="2025-01-01T00:00:00Z"),
        *_services("other"),
        certificates={("web", "a"): CertificateFacts()},
    )
    assert _to(result, "/x") == "default"
    assert _to(result, "/x", host="a.example.com", port=443, sni="a.example.com") == "default"


def test_tls_hosts_become_listeners_on_443_with_their_secret():
    tls = [
        {"hosts": ["a.example.com"], "secretName": "a"},
        {"hosts": ["b.example.com"], "secretName": "missing"},
    ]
    result = run(
        ingress("web", http(("Prefix", "/", "svc")), tls=tls),
        *_services("svc"),
        certificates={("web", "a"): CertificateFacts()},
    )
    https_port = result.ingress.port(443)
    assert https_port is not None
    assert [
        (lr.listener.hostname, [str(c) for c in lr.listener.certificates])
        for lr in https_port.listeners
    ] == [("a.example.com", ["web/a"])]
    assert any("tls[1]: Secret web/missing not found" in p for p in result.problems)
    assert _to(result, host="a.example.com", port=443, sni="a.example.com") == "svc"
    assert _to(result, host="b.example.com", port=443) is Outcome.NO_ROUTE


def test_the_first_ingress_to_claim_a_tls_host_keeps_it():
    tls_old = [{"hosts": ["a.example.com"], "secretName": "old"}]
    tls_new = [{"hosts": ["a.example.com"], "secretName": "new"}]
    result = run(
        ingress("new", tls=tls_new),
        ingress("old", tls=tls_old, created="2025-01-01T00:00:00Z"),
        certificates={("web", "old"): CertificateFacts(), ("web", "new"): CertificateFacts()},
    )
    https_port = result.ingress.port(443)
    assert https_port is not None
    assert [str(c) for c in https_port.listeners[0].listener.certificates] == ["web/old"]
    assert any("already has TLS from Ingress web/old" in p for p in result.problems)


def test_a_named_service_port_resolves_and_a_missing_one_answers_500():
    by_name = {
        "pathType": "Prefix",
        "path": "/",
        "backend": {"service": {"name": "svc", "port": {"name": "web"}}},
    }
    wrong = {
        "pathType": "Prefix",
        "path": "/x",
        "backend": {"service": {"name": "svc", "port": {"name": "nope"}}},
    }
    result = run(
        ingress("web", {"http": {"paths": [by_name, wrong]}}), service("svc", "web", web=8080)
    )
    decision = match(result.ingress, Request(port=80, host="h", path="/"))
    assert decision.backends[0].label == "web/svc:8080"
    decision = match(result.ingress, Request(port=80, host="h", path="/x"))
    assert decision.status == 500
    assert decision.reason == (
        "no-backend (Ingress web/web rules[0].paths[1]: BackendNotFound web/svc:0: "
        "Service web/svc has no port nope)"
    )


def test_without_ingresses_there_is_nothing_to_serve():
    result = run()
    assert result.ingress.ports == ()
    assert match(result.ingress, Request(port=80, host="h")).status == 404
