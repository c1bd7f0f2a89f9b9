"""Real traffic through the capture rules: pods on a bridge, a proxy stand-in, SO_ORIGINAL_DST.

All traffic stays inside the namespaces the test created (pod addresses and loopback).
"""

from __future__ import annotations

import socket

import pytest

from meshctl.net.sockets import filesystem_ids, original_destination
from tests.harness import netns as netns_mod
from tests.netns.capture_support import (
    BACKENDS,
    TIMEOUT,
    Meshctl,
    listen,
    proxy_stand_in,
    request,
    serving,
)

pytestmark = pytest.mark.netns

ANY = "0.0.0.0"  # noqa: S104 (listeners inside the test's own namespaces only)


@pytest.fixture
def meshctl(capsys, monkeypatch, tmp_path):
    return Meshctl(capsys, monkeypatch, tmp_path)


def _original(conn: socket.socket, _request: bytes) -> bytes:
    original = original_destination(conn)
    return f"inbound:{original[0]}:{original[1]}".encode() if original else b"not-redirected"


@pytest.mark.parametrize("backend", BACKENDS)
def test_outbound_reaches_the_server_only_through_the_proxy_which_sees_the_original_dst(
    node, meshctl, backend
):
    client, server_pod = node.pods
    seen: list[tuple[str, int]] = []
    with serving(listen(server_pod.ns, server_pod.ip, 8080, "server")) as server:
        assert request(client.ns, server_pod.ip, 8080) == b"server:hello\n"  # no capture yet
        meshctl.ok("iptables", "apply", "--netns", client.ns.name, "--backend", backend)
        with pytest.raises(ConnectionRefusedError):  # captured, and no proxy listens yet
            request(client.ns, server_pod.ip, 8080)
        with serving(listen(client.ns, ANY, 15001, "proxy"), proxy_stand_in(client.ns, seen)):
            reply = request(client.ns, server_pod.ip, 8080, b"through\n")
    assert reply == b"via-proxy>server:through\n"
    assert seen == [(server_pod.ip, 8080)]
    assert server.peers[-1][0] == client.ip


def test_traffic_of_the_proxy_uid_bypasses_capture(node, meshctl):
    client, server_pod = node.pods
    seen: list[tuple[str, int]] = []
    meshctl.ok("iptables", "apply", "--netns", client.ns.name)
    with (
        serving(listen(server_pod.ns, server_pod.ip, 8080, "server")),
        serving(listen(client.ns, ANY, 15001, "proxy"), proxy_stand_in(client.ns, seen)),
    ):
        assert request(client.ns, server_pod.ip, 8080, uid=1337) == b"server:hello\n"
        assert request(client.ns, server_pod.ip, 8080, uid=1000) == b"via-proxy>server:hello\n"
    assert seen == [(server_pod.ip, 8080)]


@pytest.mark.parametrize(
    ("flags", "port"),
    [
        (["-o", "8081"], 8081),
        (["-x", "{server}/32"], 8080),
        (["-i", "192.0.2.0/24"], 8080),
    ],
    ids=["excluded-port", "excluded-cidr", "cidr-not-included"],
)
def test_excluded_ports_and_cidrs_bypass_capture(node, meshctl, flags, port):
    client, server_pod = node.pods
    seen: list[tuple[str, int]] = []
    args = [f.format(server=server_pod.ip) for f in flags]
    meshctl.ok("iptables", "apply", "--netns", client.ns.name, *args)
    with (
        serving(listen(server_pod.ns, server_pod.ip, port, "server")),
        serving(listen(client.ns, ANY, 15001, "proxy"), proxy_stand_in(client.ns, seen)),
    ):
        assert request(client.ns, server_pod.ip, port) == b"server:hello\n"
    assert seen == []


