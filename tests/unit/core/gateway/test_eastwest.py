"""Istio's east-west gateway in the core: which listeners are AUTO_PASSTHROUGH (Istio's rule:
the listener option, or the network label and port 15443 / the gatewayPort label), the
endpoints of every Service port an east-west proxy is given (files and controller alike, over
the wire too), and where an ``outbound_.<port>_.<subset>_.<host>`` name goes, or why nowhere."""

from __future__ import annotations

from typing import Any

import pytest

from meshctl import gateway_wire as wire
from meshctl.core.gateway import assemble, eastwest
from meshctl.core.gateway.config import BackendKey, Endpoint, GatewayConfig
from meshctl.core.gateway.local import gateway_config
from meshctl.core.gateway.model import RouteTable

from .cluster import gateway, gateway_class, listener, route, run, service

NETWORK = {"topology.istio.io/network": "network-b"}
OPTION = {"gateway.istio.io/listener-protocol": "auto-passthrough"}


def _passthrough(port: int = 15443, **tls: Any) -> dict[str, Any]:
    return listener("cross-network", port, "TLS", tls={"mode": "Passthrough", **tls})


def _east_west(*listeners: dict[str, Any], labels: dict[str, str] | None = None) -> dict[str, Any]:
    gw = gateway(*(listeners or (_passthrough(),)))
    gw["metadata"]["labels"] = NETWORK if labels is None else labels
    return gw


def _listener_flags(table: RouteTable) -> dict[int, bool]:
    return {p.port: any(lr.listener.auto_passthrough for lr in p.listeners) for p in table.ports}


@pytest.mark.parametrize(
    ("labels", "port", "has_tls", "options", "expected"),
    [
        (NETWORK, 15443, True, {}, True),  # the multi-network convention
        ({}, 15443, True, {}, False),  # 15443 alone is an ordinary port
        (NETWORK, 443, True, {}, False),
        (NETWORK | {"networking.istio.io/gatewayPort": "35443"}, 35443, True, {}, True),
        (NETWORK | {"networking.istio.io/gatewayPort": "35443"}, 15443, True, {}, False),
        ({}, 9443, True, OPTION, True),  # the listener's own option, any port, no label
        ({}, 9443, True, {"gateway.istio.io/listener-protocol": "other"}, False),
        (NETWORK, 15443, False, {}, False),  # no tls block: never
    ],
)
def test_a_listener_is_auto_passthrough_by_istios_rule(labels, port, has_tls, options, expected):
    found = eastwest.is_auto_passthrough(labels, port, has_tls=has_tls, tls_options=options)
    assert found is expected


def test_a_network_gateways_15443_passthrough_listener_is_served_as_east_west():
    result = run(gateway_class(), _east_west(_passthrough(), _passthrough(9443) | {"name": "b"}))
    table = result.gateways["infra", "gw"]
    assert _listener_flags(table) == {9443: False, 15443: True}
    assert eastwest.has_auto_passthrough(table)


def test_the_listener_option_makes_any_port_east_west_without_the_label():
    listeners = (_passthrough(9443, options=OPTION),)
    table = run(gateway_class(), _east_west(*listeners, labels={})).gateways["infra", "gw"]
    assert _listener_flags(table) == {9443: True}


def test_15443_without_the_network_label_or_not_in_passthrough_mode_is_no_east_west_port():
    plain = run(gateway_class(), _east_west(labels={})).gateways["infra", "gw"]
    terminate = listener("t", 15443, "TLS", tls={"mode": "Terminate", "options": OPTION})
    refused = run(gateway_class(), _east_west(listener(), terminate)).gateways["infra", "gw"]
    assert not eastwest.has_auto_passthrough(plain)
    assert not eastwest.has_auto_passthrough(refused)


def _slice(service_name: str, *addresses: str, port: int = 8080) -> dict[str, Any]:
    return {
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service_name}-1",
            "namespace": "infra",
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "ports": [{"name": "", "port": port}],
        "endpoints": [{"addresses": [a]} for a in addresses],
    }


