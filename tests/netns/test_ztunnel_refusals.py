"""Each refusal on the HBONE paths gets its documented outcome and a failed-connection metric.

The test's own HBONE client talks to B's :15008 from the node namespace (a peer outside the
mesh): pod A's capture rules would hand anything it sends to A's sidecar.
"""

from __future__ import annotations

import hashlib
import time
from datetime import UTC, datetime, timedelta

import pytest
from h2.errors import ErrorCodes

from meshctl.core.pki.identity import SpiffeId
from tests.netns.ztunnel_harness import (
    TD,
    Ca,
    Sidecar,
    client_context,
    echo_roundtrip,
    hbone_request,
    metric_sum,
)
from tests.netns.ztunnel_topology import APP_PORT, two_pod_mesh

pytestmark = pytest.mark.netns

DENY_9999 = [
    {
        "name": "deny-9999",
        "namespace": "prod",
        "scope": "Namespace",
        "action": "Deny",
        "rules": [[[{"destinationPorts": [9999]}]]],
    }
]
CLIENT = SpiffeId(TD, "default", "client")


def _failed(car, flags: str) -> float:
    return metric_sum(car.metrics(), "istio_tcp_connections_failed_total", response_flags=flags)


def _three_refused_round_trips(m) -> None:
    for _ in range(3):
        try:
            reply = echo_roundtrip(m.a.ns, (m.b.ip, APP_PORT), b"secret", timeout=10)
        except ConnectionResetError:  # refused after our handshake: the app connection is reset
            reply = b""
        assert reply == b""


def test_hbone_server_verdicts_and_their_metrics(tmp_path):
    with two_pod_mesh(tmp_path, start_b=True, policies=DENY_9999) as m:
        roots = m.tmp / "certs" / "a" / "root-cert.pem"
        good = client_context(m.tmp / "certs" / "a", roots)
        addr = (m.b.ip, 15008)
        ok = hbone_request(
            m.node.ns,
            addr,
            good,
            [(":method", "CONNECT"), (":authority", f"{m.b.ip}:{APP_PORT}")],
            b"E" + b"hi",
        )
        assert (ok.status, ok.body) == (200, hashlib.sha256(b"hi").digest() + b"hi")

        def connect(authority, ctx=good, method="CONNECT"):
            headers = [(":method", method), (":authority", authority)]
            if method != "CONNECT":
                headers += [(":scheme", "https"), (":path", "/")]
            return hbone_request(m.node.ns, addr, ctx, headers)

        assert connect(f"{m.b.ip}:{APP_PORT}", method="GET").status == 400
        assert connect(f"{m.a.ip}:{APP_PORT}").status == 400  # not this workload
        assert connect(f"{m.b.ip}:15008").status == 400  # a proxy port, never tunnelled to
        assert _failed(m.car_b, "BAD_REQUEST") == 3
        assert connect(f"{m.b.ip}:9999").status == 401
        assert _failed(m.car_b, "DENY") == 1
        assert connect(f"{m.b.ip}:9").status == 503  # nothing listens there
        assert _failed(m.car_b, "CONNECT") == 1


def test_tls_refusals_wrong_trust_domain_expired_and_no_client_cert(tmp_path):
    with two_pod_mesh(tmp_path) as m:
        roots = m.tmp / "certs" / "a" / "root-cert.pem"
        addr = (m.b.ip, 15008)
        req = [(":method", "CONNECT"), (":authority", f"{m.b.ip}:{APP_PORT}")]
        # Signed by the right CA, but for another trust domain: refused after the handshake.
        evil = m.ca.issue("evil", SpiffeId("evil.org", "default", "client"))
        result = hbone_request(m.node.ns, addr, client_context(evil, roots), req)
        assert result.status is None
        # The client is told why, in HTTP/2 terms, and the TLS session ends properly.
        assert result.goaway is not None
        assert result.goaway[0] == ErrorCodes.INADEQUATE_SECURITY
        assert result.goaway[1].decode() == (
            "client identity refused: peer identity spiffe://evil.org/ns/default/sa/client is "
            "in trust domain 'evil.org', not 'cluster.local'; "
            "expected spiffe://cluster.local/ns/*/sa/*"
        )
        assert result.close_notify is True
        # Expired: OpenSSL refuses the chain during the handshake.
        old = m.ca.issue(
            "old", CLIENT, ttl=timedelta(hours=1), not_before=datetime.now(UTC) - timedelta(days=2)
        )
        assert hbone_request(m.node.ns, addr, client_context(old, roots), req).status is None
        # No client certificate at all.
        assert hbone_request(m.node.ns, addr, client_context(None, roots), req).status is None
        # Another CA entirely.
        stranger = Ca.create(m.tmp / "other").issue("x", CLIENT)
        assert hbone_request(m.node.ns, addr, client_context(stranger, roots), req).status is None
        text = m.car_b.metrics()
        assert metric_sum(text, "istio_tcp_connections_failed_total", response_flags="TLS") == 4
        log = m.car_b.log_text()
        assert "trust domain 'evil.org'" in log
        assert metric_sum(text, "istio_tcp_connections_opened_total") == 0


def test_outbound_refuses_a_peer_with_the_wrong_san(tmp_path):
    # B serves with a certificate for another service account than the store says it runs as.
    with two_pod_mesh(tmp_path, start_b=False) as m:
        other = m.ca.issue("b-other", SpiffeId(TD, "prod", "impostor"))
        car = Sidecar(m.b.ns, "prod/server/impostor", other, m.config, log_path=m.tmp / "b2.log")
        car.start()
        try:
            _three_refused_round_trips(m)  # every stream fails; the pool never loops
            assert _failed(m.car_a, "TLS") == 3
            assert "not the expected spiffe://cluster.local/ns/prod/sa/server" in m.car_a.log_text()
            # The refused server was told, by GOAWAY debug data, who it was and who was expected.
            told = (
                "peer sent GOAWAY: server identity refused: peer identity "
                "spiffe://cluster.local/ns/prod/sa/impostor is not the expected "
                "spiffe://cluster.local/ns/prod/sa/server (HTTP/2 error 12)"
            )
            assert told in (m.tmp / "b2.log").read_text()
        finally:
            car.stop()


def test_a_peer_that_rejects_our_certificate_costs_one_handshake_per_app_connection(tmp_path):
    # TLS 1.3: our side of the handshake is done before B checks our certificate and refuses
    # it, so the pool holds a "connected" connection that dies a moment later. That must fail
    # the waiting stream, not send the pool round to dial B again.
    with two_pod_mesh(tmp_path, start_b=False) as m:
        stranger = Ca.create(m.tmp / "stranger")
        (m.car_b.cert_dir / "root-cert.pem").write_bytes(stranger.root.cert_pem)  # B trusts only it
        m.car_b.start()
        _three_refused_round_trips(m)
        assert _failed(m.car_a, "TLS") == 3
        time.sleep(0.5)  # a re-dial would land in B's counters a moment after the stream failed
        assert _failed(m.car_b, "TLS") == 3, m.car_a.log_text()
