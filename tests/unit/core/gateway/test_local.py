"""Kubernetes objects -> one gateway's config, without a control plane (core/gateway/local)."""

from __future__ import annotations

from typing import Any

import pytest

from meshctl.core.gateway.config import BackendKey, Endpoint, KeyPair
from meshctl.core.gateway.local import (
    ConfigProblemError,
    gateway_config,
    ready_endpoints,
    secret_key_pair,
)
from meshctl.core.gateway.model import SecretRef
from meshctl.core.k8s.cluster.services import read_service
from tests.harness import gateway as gw

NOW = "2026-12-02T10:00:00Z"


def _ok(pair: KeyPair) -> str:
    return ""


def _objects(*extra: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        gw.gateway_class(),
        gw.gateway(gw.http_listener(), gw.https_listener("tls", "a.example", "cert-a")),
        gw.route("web", [gw.rule("/", "web:80")]),
        gw.service("web"),
        *extra,
    ]


def test_only_ready_endpoints_of_the_service_port_are_taken():
    slice_ = gw.endpoint_slice("web", [("10.0.0.1", True), ("10.0.0.2", False)], 8080)
    slice_["endpoints"].append({"addresses": ["10.0.0.3"]})  # no condition: ready
    slice_["endpoints"][0]["targetRef"] = {"kind": "Pod", "name": "web-0"}
    other = gw.endpoint_slice("other", [("10.0.0.9", True)], 8080)
    found = ready_endpoints(read_service(gw.service("web")), 80, [slice_, other])
    assert found == (
        Endpoint(address="10.0.0.1", port=8080, workload="app/web-0"),
        Endpoint(address="10.0.0.3", port=8080),
    )


def test_a_numeric_target_port_serves_when_the_slice_names_no_port():
    slice_ = gw.endpoint_slice("web", [("10.0.0.1", True)], 9999)
    slice_["ports"] = []
    found = ready_endpoints(read_service(gw.service("web")), 80, [slice_])
    assert found == (Endpoint(address="10.0.0.1", port=8080),)


def test_a_service_port_not_declared_has_no_endpoints():
    slice_ = gw.endpoint_slice("web", [("10.0.0.1", True)], 8080)
    assert ready_endpoints(read_service(gw.service("web")), 81, [slice_]) == ()


def test_secret_key_pair_reads_data_and_string_data():
    secret = gw.tls_secret("cert-a", b"CHAIN", b"KEY")
    assert secret_key_pair(secret) == KeyPair(chain_pem=b"CHAIN", key_pem=b"KEY")
    secret = {**secret, "data": {}, "stringData": {"tls.crt": "C", "tls.key": "K"}}
    assert secret_key_pair(secret) == KeyPair(chain_pem=b"C", key_pem=b"K")


def test_the_config_carries_the_table_endpoints_and_usable_certificates():
    local = gateway_config(
        _objects(
            gw.endpoint_slice("web", [("10.0.0.1", True)], 8080),
            gw.tls_secret("cert-a", b"CHAIN", b"KEY"),
        ),
        gateway="",
        check=_ok,
        now=NOW,
    )
    config = local.config
    assert config.name == "infra/gw"
    assert [p.port for p in config.table.ports] == [80, 443]
    assert config.endpoints == {
        BackendKey("app", "web", 80): (Endpoint(address="10.0.0.1", port=8080),)
    }
    assert config.certificates == {
        SecretRef("infra", "cert-a"): KeyPair(chain_pem=b"CHAIN", key_pem=b"KEY")
    }


def test_a_certificate_the_check_refuses_is_left_out_with_a_problem():
    local = gateway_config(
        _objects(gw.tls_secret("cert-a", b"CHAIN", b"KEY")),
        gateway="infra/gw",
        check=lambda pair: "does not load",
        now=NOW,
    )
    assert local.config.certificates == {}
    assert "Secret infra/cert-a: does not load" in local.problems
    # the listener without a usable certificate does not serve (translate's rule)
    assert [p.port for p in local.config.table.ports] == [80]


def test_a_malformed_secret_is_a_problem_not_an_exception():
    bad = gw.tls_secret("cert-a", b"C", b"K")
    bad["data"]["tls.key"] = "%%%"
    local = gateway_config(_objects(bad), gateway="", check=_ok, now=NOW)
    assert any("not base64" in p for p in local.problems)