def test_inbound_goes_to_15006_except_excluded_ports_and_the_tunnel_port(node, meshctl):
    client, pod = node.pods
    meshctl.ok("iptables", "apply", "--netns", pod.ns.name)
    with (
        serving(listen(pod.ns, ANY, 15006, "inbound"), _original),
        serving(listen(pod.ns, pod.ip, 8080, "app")) as app,
        serving(listen(pod.ns, pod.ip, 15008, "hbone")),
        serving(listen(pod.ns, pod.ip, 15021, "health")),
    ):
        assert request(client.ns, pod.ip, 8080) == f"inbound:{pod.ip}:8080".encode()
        assert request(client.ns, pod.ip, 15008) == b"hbone:hello\n"
        assert request(client.ns, pod.ip, 15021) == b"health:hello\n"
    assert app.peers == []  # the app port itself was never reached directly


def test_dns_over_udp_and_tcp_reaches_the_dns_proxy_on_15053(node, meshctl):
    client, other = node.pods
    meshctl.ok(
        "iptables", "apply", "--netns", client.ns.name, "--redirect-dns", "--capture-all-dns"
    )
    with client.ns.entered(), filesystem_ids(1337, 1337):  # the DNS proxy runs as the proxy uid
        udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with udp:
        # on loopback, as istio-agent listens: a reply must leave from the redirect's address
        # (127.0.0.1) for conntrack to recognise it and restore the resolver's address
        udp.bind(("127.0.0.1", 15053))
        udp.settimeout(TIMEOUT)
        with client.ns.entered():
            query = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        with query:
            query.settimeout(TIMEOUT)
            query.connect((other.ip, 53))
            query.send(b"dns-query")
            data, asker = udp.recvfrom(512)
            assert data == b"dns-query"
            udp.sendto(b"dns-answer", asker)
            answer, source = query.recvfrom(512)
    assert answer == b"dns-answer"
    assert source == (other.ip, 53)  # conntrack undid the redirect for the reply
    with serving(listen(client.ns, ANY, 15053, "dns-tcp"), _original):
        assert request(client.ns, other.ip, 53) == f"inbound:{other.ip}:53".encode()


def test_tproxy_inbound_keeps_the_original_destination(node, meshctl):
    client, pod = node.pods
    meshctl.ok("iptables", "apply", "--netns", pod.ns.name, "-m", "TPROXY")

    def local_address(conn: socket.socket, _request: bytes) -> bytes:
        address, port = conn.getsockname()[:2]
        return f"accepted-as:{address}:{port}".encode()

    with serving(listen(pod.ns, ANY, 15006, "tproxy", transparent=True), local_address):
        assert request(client.ns, pod.ip, 8080) == f"accepted-as:{pod.ip}:8080".encode()
        assert request(client.ns, pod.ip, 9090) == f"accepted-as:{pod.ip}:9090".encode()


def test_ipv6_outbound_is_redirected_to_the_proxy(netns_factory, meshctl):
    client, server_ns = netns_factory("v6a"), netns_factory("v6b")
    for ns in (client, server_ns):
        # no duplicate address detection: addresses are usable at once, no sleeping
        ns.run(["sysctl", "-qw", "net.ipv6.conf.all.accept_dad=0"])
        ns.run(["sysctl", "-qw", "net.ipv6.conf.default.accept_dad=0"])
    netns_mod.veth_pair(client, server_ns, a_addr="fd00:db8::1/64", b_addr="fd00:db8::2/64")
    seen: list[tuple[str, int]] = []
    meshctl.ok("iptables", "apply", "--netns", client.name, "--dual-stack")
    with (
        serving(listen(server_ns, "fd00:db8::2", 8080, "server6")) as server,
        serving(listen(client, "::", 15001, "proxy6"), proxy_stand_in(client, seen)),
    ):
        assert request(client, "fd00:db8::2", 8080) == b"via-proxy>server6:hello\n"
    assert seen == [("fd00:db8::2", 8080)]
    assert server.peers[-1][0] == "fd00:db8::1"
