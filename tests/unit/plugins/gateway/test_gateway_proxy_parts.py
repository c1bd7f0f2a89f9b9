"""The gateway proxy's parts that need no sockets: hop-by-hop headers, request targets, the
--gateway value, the SNI choice among listeners' certificates, and Istio's metric labels."""

from __future__ import annotations

import ssl
from typing import Any

import pytest
from meshctl_plugins.gateway.certificates import SniContexts, sni_of
from meshctl_plugins.gateway.exchange import end_to_end
from meshctl_plugins.gateway.forward import _split
from meshctl_plugins.gateway.metrics import RequestMetrics, Sample, Source
from meshctl_plugins.gateway.settings import _gateway

from meshctl.core.gateway.config import GatewayConfig, KeyPair
from meshctl.core.gateway.model import (
    Listener,
    ListenerRoutes,
    PortTable,
    Protocol,
    RouteTable,
    SecretRef,
)
from tests.harness.gateway import server_cert


def test_hop_by_hop_headers_and_those_connection_names_are_dropped():
    headers = [
        ("connection", "keep-alive, x-private"),
        ("keep-alive", "timeout=5"),
        ("transfer-encoding", "chunked"),
        ("x-private", "1"),
        ("te", "trailers"),
        ("x-kept", "yes"),
        ("upgrade", "websocket"),
    ]
    assert end_to_end(headers) == [("x-kept", "yes")]


@pytest.mark.parametrize(
    ("target", "split"),
    [
        ("/a/b?x=1&y=2", ("/a/b", "x=1&y=2")),
        ("/", ("/", "")),
        ("", ("/", "")),
        ("http://example.com/p?q", ("/p", "q")),
        ("https://example.com", ("/", "")),
    ],
)
def test_a_request_target_splits_into_path_and_query(target, split):
    assert _split(target) == split


@pytest.mark.parametrize("value", ["", "ingress", "infra/gw"])
def test_the_gateway_setting_takes_a_name_ingress_or_nothing(value):
    assert _gateway(value) == value


@pytest.mark.parametrize("value", ["gw", "/gw", "infra/", "a/b/c"])
def test_the_gateway_setting_refuses_what_is_not_namespace_slash_name(value):
    with pytest.raises(ValueError, match="NAMESPACE/NAME"):
        _gateway(value)


class _Obj:
    """Stands in for the SSLObject the callback receives."""

    context: Any = None


def _config(*listeners: tuple[str, str], pairs: dict[str, KeyPair]) -> GatewayConfig:
    table = RouteTable(
        ports=(
            PortTable(
                port=443,
                protocol=Protocol.HTTPS,
                listeners=tuple(
                    ListenerRoutes(
                        listener=Listener(
                            owner="infra/gw",
                            name=name,
                            port=443,
                            protocol=Protocol.HTTPS,
                            hostname=hostname,
                            certificates=(SecretRef("infra", name),),
                        ),
                        hosts=(),
                    )
                    for name, hostname in listeners
                ),
            ),
        )
    )
    return GatewayConfig(
        name="infra/gw",
        table=table,
        certificates={SecretRef("infra", n): p for n, p in pairs.items()},
    )


def _pair(*names: str) -> KeyPair:
    chain, key = server_cert(*names)
    return KeyPair(chain_pem=chain, key_pem=key)


def test_sni_picks_the_most_specific_listeners_context_and_refuses_other_names():
    contexts = SniContexts()
    contexts.update(
        _config(
            ("exact", "a.example"),
            ("wild", "*.example"),
            pairs={"exact": _pair("a.example"), "wild": _pair("*.example")},
        )
    )
    base = contexts.server_context(443)
    assert contexts.server_context(443) is base  # one context for the port's whole life
    chosen = {}
    for name in ("a.example", "b.example", "A.EXAMPLE"):
        obj = _Obj()
        assert base.sni_callback(obj, name, base) is None  # type: ignore[misc]
        chosen[name] = obj.context
        assert sni_of(obj) == name.lower()
    assert chosen["a.example"] is chosen["A.EXAMPLE"]
    assert chosen["a.example"] is not chosen["b.example"]
    refused = base.sni_callback(_Obj(), "other.test", base)  # type: ignore[misc]
    assert refused == ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME


