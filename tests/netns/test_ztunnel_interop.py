"""Interop with an independent HTTP/2 stack: Node.js's built-in ``http2`` + ``tls`` as HBONE peer.

Node is the client against our :15008 (from the node namespace, outside the mesh) and the
server behind our outbound side (in pod B, in place of B's sidecar), both with mTLS. Node's
default SETTINGS_MAX_FRAME_SIZE is 16 KiB, so multi-MiB transfers also prove that our 1 MiB
frames give way to a peer's smaller setting.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
from pathlib import Path

import pytest
from h2.errors import ErrorCodes

from meshctl.core.pki.identity import SpiffeId
from tests.netns.ztunnel_harness import echo_roundtrip, metric_sum
from tests.netns.ztunnel_topology import APP_PORT, SVC_PORT, two_pod_mesh

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (node) for interop"),
]

INTEROP = Path(__file__).resolve().parent.parent / "interop"
CLIENT_ID = "spiffe://cluster.local/ns/default/sa/client"
SERVER_ID = "spiffe://cluster.local/ns/prod/sa/server"
TD_EVIL = "evil.org"
INADEQUATE_SECURITY = int(ErrorCodes.INADEQUATE_SECURITY)


def _node_client(m, authority: str, nbytes: int, cert_dir: str) -> tuple[int, dict]:
    roots = str(m.tmp / "certs" / "a" / "root-cert.pem")
    argv = ["node", str(INTEROP / "hbone_client.js"), m.b.ip, "15008", authority, str(nbytes)]
    done = m.node.ns.run([*argv, roots, cert_dir, SERVER_ID], check=False, timeout=60)
    return done.returncode, json.loads(done.stdout.strip().splitlines()[-1])


def test_node_http2_client_tunnels_through_our_hbone_server(tmp_path):
    with two_pod_mesh(tmp_path) as m:
        client_certs = str(m.tmp / "certs" / "a")
        code, result = _node_client(m, f"{m.b.ip}:{APP_PORT}", 4 << 20, client_certs)
        assert code == 0, result
        assert result["status"] == 200
        assert result["san"] == [SERVER_ID]  # Node read our URI SAN
        assert result["received"] == 32 + (4 << 20)
        text = m.car_b.metrics()
        assert metric_sum(
            text,
            "istio_tcp_received_bytes_total",
            source_principal=CLIENT_ID,
            connection_security_policy="mutual_tls",
        ) == 1 + (4 << 20)
        # Our verdicts reach Node too: an authority that is not this workload is a 400.
        code, result = _node_client(m, f"{m.a.ip}:{APP_PORT}", 10, client_certs)
        assert (code, result["status"]) == (1, 400)
        # Without a client certificate our server ends the handshake: no HTTP/2 at all.
        code, result = _node_client(m, f"{m.b.ip}:{APP_PORT}", 10, "-")
        assert code == 2, result
        assert result["status"] is None
        # A certificate our CA signed for another trust domain: Node hears why, by GOAWAY.
        evil = m.ca.issue("evil", SpiffeId(TD_EVIL, "default", "client"))
        code, result = _node_client(m, f"{m.b.ip}:{APP_PORT}", 10, str(evil))
        assert code == 2, result
        assert result["goaway"]["code"] == INADEQUATE_SECURITY
        assert f"spiffe://{TD_EVIL}/ns/default/sa/client" in result["goaway"]["debug"]
        assert "expected spiffe://cluster.local/ns/*/sa/*" in result["goaway"]["debug"]
        assert metric_sum(m.car_b.metrics(), "istio_tcp_connections_failed_total") == 3


def test_our_outbound_side_tunnels_to_a_node_http2_server(tmp_path):
    with two_pod_mesh(tmp_path, start_b=False) as m:
        argv = [
            "node",
            str(INTEROP / "hbone_server.js"),
            m.b.ip,
            "15008",
            str(m.tmp / "certs" / "b"),
            f"{m.b.ip}:{APP_PORT}",
        ]
        server = m.b.ns.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert server.stdout is not None
            assert json.loads(server.stdout.readline()) == {"listening": 15008}
            payload = bytes(range(256)) * (12 << 10)  # 3 MiB
            for addr in ((m.b.ip, APP_PORT), (m.vip, SVC_PORT)):
                reply = echo_roundtrip(m.a.ns, addr, payload)
                assert reply[32:] == payload
            requests = [json.loads(server.stdout.readline()) for _ in range(2)]
        finally:
            server.terminate()
            server.wait(10)
        # Node serving as another identity than the store's: our client refuses it and tells it.
        impostor = m.ca.issue("impostor", SpiffeId("cluster.local", "prod", "impostor"))
        argv[4] = str(impostor)
        server = m.b.ns.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert server.stdout is not None
            assert json.loads(server.stdout.readline()) == {"listening": 15008}
            with contextlib.suppress(ConnectionResetError):
                assert echo_roundtrip(m.a.ns, (m.b.ip, APP_PORT), b"x", timeout=10) == b""
            told = json.loads(server.stdout.readline())
        finally:
            server.terminate()
            server.wait(10)
        assert told["goaway"] == INADEQUATE_SECURITY
        assert told["debug"] == (
            "server identity refused: peer identity spiffe://cluster.local/ns/prod/sa/impostor "
            f"is not the expected {SERVER_ID}"
        )
        for request in requests:
            assert request["method"] == "CONNECT"
            assert request["authority"] == f"{m.b.ip}:{APP_PORT}"  # VIP and port mapped
            assert request["san"] == [CLIENT_ID]  # our client certificate, verified by Node
            assert request["forwarded"].startswith(f'for="{m.a.ip}:')
            assert "k8s.namespace.name=default" in request["baggage"]
        assert requests[1]["forwarded"].endswith(";host=echo.prod.svc.cluster.local")
        text = m.car_a.metrics()
        opened = metric_sum(
            text,
            "istio_tcp_connections_opened_total",
            reporter="source",
            destination_principal=SERVER_ID,
            connection_security_policy="mutual_tls",
        )
        assert opened == 2
