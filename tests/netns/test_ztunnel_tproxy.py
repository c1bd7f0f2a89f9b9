"""A sidecar in TPROXY interception mode (``sidecar.istio.io/interceptionMode: TPROXY``): the
server's capture rules are istio-iptables' TPROXY set (mangle, mark 1337, policy route), and its
proxy learns the mode from ``ISTIO_META_INTERCEPTION_MODE`` as the injector sets it. Istio's
promise for that mode, checked here: inbound connections reach the app with the client's own
address as their source (REDIRECT mode shows the proxy's 127.0.0.6), bytes intact both ways,
over mutual TLS from a REDIRECT-mode client."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.netns.ztunnel_harness import echo_roundtrip, metric_sum, pattern
from tests.netns.ztunnel_topology import APP_PORT, two_pod_mesh

pytestmark = pytest.mark.netns

TPROXY_ENV = {"ISTIO_META_INTERCEPTION_MODE": "TPROXY"}


def test_tproxy_inbound_reaches_the_app_from_the_clients_own_address(tmp_path: Path):
    with two_pod_mesh(tmp_path, capture_b=("-m", "TPROXY"), env_b=TPROXY_ENV) as m:
        payload = pattern(300_000)
        answer = echo_roundtrip(m.a.ns, (m.b.ip, APP_PORT), payload)
        assert (len(answer), answer[32:] == payload) == (32 + len(payload), True), answer[:200]
        assert m.echo.peers, "the app saw no connection"
        assert m.echo.peers[-1][0] == m.a.ip, m.echo.peers
        # It came through the server's proxy over HBONE, with the client's identity.
        assert (
            metric_sum(
                m.car_b.metrics(),
                "istio_tcp_connections_opened_total",
                reporter="destination",
                connection_security_policy="mutual_tls",
                source_principal="spiffe://cluster.local/ns/default/sa/client",
            )
            >= 1
        ), m.car_b.metrics()[-2000:]

        # A client without a sidecar (the node's own namespace): TPROXY hands its connection
        # to the transparent inbound listener (15006), which delivers it from that address.
        answer = echo_roundtrip(m.node.ns, (m.b.ip, APP_PORT), b"plain")
        assert answer[32:] == b"plain"
        assert m.echo.peers[-1][0] == m.node.gateway, m.echo.peers


def test_redirect_inbound_reaches_the_app_from_the_inbound_passthrough_address(tmp_path: Path):
    with two_pod_mesh(tmp_path) as m:
        answer = echo_roundtrip(m.a.ns, (m.b.ip, APP_PORT), b"x" * 1000)
        assert answer[32:] == b"x" * 1000
        assert m.echo.peers[-1][0] == "127.0.0.6", m.echo.peers
