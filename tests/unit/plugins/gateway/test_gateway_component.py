"""The ingress gateway's install component belongs to its own plugin, not to the node proxy's."""

from __future__ import annotations

import importlib.metadata

from meshctl import components


def _published() -> dict[str, str]:
    group = importlib.metadata.entry_points(group=components.ENTRY_POINT_GROUP)
    return {ep.name: ep.value for ep in group}


def test_the_gateway_component_is_published_by_the_gateway_plugin():
    assert _published()["gateway"] == "meshctl_plugins.gateway.component:gateway"


def test_the_ztunnel_plugin_publishes_only_the_node_proxy():
    from_ztunnel = sorted(
        name for name, value in _published().items() if value.startswith("meshctl_plugins.ztunnel.")
    )
    assert from_ztunnel == ["ztunnel"]


def test_the_registry_renders_the_gateway_from_its_plugin_in_the_demo_profile():
    registry = components.load()
    gateway = registry.by_name["gateway"]
    assert type(gateway).__module__ == "meshctl.core.k8s.install.components"
    assert gateway.render.__module__ == "meshctl_plugins.gateway.component"
    assert list(gateway.profiles) == ["demo"]
