"""Traffic through two sidecars: byte-exact, both half-close orders, VIPs, metrics, config_dump."""

from __future__ import annotations

import asyncio
import hashlib
import random
import secrets
import socket
import time

import pytest

from tests.netns.ztunnel_harness import (
    EchoServer,
    Sniffer,
    echo_roundtrip,
    metric_sum,
    pattern,
    stream_bytes,
)
from tests.netns.ztunnel_topology import APP_PORT, SVC_PORT, two_pod_mesh

pytestmark = pytest.mark.netns


def test_client_reaches_server_by_pod_ip_and_by_service_vip(tmp_path):
    with two_pod_mesh(tmp_path) as m:
        payload = secrets.token_bytes(300_000)
        for addr in ((m.b.ip, APP_PORT), (m.vip, SVC_PORT)):
            reply = echo_roundtrip(m.a.ns, addr, payload)
            assert reply == hashlib.sha256(payload).digest() + payload
        # The server saw the connections come from the client pod (via B's sidecar, locally).
        assert m.echo.peers
        src = metric_sum(
            m.car_a.metrics(),
            "istio_tcp_connections_opened_total",
            reporter="source",
            source_principal="spiffe://cluster.local/ns/default/sa/client",
            destination_principal="spiffe://cluster.local/ns/prod/sa/server",
            connection_security_policy="mutual_tls",
        )
        assert src == 2
        via_svc = metric_sum(
            m.car_a.metrics(),
            "istio_tcp_connections_opened_total",
            destination_service="echo.prod.svc.cluster.local",
        )
        assert via_svc == 1
        dst_text = m.car_b.metrics()
        assert metric_sum(
            dst_text,
            "istio_tcp_received_bytes_total",
            reporter="destination",
            source_principal="spiffe://cluster.local/ns/default/sa/client",
        ) == 2 * (len(payload) + 1)
        assert (
            metric_sum(dst_text, "istio_tcp_connections_closed_total", reporter="destination") == 2
        )
        dump = m.car_b.config_dump()
        assert dump["identity"] == "spiffe://cluster.local/ns/prod/sa/server"
        assert {w["name"] for w in dump["workloads"]} == {"client", "server"}
        assert dump["certificates"][0]["certChain"][0]["uriSans"] == [dump["identity"]]
        assert "expirationTime" in dump["certificates"][0]["certChain"][0]
        log = m.car_b.log_text()
        assert "src.identity=spiffe://cluster.local/ns/default/sa/client" in log
        assert "direction=inbound" in log
        # Access-log bytes as ztunnel logs them: each side's bytes_sent is what it forwarded.
        request, response = len(payload) + 1, 32 + len(payload)
        assert f"bytes_sent={response} bytes_recv={request}" in log
        assert f"bytes_sent={request} bytes_recv={response}" in m.car_a.log_text()


def test_bytes_between_the_pods_are_tls_while_unmeshed_traffic_shows_plaintext(tmp_path):
    with two_pod_mesh(tmp_path) as m:
        canary = b"MESH-CANARY-" + secrets.token_hex(8).encode()
        payload = canary * 20_000  # ~560 KB of an unmistakable plaintext
        on_a = Sniffer(m.node.ns, m.a.host_veth)
        on_b = Sniffer(m.node.ns, m.b.host_veth)
        for addr in ((m.b.ip, APP_PORT), (m.vip, SVC_PORT)):
            reply = echo_roundtrip(m.a.ns, addr, payload)
            assert reply == hashlib.sha256(payload).digest() + payload
        # The control: the node has no sidecar, so its bytes cross B's veth as they are (B's
        # inbound capture sends them through :15006 in plaintext). The sniffer does see payload.
        plain = b"PLAIN" + canary
        assert echo_roundtrip(m.node.ns, (m.b.ip, APP_PORT), plain)[32:] == plain
        a_segments, b_segments = on_a.stop(), on_b.stop()
        assert plain in stream_bytes(b_segments, None, APP_PORT)
        meshed = [s for s in a_segments + b_segments if m.node.gateway not in (s.src[0], s.dst[0])]
        assert canary not in b"".join(s.payload for s in meshed)
        # Pod A sent its payload to B's :15008 only, and it went both ways as TLS records.
        assert {s.dst for s in a_segments if s.payload and s.src[0] == m.a.ip} == {(m.b.ip, 15008)}
        up = stream_bytes(a_segments, None, 15008)
        down = stream_bytes(a_segments, 15008, None)
        assert len(up) > 2 * len(payload)
        assert len(down) > 2 * len(payload)
        assert up[:1] == down[:1] == b"\x16"  # both sides start with a TLS handshake record
        assert b"\x17\x03\x03" in up  # then application-data records (TLS 1.3 framing)


