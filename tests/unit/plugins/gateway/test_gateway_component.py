"""The ingress gateway's install component belongs to its own plugin, not to the node proxy's,
and runs ``meshctl gateway run --gateway ingress`` behind a Service targeting its Ingress ports."""

from __future__ import annotations

import importlib.metadata

from meshctl import components
from meshctl.core.gateway import ingress


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


def _demo_gateway() -> dict[str, dict]:
    registry = components.load()
    values = registry.resolve(profile="demo")
    return {o["kind"]: o for o in registry.by_name["gateway"].objects(values)}


def test_the_installed_gateway_runs_the_ingress_proxy_ready_on_15021():
    (container,) = _demo_gateway()["Deployment"]["spec"]["template"]["spec"]["containers"]
    assert [*container["command"], *container["args"]] == [
        "meshctl",
        "gateway",
        "run",
        "--gateway",
        "ingress",
    ]
    env = {e["name"]: e.get("value") for e in container["env"]}
    assert (
        env["XDS_ADDRESS"] == env["CA_ADDRESS"] == "meshctl-controlplane.meshctl-system.svc:15012"
    )
    assert env["GATEWAY_NAME"] == "ingress"
    assert container["readinessProbe"]["httpGet"] == {"path": "/healthz/ready", "port": 15021}


def test_the_installed_gateways_service_targets_the_ports_the_ingress_table_listens_on():
    ports = {
        p["name"]: (p["port"], p["targetPort"]) for p in _demo_gateway()["Service"]["spec"]["ports"]
    }
    assert (ports["http2"], ports["https"]) == ((80, 8080), (443, 8443))
    assert (ports["http2"][1], ports["https"][1]) == ingress.GATEWAY_PORTS
