"""What a gateway proxy is given besides its table: usable certificates only, ready endpoints
only (mesh members through HBONE with their identity), and its runtime from its objects."""

from __future__ import annotations

import base64

from meshctl.core.gateway import assemble
from meshctl.core.gateway.config import BackendKey, Endpoint, KeyPair
from meshctl.core.gateway.gateways import Address, CertificateFacts, GatewayRuntime
from meshctl.core.gateway.model import SecretRef
from tests.harness.kube import CertificateAuthority

from .cluster import gateway, gateway_class, https, listener, route, run, service


def tls_secret(cert: bytes, key: bytes, kind: str = "kubernetes.io/tls") -> dict[str, object]:
    return {
        "type": kind,
        "data": {
            "tls.crt": base64.b64encode(cert).decode(),
            "tls.key": base64.b64encode(key).decode(),
        },
    }


CA = CertificateAuthority("gateway-test")
PAIR = CA.issue("example.com", dns_sans=["example.com"], server=True)
OTHER = CA.issue("other.example.com", dns_sans=["other.example.com"], server=True)


def test_a_tls_secret_gives_its_chain_and_key():
    pair = assemble.read_tls_secret(tls_secret(PAIR.cert_pem, PAIR.key_pem))
    assert pair == KeyPair(chain_pem=PAIR.cert_pem, key_pem=PAIR.key_pem)


def test_unusable_secrets_say_why():
    cases = {
        "Secret is of type Opaque, not kubernetes.io/tls": tls_secret(
            PAIR.cert_pem, PAIR.key_pem, "Opaque"
        ),
        "tls.crt holds no PEM certificate": tls_secret(b"junk", PAIR.key_pem),
        "tls.key holds no usable unencrypted PEM private key": tls_secret(PAIR.cert_pem, b"junk"),
        "tls.key does not match the first certificate of tls.crt": tls_secret(
            PAIR.cert_pem, OTHER.key_pem
        ),
        "Secret has no tls.key": {"type": "kubernetes.io/tls", "data": {"tls.crt": "eA=="}},
        "Secret's tls.crt is not base64": {
            "type": "kubernetes.io/tls",
            "data": {"tls.crt": "!!", "tls.key": "eA=="},
        },
    }
    for why, secret in cases.items():
        assert assemble.read_tls_secret(secret) == why
    facts = assemble.certificate_facts(
        {("a", "b"): "bad", ("a", "c"): KeyPair(chain_pem=b"", key_pem=b"")}
    )
    assert facts == {
        ("a", "b"): CertificateFacts(valid=False, message="bad"),
        ("a", "c"): CertificateFacts(),
    }


def endpoint_slice(
    service_name: str,
    *endpoints: dict[str, object],
    port_name: str = "",
    port: int = 8080,
    name: str = "s1",
):
    return {
        "metadata": {
            "name": name,
            "namespace": "infra",
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "ports": [{"name": port_name, "port": port}],
        "endpoints": list(endpoints),
    }


def test_ready_endpoints_of_the_routed_service_port_with_mesh_members_through_hbone():
    result = run(gateway_class(), gateway(), route(), service())
    table = result.gateways["infra", "gw"]
    slices = [
        endpoint_slice(
            "svc",
            {"addresses": ["10.0.0.2"], "conditions": {"ready": True}},
            {"addresses": ["10.0.0.1"]},  # no conditions: ready, as the API says
            {"addresses": ["10.0.0.3"], "conditions": {"ready": False}},
        ),
        endpoint_slice("svc", {"addresses": ["10.0.0.9"]}, port_name="other", name="s2"),
        endpoint_slice("unrouted", {"addresses": ["10.0.0.7"]}, name="s3"),
    ]
    members = {
        "10.0.0.2": assemble.MeshMember("spiffe://cluster.local/ns/infra/sa/web", "infra/web-1")
    }
    config = assemble.gateway_config("infra/gw", table, {}, [service()], slices, members.get)
    assert config.endpoints == {
        BackendKey("infra", "svc", 80): (
            Endpoint(address="10.0.0.1", port=8080),
            Endpoint(
                address="10.0.0.2",
                port=8080,
                hbone=True,
                identity="spiffe://cluster.local/ns/infra/sa/web",
                workload="infra/web-1",
            ),
        )
    }


def test_the_certificates_of_the_served_listeners_only_and_only_usable_ones():
    result = run(gateway_class(), gateway(listener(), https()), route(), service())
    table = result.gateways["infra", "gw"]
    good = KeyPair(chain_pem=PAIR.cert_pem, key_pem=PAIR.key_pem)
    pairs = {("infra", "cert"): good, ("infra", "unused"): good}
    config = assemble.gateway_config("infra/gw", table, pairs, [service()], [], lambda ip: None)
    assert config.certificates == {SecretRef("infra", "cert"): good}
    broken = assemble.gateway_config(
        "infra/gw", table, {("infra", "cert"): "bad"}, [], [], lambda ip: None
    )
    assert broken.certificates == {}


def test_runtime_is_ready_with_a_ready_replica_and_answers_on_the_lb_address_else_the_cluster_ip():
    deployment = {"status": {"readyReplicas": 1}}
    pending = {"spec": {"clusterIP": "10.96.0.5", "clusterIPs": ["10.96.0.5"]}, "status": {}}
    assert assemble.runtime(deployment, pending) == GatewayRuntime(
        ready=True, addresses=(Address(value="10.96.0.5"),)
    )
    lb = pending | {
        "status": {"loadBalancer": {"ingress": [{"ip": "203.0.113.7"}, {"hostname": "lb.example"}]}}
    }
    assert assemble.runtime({"status": {}}, lb) == GatewayRuntime(
        ready=False,
        addresses=(Address(value="203.0.113.7"), Address(value="lb.example", type="Hostname")),
    )
    assert assemble.runtime(None, None) == GatewayRuntime()
