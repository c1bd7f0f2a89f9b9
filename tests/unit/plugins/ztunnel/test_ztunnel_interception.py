"""The sidecar's inbound interception mode, read from the injector's env."""

from __future__ import annotations

import pytest
from meshctl_plugins.ztunnel.settings import ZtunnelSettings

from meshctl import config
from meshctl.errors import ConfigError


def settings(**env: str) -> ZtunnelSettings:
    return config.resolve(ZtunnelSettings, env=env)


def test_redirect_by_default_and_tproxy_when_the_injector_says_so():
    assert not settings().tproxy
    chosen = settings(ISTIO_META_INTERCEPTION_MODE="TPROXY", ISTIO_INBOUND_TPROXY_MARK="4242")
    assert chosen.tproxy
    assert chosen.tproxy_mark == 4242
    assert settings(ISTIO_META_INTERCEPTION_MODE="TPROXY").tproxy_mark == 1337


def test_a_node_proxy_ignores_the_sidecar_interception_mode():
    assert not settings(ISTIO_META_INTERCEPTION_MODE="TPROXY", PROXY_MODE="node").tproxy


@pytest.mark.parametrize("value", ["tproxy-ish", "REDIRECT,TPROXY"])
def test_an_unknown_mode_is_refused_naming_the_variable(value):
    with pytest.raises(ConfigError) as refused:
        settings(ISTIO_META_INTERCEPTION_MODE=value)
    assert "ISTIO_META_INTERCEPTION_MODE" in str(refused.value)