def _objects(east_west: bool) -> list[dict[str, Any]]:
    gw = _east_west(_passthrough(), labels=NETWORK if east_west else {})
    return [
        gateway_class(),
        gw,
        service("web", "infra", 8080),
        service("idle", "infra", 7000),
        _slice("web", "10.1.0.5"),
    ]


def test_an_east_west_proxy_from_files_gets_every_service_port_ready_or_not():
    items = _objects(east_west=True)
    config = gateway_config(items, gateway="infra/gw", check=lambda pair: "", now="t").config
    assert config.endpoints == {
        BackendKey("infra", "web", 8080): (Endpoint(address="10.1.0.5", port=8080),),
        BackendKey("infra", "idle", 7000): (),
    }
    ordinary = _objects(east_west=False)
    config = gateway_config(ordinary, gateway="infra/gw", check=lambda pair: "", now="t").config
    assert config.endpoints == {}


def test_an_east_west_proxy_from_the_controller_gets_every_service_port_with_mesh_members():
    table = run(gateway_class(), _east_west(), route()).gateways["infra", "gw"]
    services = [service("web", "infra", 8080), service("idle", "infra", 7000), service()]
    member = assemble.MeshMember("spiffe://cluster.local/ns/infra/sa/web", "infra/web-0")
    config = assemble.gateway_config(
        "infra/gw", table, {}, services, [_slice("web", "10.1.0.5")], {"10.1.0.5": member}.get
    )
    assert config.endpoints == {
        BackendKey("infra", "idle", 7000): (),
        BackendKey("infra", "svc", 80): (),
        BackendKey("infra", "web", 8080): (
            Endpoint(
                address="10.1.0.5",
                port=8080,
                hbone=True,
                identity="spiffe://cluster.local/ns/infra/sa/web",
                workload="infra/web-0",
            ),
        ),
    }
    assert wire.decode(wire.encode(config)) == config  # the flag and the empty entries travel


WEB = Endpoint(address="10.1.0.5", port=8080)


def _config() -> GatewayConfig:
    return GatewayConfig(
        name="infra/gw",
        endpoints={
            BackendKey("b", "web", 8080): (WEB,),
            BackendKey("b", "web", 9090): (),
        },
    )


def test_the_sni_names_the_service_port_whose_endpoints_take_the_connection():
    found = eastwest.destination(
        _config(), "outbound_.8080_._.web.b.svc.cluster.local", "cluster.local"
    )
    assert found.outcome is eastwest.Outcome.FORWARD
    assert found.service == BackendKey("b", "web", 8080)
    assert found.endpoints == (WEB,)


@pytest.mark.parametrize(
    ("sni", "outcome", "detail"),
    [
        ("web.b.svc.cluster.local", eastwest.Outcome.BAD_NAME, "separators"),
        ("", eastwest.Outcome.BAD_NAME, "no SNI"),
        ("inbound_.8080_._.web.b.svc.cluster.local", eastwest.Outcome.BAD_NAME, "direction"),
        ("outbound_.8080_._.web.example.com", eastwest.Outcome.UNKNOWN_SERVICE, "web.example"),
        ("outbound_.8080_._.db.b.svc.cluster.local", eastwest.Outcome.UNKNOWN_SERVICE, "b/db"),
        ("outbound_.8080_._.web.b.svc.other.local", eastwest.Outcome.UNKNOWN_SERVICE, "<name>"),
        ("outbound_.81_._.web.b.svc.cluster.local", eastwest.Outcome.UNKNOWN_PORT, "8080, 9090"),
        ("outbound_.8080_.v1_.web.b.svc.cluster.local", eastwest.Outcome.UNKNOWN_SUBSET, "v1"),
        ("outbound_.9090_._.web.b.svc.cluster.local", eastwest.Outcome.NO_ENDPOINT, "no ready"),
    ],
)
def test_a_name_that_routes_nowhere_says_why(sni, outcome, detail):
    found = eastwest.destination(_config(), sni, "cluster.local")
    assert found.outcome is outcome
    assert found.reason.startswith(f"{outcome} (")
    assert detail in found.reason
    assert found.endpoints == ()
