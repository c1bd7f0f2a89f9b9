"""``meshctl gateway run`` without -f: the control plane's config through the xDS source seam
(``xds_source.follow(config, gateway, deliver, stop)``), its settings checked before binding."""

from __future__ import annotations

import asyncio
import sys
import types
from pathlib import Path
from typing import Any

import pytest
from meshctl_plugins.gateway import process
from meshctl_plugins.gateway.settings import GatewaySettings
from meshctl_plugins.gateway.sources import ConfigHolder

from meshctl.core.gateway.config import GatewayConfig
from meshctl.errors import UserError


def _settings(tmp_path: Path, **kw: Any) -> GatewaySettings:
    roots = tmp_path / "root-cert.pem"
    roots.write_text("-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n")
    base: dict[str, Any] = {
        "gateway": "infra/gw",
        "xds_address": "127.0.0.1:15012",
        "xds_root_ca": str(roots),
        "auth_token": "tok",
        "pod_name": "gw-0",
        "pod_namespace": "infra",
        "instance_ip": "10.0.0.5",
    }
    return GatewaySettings(**{**base, **kw})


def test_the_xds_source_gets_the_proxys_discovery_config_and_delivers_to_the_holder(
    tmp_path, monkeypatch
):
    calls: list[tuple[Any, str]] = []

    async def follow(config: Any, gateway: str, deliver: Any, stop: asyncio.Event) -> None:
        calls.append((config, gateway))
        deliver(GatewayConfig(name=gateway, version="v1"))

    fake = types.ModuleType("fake_xds_source")
    fake.follow = follow  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "fake_xds_source", fake)
    monkeypatch.setattr(process, "XDS_SOURCE", "fake_xds_source")
    source = process.discovery(_settings(tmp_path))
    holder = ConfigHolder()
    asyncio.run(source(holder))
    assert holder.current == GatewayConfig(name="infra/gw", version="v1")
    config, gateway = calls[0]
    assert gateway == "infra/gw"
    assert config.address == "127.0.0.1:15012"
    assert (config.node.pod_name, config.node.pod_namespace) == ("gw-0", "infra")
    assert config.node.instance_ip == "10.0.0.5"


def test_discovery_without_the_gateways_name_is_a_usage_error(tmp_path):
    with pytest.raises(UserError, match="needs the gateway's name"):
        process.discovery(_settings(tmp_path, gateway=""))


def test_a_build_without_the_xds_source_says_to_use_files(tmp_path, monkeypatch):
    monkeypatch.setattr(process, "XDS_SOURCE", "meshctl_plugins.gateway.no_such_module")
    with pytest.raises(UserError, match="no xDS source") as caught:
        process.discovery(_settings(tmp_path))
    assert "-f FILE" in (caught.value.hint or "")
