"""The control plane's pure-ish logic: the caBundle patch, settings."""

from __future__ import annotations

import base64
from datetime import timedelta

import pytest
from meshctl_plugins.controlplane.cabundle import bundle_patch
from meshctl_plugins.controlplane.settings import ControlPlaneSettings, address, duration

from meshctl.errors import ConfigError


def _configuration(*bundles: str | None) -> dict:
    hooks = []
    for bundle in bundles:
        client: dict = {"url": "https://x/inject"}
        if bundle is not None:
            client["caBundle"] = bundle
        hooks.append({"name": f"w{len(hooks)}", "clientConfig": client})
    return {"metadata": {"resourceVersion": "42"}, "webhooks": hooks}


def test_bundle_patch_sets_only_the_wrong_bundles_and_tests_the_version() -> None:
    pem = "-----BEGIN CERTIFICATE-----\nx\n-----END CERTIFICATE-----\n"
    good = base64.b64encode(pem.encode()).decode()
    ops = bundle_patch(_configuration(good, "b2xk", None), pem)
    assert ops == [
        {"op": "test", "path": "/metadata/resourceVersion", "value": "42"},
        {"op": "replace", "path": "/webhooks/1/clientConfig/caBundle", "value": good},
        {"op": "add", "path": "/webhooks/2/clientConfig/caBundle", "value": good},
    ]
    assert bundle_patch(_configuration(good, good), pem) == []


def test_durations_and_addresses_parse_or_say_what_to_write() -> None:
    assert duration("90d", "x") == timedelta(days=90)
    assert duration("1.5s", "x") == timedelta(seconds=1.5)
    assert duration("300ms", "x") == timedelta(milliseconds=300)
    with pytest.raises(ConfigError, match="not a duration"):
        duration("-1h", "x")
    assert address(":15012", "x") == ("0.0.0.0", 15012)  # noqa: S104 -- the parsed default
    assert address("[::1]:8080", "x") == ("::1", 8080)
    with pytest.raises(ConfigError, match="not HOST:PORT"):
        address("15012", "x")
    with pytest.raises(ConfigError, match="not an IP address"):
        address("istiod:15012", "x")


def test_serving_names_follow_service_namespace_and_revision() -> None:
    settings = ControlPlaneSettings(
        namespace="mesh", revision="canary", serving_names=("127.0.0.1", "cp.example.org")
    )
    dns, ips = settings.serving_dns_and_ips()
    assert dns == [
        "meshctl-controlplane-canary.mesh.svc",
        "meshctl-controlplane.mesh.svc",
        "meshctl-controlplane-canary.mesh.svc.cluster.local",
        "cp.example.org",
    ]
    assert ips == ["127.0.0.1"]
    assert ControlPlaneSettings().node_accounts == {"meshctl-system/meshctl-ztunnel"}