def test_config_dump_and_metrics_show_an_open_connection_with_both_identities(tmp_path):
    client = "spiffe://cluster.local/ns/default/sa/client"
    server = "spiffe://cluster.local/ns/prod/sa/server"
    with two_pod_mesh(tmp_path) as m, m.a.ns.socket() as s:
        s.settimeout(10)
        s.connect((m.b.ip, APP_PORT))
        s.sendall(b"E" + b"open" * 1000)  # mode E waits for our FIN: the connection stays open
        end = time.monotonic() + 5
        while time.monotonic() < end:
            a_flows = m.car_a.config_dump()["connections"]["flows"]
            b_flows = m.car_b.config_dump()["connections"]["flows"]
            if a_flows and b_flows and b_flows[0]["bytesReceived"] == 4001:
                break
            time.sleep(0.05)
        assert [(f["direction"], f["src"]["identity"], f["dst"]["identity"]) for f in a_flows] == [
            ("outbound", client, server)
        ]
        # Both sides as ztunnel logs them: the TCP connection's address, the CONNECT authority.
        for flow in (a_flows[0], b_flows[0]):
            assert (flow["dst"]["addr"], flow["hboneAddr"]) == (
                f"{m.b.ip}:15008",
                f"{m.b.ip}:{APP_PORT}",
            )
        assert [(f["direction"], f["src"]["identity"], f["dst"]["identity"]) for f in b_flows] == [
            ("inbound", client, server)
        ]
        assert b_flows[0]["src"]["workload"] == "default/client"
        assert b_flows[0]["bytesReceived"] == 4001
        text = m.car_b.metrics()
        labels = {"source_principal": client, "destination_principal": server}
        assert metric_sum(text, "istio_tcp_connections_opened_total", **labels) == 1
        assert metric_sum(text, "istio_tcp_connections_closed_total", **labels) == 0
        s.shutdown(socket.SHUT_WR)
        while s.recv(65536):
            pass
        end = time.monotonic() + 5
        while m.car_b.config_dump()["connections"]["flows"] and time.monotonic() < end:
            time.sleep(0.05)
        assert m.car_b.config_dump()["connections"]["flows"] == []
        assert metric_sum(m.car_b.metrics(), "istio_tcp_connections_closed_total", **labels) == 1


def test_pooled_streams_share_one_connection(tmp_path):
    with two_pod_mesh(tmp_path) as m:
        for _ in range(5):
            echo_roundtrip(m.a.ns, (m.b.ip, APP_PORT), b"x" * 1000)
        assert m.car_a.config_dump()["connections"]["pooled"] == 1


async def _one(ns, addr, size: int, server_first: bool, sem) -> tuple[bool, str]:
    async with sem:
        sock = ns.socket()
        sock.setblocking(False)
        loop = asyncio.get_running_loop()
        await loop.sock_connect(sock, addr)
        reader, writer = await asyncio.open_connection(sock=sock)
        payload = pattern(size + 1)[1:] if size else b""
        if server_first:
            writer.write(b"S" + size.to_bytes(8, "big"))
            await writer.drain()
            got = await reader.read(-1)  # the server half-closed first; we still write after
            ok = got == pattern(size)
            writer.write(payload)
            await writer.drain()
            writer.write_eof()
            await reader.read(-1)
            writer.close()
            # Until the transport's last buffered bytes and FIN are out: drain() leaves up to its
            # low-water mark queued, and a loop that ends first never writes them.
            await writer.wait_closed()
            return ok, hashlib.sha256(payload).hexdigest()
        writer.write(b"E" + payload)
        await writer.drain()
        writer.write_eof()  # we half-close first; the reply still comes back
        reply = await reader.read(-1)
        writer.close()
        await writer.wait_closed()
        return reply == hashlib.sha256(payload).digest() + payload, ""


@pytest.mark.slow
def test_a_thousand_concurrent_connections_byte_exact_with_half_close_both_ways(tmp_path):
    rng = random.Random(6)  # noqa: S311 (reproducible sizes, not secrets)
    sizes = [
        rng.choice([0, 1, rng.randrange(1, 4 << 20), rng.randrange(1, 64 << 10)])
        for _ in range(1000)
    ]

    async def main(m):
        sem = asyncio.Semaphore(1000)
        addr = (m.b.ip, APP_PORT)
        jobs = [_one(m.a.ns, addr, n, i % 2 == 1, sem) for i, n in enumerate(sizes)]
        return await asyncio.wait_for(asyncio.gather(*jobs), 300)

    with two_pod_mesh(tmp_path) as m:
        results = asyncio.run(main(m))
        assert all(ok for ok, _ in results)
        expected = sorted(d for ok, d in results if d)
        # Server-first connections record their digest after the client is done: wait for them.
        end = time.monotonic() + 20
        while len(m.echo.received) < len(expected) and time.monotonic() < end:
            time.sleep(0.05)
        assert sorted(m.echo.received) == expected
        text = m.car_a.metrics()
        assert metric_sum(text, "istio_tcp_connections_opened_total", reporter="source") == 1000
        assert metric_sum(text, "istio_tcp_connections_failed_total") == 0
        # 1000 streams over pooled connections of at most 100 streams each.
        assert m.car_a.config_dump()["connections"]["pooled"] <= 10 + 2


def test_connection_to_own_proxy_port_is_refused(tmp_path):
    with two_pod_mesh(tmp_path) as m:
        with m.a.ns.socket() as s:
            s.settimeout(5)
            try:
                s.connect(("127.0.0.1", 15001))  # not redirected: the "original" dst is 15001
                s.sendall(b"loop?")
                reply = s.recv(10)
            except (ConnectionResetError, BrokenPipeError):
                reply = b""  # the RST may arrive before or after our bytes
        assert reply == b""
        text = m.car_a.metrics()
        assert metric_sum(text, "istio_tcp_connections_failed_total", response_flags="SELF") == 1


def test_unknown_destination_passes_through_in_plain_tcp(tmp_path):
    with two_pod_mesh(tmp_path) as m:
        # An address no workload record names: a second IP on B, routed from A.
        m.b.ns.run(["ip", "addr", "add", "10.250.0.7/32", "dev", "eth0"])
        m.a.ns.run(["ip", "route", "add", "10.250.0.7/32", "via", m.b.ip])
        plain = EchoServer(m.b.ns, "10.250.0.7", 7070)
        try:
            payload = b"plain" * 1000
            reply = echo_roundtrip(m.a.ns, ("10.250.0.7", 7070), payload)
            assert reply == hashlib.sha256(payload).digest() + payload
            text = m.car_a.metrics()
            opened = metric_sum(
                text, "istio_tcp_connections_opened_total", connection_security_policy="unknown"
            )
            assert opened == 1
        finally:
            plain.close()