def test_a_new_config_changes_the_context_behind_the_same_port_context():
    contexts = SniContexts()
    contexts.update(_config(("a", "a.example"), pairs={"a": _pair("a.example")}))
    base = contexts.server_context(443)
    before = _Obj()
    base.sni_callback(before, "a.example", base)  # type: ignore[misc]
    contexts.update(_config(("a", "a.example"), pairs={"a": _pair("a.example")}))
    after = _Obj()
    base.sni_callback(after, "a.example", base)  # type: ignore[misc]
    assert after.context is not before.context
    assert contexts.server_context(443) is base


def test_a_key_pair_that_does_not_load_leaves_its_listener_without_a_certificate():
    good, bad = _pair("a.example"), _pair("b.example")
    broken = KeyPair(chain_pem=bad.chain_pem, key_pem=good.key_pem)
    contexts = SniContexts()
    contexts.update(_config(("a", "a.example"), ("b", "b.example"), pairs={"a": good, "b": broken}))
    base = contexts.server_context(443)
    assert base.sni_callback(_Obj(), "a.example", base) is None  # type: ignore[misc]
    refused = base.sni_callback(_Obj(), "b.example", base)  # type: ignore[misc]
    assert refused == ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME


def test_request_metrics_carry_istios_labels_and_count_per_series():
    metrics = RequestMetrics(Source(workload="gw", namespace="infra", principal="spiffe://x"))
    sample = Sample(
        status=200,
        protocol="http",
        service_host="web.app.svc.cluster.local",
        service_name="web",
        service_namespace="app",
        workload="app/web-0",
        principal="spiffe://cluster.local/ns/app/sa/web",
        mtls=True,
        duration_ms=3.0,
    )
    metrics.record(sample)
    metrics.record(sample)
    metrics.record(Sample(status=404, protocol="http", flags="NR"))
    text = metrics.render().decode()
    line = next(
        x for x in text.splitlines() if x.startswith("istio_requests_total{") and '"200"' in x
    )
    for label in (
        'reporter="source"',
        'source_workload="gw"',
        'source_workload_namespace="infra"',
        'destination_workload="web-0"',
        'destination_workload_namespace="app"',
        'destination_principal="spiffe://cluster.local/ns/app/sa/web"',
        'connection_security_policy="mutual_tls"',
    ):
        assert label in line
    assert line.endswith(" 2.0")
    assert 'response_flags="NR"' in text
    assert 'destination_service="unknown"' in text


def test_tcp_metrics_count_per_series_across_connections():
    metrics = RequestMetrics(Source(workload="gw", namespace="infra", principal="spiffe://x"))
    to_db = Sample(
        status=0,
        protocol="tcp",
        service_host="db.app.svc.cluster.local",
        service_name="db",
        service_namespace="app",
        workload="app/db-0",
    )
    refused = Sample(status=0, protocol="tcp", flags="UF")
    for received, sent in ((10, 100), (5, 7)):
        metrics.connection_opened(to_db)
        metrics.connection_closed(to_db, received=received, sent=sent)
    metrics.connection_opened(refused)
    metrics.connection_closed(refused, received=3, sent=0)

    def value(name: str, flags: str) -> str:
        return next(
            x.rsplit(" ", 1)[1]
            for x in metrics.render().decode().splitlines()
            if x.startswith(name + "{") and f'response_flags="{flags}"' in x
        )

    assert value("istio_tcp_connections_opened_total", "-") == "2.0"
    assert value("istio_tcp_connections_closed_total", "-") == "2.0"
    assert value("istio_tcp_received_bytes_total", "-") == "15.0"
    assert value("istio_tcp_sent_bytes_total", "-") == "107.0"
    assert value("istio_tcp_connections_closed_total", "UF") == "1.0"
    assert value("istio_tcp_received_bytes_total", "UF") == "3.0"
    assert "response_code" not in next(
        x for x in metrics.render().decode().splitlines() if x.startswith("istio_tcp_sent")
    )
