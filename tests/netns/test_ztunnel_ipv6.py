"""IPv6: the outbound capture (ip6tables REDIRECT, SO_ORIGINAL_DST over IPv6) and HBONE over IPv6.

The mesh is dual-stack (``two_pod_mesh(dual_stack=True)``: a random fd00::/8 ULA /64 inside the
test namespaces, the IPv6 capture rules from ``meshctl iptables apply --dual-stack``). A
connection from pod A to B's IPv6 address is redirected to A's :15001 by ip6tables; only the
IPv6 original destination can route it (after a REDIRECT the local address is ``::1``:15001,
which the proxy refuses as a call to itself), and it must reach B's :15008 as HBONE over IPv6.
"""

from __future__ import annotations

import hashlib
import secrets
import socket
import time

import pytest

from tests.netns.ztunnel_harness import echo_roundtrip, metric_sum, pattern
from tests.netns.ztunnel_topology import APP_PORT, SVC_PORT, two_pod_mesh

pytestmark = pytest.mark.netns

CLIENT = "spiffe://cluster.local/ns/default/sa/client"
SERVER = "spiffe://cluster.local/ns/prod/sa/server"


def _server_first(ns, addr: tuple[str, int], size: int, reply: bytes) -> bytes:
    """Mode S over IPv6: the server half-closes first, then we send ``reply`` and half-close."""
    with ns.socket(socket.AF_INET6) as s:
        s.settimeout(30)
        s.connect(addr)
        s.sendall(b"S" + size.to_bytes(8, "big"))
        got = b""
        while chunk := s.recv(1 << 16):
            got += chunk
        s.sendall(reply)
        s.shutdown(socket.SHUT_WR)
        while s.recv(1 << 16):
            pass
    return got


def test_ipv6_client_reaches_server_over_hbone_by_pod_ip_and_by_service_vip(tmp_path):
    with two_pod_mesh(tmp_path, dual_stack=True) as m:
        assert m.echo6 is not None
        payload = secrets.token_bytes(700_000)
        for addr in ((m.b_ip6, APP_PORT), (m.vip6, SVC_PORT)):
            reply = echo_roundtrip(m.a.ns, addr, payload)
            assert reply == hashlib.sha256(payload).digest() + payload
        reply = secrets.token_bytes(300_000)
        assert _server_first(m.a.ns, (m.b_ip6, APP_PORT), 500_000, reply) == pattern(500_000)
        # The IPv4 side of the same dual-stack mesh still works.
        assert echo_roundtrip(m.a.ns, (m.b.ip, APP_PORT), b"four")[32:] == b"four"

        assert len(m.echo6.peers) == 3  # the v6 echo saw exactly the three v6 connections
        a_metrics, b_metrics = m.car_a.metrics(), m.car_b.metrics()
        identities = {"source_principal": CLIENT, "destination_principal": SERVER}
        opened = "istio_tcp_connections_opened_total"
        assert metric_sum(a_metrics, opened, reporter="source", **identities) == 4
        assert metric_sum(a_metrics, opened, destination_service="echo.prod.svc.cluster.local") == 1
        assert metric_sum(b_metrics, opened, reporter="destination", **identities) == 4
        assert metric_sum(a_metrics, "istio_tcp_connections_failed_total") == 0
        # The tunnels went to B's IPv6 :15008, asking for B's IPv6 address, from A's. (A flow's
        # access-log line is written as its sockets close, just after the client saw EOF.)
        end = time.monotonic() + 5
        while m.car_a.log_text(None).count("connection complete") < 4 and time.monotonic() < end:
            time.sleep(0.05)
        a_log, b_log = m.car_a.log_text(None), m.car_b.log_text(None)
        # As ztunnel logs both sides: dst.addr the TCP connection's, dst.hbone_addr the CONNECT
        # authority (the VIP's target port too).
        hop = f"dst.addr=[{m.b_ip6}]:15008 dst.hbone_addr=[{m.b_ip6}]:{APP_PORT} "
        assert a_log.count(hop) == 3
        assert b_log.count(hop) == 3
        assert b_log.count(f"src.addr=[{m.a_ip6}]:") == 3
        # Server-first: what we sent after the server's half-close arrived intact.
        assert hashlib.sha256(reply).hexdigest() in m.echo6.received
