"""The netns fixtures themselves: real namespaces, veths and a bridge, and nothing left behind."""

from __future__ import annotations

import secrets
import socket
import threading

import pytest

from tests.harness import netns as netns_mod

pytestmark = pytest.mark.netns


def _echo_once(server: socket.socket, received: list[bytes]) -> None:
    conn, _ = server.accept()
    with conn:
        chunks = []
        while chunk := conn.recv(65536):
            chunks.append(chunk)
        data = b"".join(chunks)
        received.append(data)
        conn.sendall(data[::-1])


def _exchange(
    server_ns: netns_mod.Netns, server_ip: str, client_ns: netns_mod.Netns, payload: bytes
) -> tuple[bytes, bytes]:
    """Send ``payload`` from a client socket in ``client_ns`` to a server in ``server_ns``."""
    received: list[bytes] = []
    with server_ns.socket() as server:
        server.bind((server_ip, 0))
        server.listen(1)
        port = server.getsockname()[1]
        worker = threading.Thread(target=_echo_once, args=(server, received))
        worker.start()
        with client_ns.socket() as client:
            client.settimeout(10)
            client.connect((server_ip, port))
            client.sendall(payload)
            client.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := client.recv(65536):
                reply += chunk
        worker.join(10)
    return received[0], reply


def test_two_pods_on_a_bridge_exchange_bytes_and_everything_is_removed():
    host_links_before = netns_mod.host_link_names()
    payload = secrets.token_bytes(256 * 1024)
    with netns_mod.node_with_pods(2) as node:
        a, b = node.pods
        names = [ns.name for ns in node.namespaces()]
        assert all(netns_mod.exists(n) for n in names)
        assert {"br0", a.host_veth, b.host_veth} <= node.ns.link_names()
        assert "eth0" in a.ns.link_names()
        received, reply = _exchange(b.ns, b.ip, a.ns, payload)
        assert received == payload
        assert reply == payload[::-1]
        # The pods really are separate: neither has the other's address.
        assert b.ip not in a.ns.run(["ip", "-o", "addr"]).stdout
    assert not any(netns_mod.exists(n) for n in names)
    assert netns_mod.host_link_names() == host_links_before


def _fail_inside_a_node(names: list[str]) -> None:
    with netns_mod.node_with_pods(1) as node:
        names.extend(ns.name for ns in node.namespaces())
        node.ns.popen(["sleep", "300"])  # a process left inside must not keep it alive
        raise RuntimeError("boom")


def test_cleanup_happens_when_the_test_body_fails():
    names: list[str] = []
    with pytest.raises(RuntimeError, match="boom"):
        _fail_inside_a_node(names)
    assert names
    assert not any(netns_mod.exists(n) for n in names)


def test_veth_pair_joins_two_namespaces(netns_factory):
    host_links_before = netns_mod.host_link_names()
    left, right = netns_factory("left"), netns_factory("right")
    netns_mod.veth_pair(left, right, a_addr="10.201.0.1/30", b_addr="10.201.0.2/30")
    received, reply = _exchange(right, "10.201.0.2", left, b"ping")
    assert (received, reply) == (b"ping", b"gnip")
    assert left.link_names() == right.link_names() == {"lo", "eth0"}
    assert netns_mod.host_link_names() == host_links_before


def test_netns_fixture_has_loopback_up(netns):
    out = netns.run(["ip", "-o", "link", "show", "lo"]).stdout
    assert "UP" in out
    received, _ = _exchange(netns, "127.0.0.1", netns, b"x")
    assert received == b"x"


def test_node_fixture_grows_pods(node):
    third = node.add_pod("extra")
    assert len(node.pods) == 3
    received, _ = _exchange(third.ns, third.ip, node.pods[0].ns, b"third")
    assert received == b"third"
    assert node.ns.run(["ip", "-o", "addr", "show", "br0"]).stdout.count(node.gateway) == 1
