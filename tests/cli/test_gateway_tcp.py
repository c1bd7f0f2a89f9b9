"""``meshctl gateway run -f`` TCP listeners (``protocol: TCP``, TCPRoute) on loopback: bytes
exact both ways, a half-close passed on in both orders with the other direction still flowing,
backends chosen by weight, the idle timeout, a port without a route closed, Istio's TCP
metrics, and a meshed endpoint reached over HBONE."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import socketserver
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness import gateway as gw
from tests.harness.cli import MESHCTL

# Below the seed's 31400: the harness adds an offset of up to 45000 to every port.
SOLO, WEIGHTED, ROUTELESS = 9001, 9000, 9002


def _pattern(n: int, seed: int = 5) -> bytes:
    block = bytes((i * 13 + seed) % 256 for i in range(4096))
    return (block * (n // len(block) + 1))[:n]


def _until_eof(sock: socket.socket) -> bytes:
    data = bytearray()
    while chunk := sock.recv(65536):
        data += chunk
    return bytes(data)


class _Commands(socketserver.BaseRequestHandler):
    """A line names what to do: ``NAME`` (answer the backend's name), ``ANSWER-AFTER-EOF N``
    (read to the client's half-close, answer ``NAME SHA256`` of what came and N pattern bytes),
    ``CLOSE-FIRST N`` (send N pattern bytes, half-close, record what still comes), ``QUIET``."""

    def handle(self) -> None:
        server: Any = self.server
        sock: socket.socket = self.request
        head = b""
        while not head.endswith(b"\n"):
            byte = sock.recv(1)
            if not byte:
                return
            head += byte
        command, *args = head.decode().split()
        if command == "NAME":
            sock.sendall(f"{server.name}\n".encode())
        elif command == "ANSWER-AFTER-EOF":
            body = _until_eof(sock)
            sock.sendall(f"{server.name} {hashlib.sha256(body).hexdigest()}\n".encode())
            sock.sendall(_pattern(int(args[0])))
        elif command == "CLOSE-FIRST":
            sock.sendall(_pattern(int(args[0])))
            sock.shutdown(socket.SHUT_WR)
            server.after.append(_until_eof(sock))
        elif command == "QUIET":
            _until_eof(sock)


@dataclass
class TcpBackend:
    name: str
    port: int
    after: list[bytes]


@contextlib.contextmanager
def tcp_backend(name: str) -> Iterator[TcpBackend]:
    server: Any = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Commands)
    server.daemon_threads = True
    server.name, server.after = name, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield TcpBackend(name, server.server_address[1], server.after)
    finally:
        server.shutdown()
        server.server_close()


def tcp_listener(name: str, port: int) -> dict[str, Any]:
    return {
        "name": name,
        "port": port,
        "protocol": "TCP",
        "allowedRoutes": {"namespaces": {"from": "All"}},
    }


def tcp_route(name: str, section: str, *weighted: tuple[str, int]) -> dict[str, Any]:
    refs = [{"name": backend, "port": 7000, "weight": weight} for backend, weight in weighted]
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "TCPRoute",
        "metadata": {"name": name, "namespace": "app", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": {
            "parentRefs": [{"name": "gw", "namespace": "infra", "sectionName": section}],
            "rules": [{"backendRefs": refs}],
        },
    }


@pytest.fixture
def running(tmp_path: Path) -> Iterator[gw.Running]:
    with contextlib.ExitStack() as stack:
        backends = [stack.enter_context(tcp_backend(n)) for n in ("solo", "three", "one", "zero")]
        objects: list[dict[str, Any]] = [
            gw.gateway_class(),
            gw.gateway(
                tcp_listener("solo", SOLO),
                tcp_listener("weighted", WEIGHTED),
                tcp_listener("routeless", ROUTELESS),
            ),
            tcp_route("solo", "solo", ("solo", 1)),
            tcp_route("weighted", "weighted", ("three", 3), ("one", 1), ("zero", 0)),
        ]
        for backend in backends:
            objects.append(gw.service(backend.name, ports=(7000,)))
            objects.append(
                gw.endpoint_slice(
                    backend.name, [("127.0.0.1", True)], backend.port, service_port=7000
                )
            )
        proc = stack.enter_context(
            gw.run_gateway(
                tmp_path,
                objects,
                listener_ports=(SOLO, WEIGHTED, ROUTELESS),
                args=("--idle-timeout", "1s"),
            )
        )
        proc.backends = {b.name: b for b in backends}  # type: ignore[attr-defined]
        yield proc


def _connect(proc: gw.Running, port: int = SOLO) -> socket.socket:
    return socket.create_connection(("127.0.0.1", proc.port(port)), timeout=10)


def test_bytes_are_exact_both_ways_and_the_clients_half_close_reaches_the_backend(running):
    size = 8 * 1024 * 1024
    payload = _pattern(size, seed=77)
    with _connect(running) as sock:
        sock.sendall(f"ANSWER-AFTER-EOF {size}\n".encode() + payload)
        sock.shutdown(socket.SHUT_WR)  # the backend answers only once this reaches it
        answer = _until_eof(sock)
    head, _, body = answer.partition(b"\n")
    assert head.decode() == f"solo {hashlib.sha256(payload).hexdigest()}"
    assert body == _pattern(size)


def test_the_backends_half_close_reaches_the_client_which_can_still_send(running):
    solo = running.backends["solo"]
    with _connect(running) as sock:
        sock.sendall(b"CLOSE-FIRST 100000\n")
        assert _until_eof(sock) == _pattern(100000)  # the backend's FIN passed on
        sock.sendall(b"sent after the backend's half-close")
        sock.shutdown(socket.SHUT_WR)
        assert _until_eof(sock) == b""  # both ends done: the gateway closes
    deadline = time.monotonic() + 5
    while not solo.after:
        assert time.monotonic() < deadline
        time.sleep(0.02)
    assert solo.after == [b"sent after the backend's half-close"]


def test_connections_spread_over_backends_by_weight_and_weight_zero_gets_none(running):
    seen: Counter[str] = Counter()
    for _ in range(200):
        with _connect(running, WEIGHTED) as sock:
            sock.sendall(b"NAME\n")
            seen[_until_eof(sock).decode().strip()] += 1
    assert seen["zero"] == 0
    assert seen["three"] + seen["one"] == 200
    assert 120 <= seen["three"] <= 180, seen  # 3:1 expects 150 (sd ~6)


def test_a_connection_quiet_both_ways_is_closed_at_the_idle_timeout(running):
    with _connect(running) as sock:
        sock.sendall(b"QUIET\n")
        began = time.monotonic()
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(100) == b""
        waited = time.monotonic() - began
    assert 0.8 < waited < 5, waited
    running.wait_log('reason="idle for 1s"')


def test_a_connection_that_keeps_moving_outlives_the_idle_timeout(running):
    with _connect(running) as sock:
        sock.sendall(b"ANSWER-AFTER-EOF 10\n")
        sent = b""
        for i in range(8):  # 2.4 s in all, never 1 s quiet
            time.sleep(0.3)
            sock.sendall(b"%d" % i)
            sent += b"%d" % i
        sock.shutdown(socket.SHUT_WR)
        head, _, body = _until_eof(sock).partition(b"\n")
    assert head.decode() == f"solo {hashlib.sha256(sent).hexdigest()}"
    assert body == _pattern(10)


def test_a_port_without_a_route_closes_the_connection(running):
    with _connect(running, ROUTELESS) as sock:
        sock.sendall(b"NAME\n")
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(100) == b""
    running.wait_log('reason="no-route (no TCPRoute attached)"')


def test_istio_tcp_metrics_count_the_connection_and_its_bytes_each_way(running):
    with _connect(running) as sock:
        sock.sendall(b"ANSWER-AFTER-EOF 1000\nabc")
        sock.shutdown(socket.SHUT_WR)
        answer = _until_eof(sock)
    solo = {"destination_service_name": "solo", "request_protocol": "tcp", "reporter": "source"}
    deadline = time.monotonic() + 5
    while gw.metric(running, "istio_tcp_connections_closed_total", **solo) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert gw.metric(running, "istio_tcp_connections_opened_total", **solo) == 1
    sent = len("ANSWER-AFTER-EOF 1000\nabc")
    assert gw.metric(running, "istio_tcp_received_bytes_total", **solo) == sent
    assert gw.metric(running, "istio_tcp_sent_bytes_total", **solo) == len(answer)
    service = "solo.app.svc.cluster.local"
    assert gw.metric(running, "istio_tcp_sent_bytes_total", destination_service=service) > 1000


def _mesh_certs(tmp: Path, workload: str, name: str) -> Path:
    out = tmp / name
    args = ["certs", "--out", str(out), "--workload", workload, "--ca-dir", str(tmp / "ca")]
    subprocess.run(
        [*MESHCTL, "ztunnel", *args],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out


def test_a_meshed_endpoint_is_reached_over_hbone_and_its_close_reaches_the_client(tmp_path):
    gateway_certs = _mesh_certs(tmp_path, "infra/gw/gw-sa", "gateway")
    peer_certs = _mesh_certs(tmp_path, "app/db-0/db", "db")
    with tcp_backend("db") as backend, gw.hbone_peer(peer_certs, backend.port) as peer:
        slice_ = gw.endpoint_slice("db", [(peer.address, True)], 5432, service_port=7000)
        slice_["endpoints"][0]["targetRef"] = {"kind": "Pod", "name": "db-0", "namespace": "app"}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "db-0",
                "namespace": "app",
                "labels": {"istio.io/dataplane-mode": "ambient"},
            },
            "spec": {"serviceAccountName": "db"},
        }
        objects = [
            gw.gateway_class(),
            gw.gateway(tcp_listener("tcp", SOLO)),
            tcp_route("db", "tcp", ("db", 1)),
            gw.service("db", ports=(7000,)),
            slice_,
            pod,
        ]
        env = {
            "POD_NAMESPACE": "infra",
            "SERVICE_ACCOUNT": "gw-sa",
            "MESHCTL_CERT_DIR": str(gateway_certs),
        }
        with gw.run_gateway(tmp_path, objects, listener_ports=(SOLO,), env=env) as proc:
            with _connect(proc) as sock:
                sock.sendall(b"CLOSE-FIRST 300000\n")
                # the backend's close: END_STREAM from the peer, a FIN from the gateway
                assert _until_eof(sock) == _pattern(300000)
            proc.wait_log("identity=spiffe://cluster.local/ns/app/sa/db")
    assert peer.seen[0] == {
        "authority": f"{peer.address}:5432",
        "san": ["spiffe://cluster.local/ns/infra/sa/gw-sa"],
    }