def test_an_unknown_gateway_or_an_ambiguous_choice_is_refused():
    with pytest.raises(ConfigProblemError, match="no accepted Gateway infra/nope"):
        gateway_config(_objects(), gateway="infra/nope", check=_ok, now=NOW)
    two = [*_objects(), gw.gateway(gw.http_listener(), name="second")]
    with pytest.raises(ConfigProblemError, match="several Gateways"):
        gateway_config(two, gateway="", check=_ok, now=NOW)


def test_ingress_objects_make_the_ingress_proxys_config():
    ingress = {
        "apiVersion": "networking.k8s.io/v1",
        "kind": "Ingress",
        "metadata": {"name": "site", "namespace": "app"},
        "spec": {
            "ingressClassName": "meshctl",
            "rules": [
                {
                    "host": "site.example",
                    "http": {
                        "paths": [
                            {
                                "path": "/",
                                "pathType": "Prefix",
                                "backend": {"service": {"name": "web", "port": {"number": 80}}},
                            }
                        ]
                    },
                }
            ],
        },
    }
    local = gateway_config(
        [gw.service("web"), gw.endpoint_slice("web", [("10.0.0.1", True)], 8080), ingress],
        gateway="",
        check=_ok,
        now=NOW,
    )
    assert local.config.name == "ingress"
    assert BackendKey("app", "web", 80) in local.config.endpoints


def test_kinds_a_gateway_does_not_read_are_listed():
    local = gateway_config(
        [*_objects(), {"kind": "ConfigMap", "metadata": {"name": "x"}}],
        gateway="",
        check=_ok,
        now=NOW,
    )
    assert local.ignored == ("ConfigMap",)


def _pod(name: str, *, labels: dict[str, str] | None = None, annotations=None, sa: str = "web"):
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": "app",
            "labels": labels or {},
            "annotations": annotations or {},
        },
        "spec": {"serviceAccountName": sa},
    }


def test_an_ambient_or_injected_pods_endpoint_goes_through_hbone_with_its_identity():
    slice_ = gw.endpoint_slice(
        "web", [("10.0.0.1", True), ("10.0.0.2", True), ("10.0.0.3", True)], 8080
    )
    for endpoint, pod in zip(slice_["endpoints"], ("amb", "side", "plain"), strict=True):
        endpoint["targetRef"] = {"kind": "Pod", "name": pod, "namespace": "app"}
    pods = [
        _pod("amb", labels={"istio.io/dataplane-mode": "ambient"}),
        _pod("side", annotations={"sidecar.istio.io/status": "{}"}, sa="side-sa"),
        _pod("plain"),
    ]
    local = gateway_config(
        [*_objects(), slice_, *pods], gateway="", check=_ok, now=NOW, trust_domain="td.example"
    )
    found = {e.address: e for e in local.config.endpoints[BackendKey("app", "web", 80)]}
    assert found["10.0.0.1"].hbone
    assert found["10.0.0.1"].identity == "spiffe://td.example/ns/app/sa/web"
    assert found["10.0.0.2"].identity == "spiffe://td.example/ns/app/sa/side-sa"
    assert not found["10.0.0.3"].hbone
    assert found["10.0.0.3"].workload == "app/plain"


def test_an_ambient_namespace_meshes_its_pods_unless_one_opts_out():
    slice_ = gw.endpoint_slice("web", [("10.0.0.1", True), ("10.0.0.2", True)], 8080)
    for endpoint, pod in zip(slice_["endpoints"], ("in", "out"), strict=True):
        endpoint["targetRef"] = {"kind": "Pod", "name": pod}
    namespace = {
        "apiVersion": "v1",
        "kind": "Namespace",
        "metadata": {"name": "app", "labels": {"istio.io/dataplane-mode": "ambient"}},
    }
    pods = [_pod("in"), _pod("out", labels={"istio.io/dataplane-mode": "none"})]
    local = gateway_config([*_objects(), slice_, namespace, *pods], gateway="", check=_ok, now=NOW)
    found = {e.address: e.hbone for e in local.config.endpoints[BackendKey("app", "web", 80)]}
    assert found == {"10.0.0.1": True, "10.0.0.2": False}
