"""The Gateway API CRDs install ships come from the build's data: every standard-channel CRD of
the pinned version, or one clear error naming the command that fetches them."""

from __future__ import annotations

import pytest
from meshctl_plugins.controlplane import gateway_api

from meshctl.errors import ConfigError


def test_the_build_data_holds_the_pinned_standard_channel():
    names = sorted(o["metadata"]["name"] for o in gateway_api.objects())  # type: ignore[index]
    assert "httproutes.gateway.networking.k8s.io" in names
    assert "referencegrants.gateway.networking.k8s.io" in names
    for obj in gateway_api.objects():
        annotations = obj["metadata"]["annotations"]  # type: ignore[index]
        assert annotations["gateway.networking.k8s.io/bundle-version"] == gateway_api.VERSION
        assert annotations["gateway.networking.k8s.io/channel"] == "standard"


def test_without_the_data_install_says_which_command_fetches_it(monkeypatch):
    monkeypatch.setattr(gateway_api, "DATA_DIR", "no-such-dir")
    gateway_api._load.cache_clear()
    try:
        with pytest.raises(ConfigError) as caught:
            gateway_api.objects()
    finally:
        gateway_api._load.cache_clear()
    assert (
        str(caught.value) == "this meshctl build has no Gateway API CRDs (install needs v1.6.3's)"
    )
    assert caught.value.hint == (
        "from a source checkout: python packaging/gateway_api.py, then reinstall or rebuild meshctl"
    )


def test_the_classes_name_our_controller():
    gateway_class, ingress_class = gateway_api.classes()
    assert gateway_class["spec"]["controllerName"] == "meshctl.io/gateway-controller"  # type: ignore[index]
    assert ingress_class["metadata"] == {"name": "meshctl"}
