"""The proxy's discovery settings, read as ztunnel reads its env."""

from __future__ import annotations

from pathlib import Path

import pytest
from meshctl_plugins.ztunnel.settings import ZtunnelSettings

from meshctl import config
from meshctl.errors import ConfigError
from meshctl.proxy.xds_client import address_of, build_config


def settings(tmp_path: Path, **env: str) -> ZtunnelSettings:
    root = tmp_path / "root-cert.pem"
    root.write_text("-----BEGIN CERTIFICATE-----\n")
    base = {"XDS_ADDRESS": "https://cp.mesh.svc:15012", "XDS_ROOT_CA": str(root)}
    return config.resolve(ZtunnelSettings, env={**base, **env})


def test_node_id_metadata_and_headers_are_ztunnels(tmp_path):
    env = {
        "INSTANCE_IP": "10.4.0.7",
        "POD_NAME": "web-1",
        "POD_NAMESPACE": "prod",
        "NODE_NAME": "node-a",
        "ISTIO_META_CLUSTER_ID": "c1",
        "ISTIO_METAJSON_LABELS": '{"app": "web", "n": 2}',
        "XDS_HEADER_X_TENANT": "blue",
    }
    cfg = build_config(settings(tmp_path, **env), env=env)
    assert cfg.address == "cp.mesh.svc:15012"
    assert cfg.node.id == "ztunnel~10.4.0.7~web-1.prod~prod.svc.cluster.local"
    node = cfg.node.proto()
    meta = dict(node.metadata.items())
    assert meta["NAME"] == "web-1"
    assert meta["NAMESPACE"] == "prod"
    assert meta["INSTANCE_IPS"] == "10.4.0.7"
    assert meta["NODE_NAME"] == "node-a"
    assert meta["CLUSTER_ID"] == "c1"
    assert dict(meta["LABELS"]) == {"app": "web", "n": 2.0}
    assert not node.cluster
    assert cfg.headers == (("x-tenant", "blue"),)


def test_the_instance_ip_defaults_like_ztunnels(tmp_path):
    cfg = build_config(settings(tmp_path, POD_NAME="p", POD_NAMESPACE="n"), env={})
    assert cfg.node.id == "ztunnel~1.1.1.1~p.n~n.svc.cluster.local"


@pytest.mark.parametrize(
    ("env", "problem"),
    [
        ({"XDS_ADDRESS": "http://cp:15010"}, "plaintext"),
        ({"XDS_ADDRESS": "cp"}, "HOST:PORT"),
        ({"XDS_ON_DEMAND": "true"}, "XDS_ON_DEMAND"),
        ({"XDS_ROOT_CA": "/nonexistent/root.pem"}, "missing"),
        ({"XDS_ROOT_CA": "SYSTEM"}, "SYSTEM"),
        ({"ISTIO_METAJSON_X": "{nope"}, "not JSON"),
    ],
)
def test_bad_discovery_settings_are_clear_errors(tmp_path, env, problem):
    with pytest.raises(ConfigError, match=problem):
        build_config(settings(tmp_path, **env), env=env)


def test_inline_roots_and_token_sources(tmp_path):
    pem = "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"
    token = tmp_path / "istio-token"
    token.write_text("t0k3n\n")
    cfg = build_config(settings(tmp_path, XDS_ROOT_CA=pem, AUTH_TOKEN=str(token)), env={})
    assert cfg.roots == pem.encode()
    assert cfg.auth.token_file == token
    assert cfg.auth.headers() == (("authorization", "Bearer t0k3n"), ("clusterid", "Kubernetes"))
    static = build_config(settings(tmp_path, AUTH_TOKEN="literal"), env={})
    assert static.auth.token == "literal"


def test_addresses():
    assert address_of("cp:15012") == "cp:15012"
    assert address_of("https://[fd00::1]:15012/") == "[fd00::1]:15012"
