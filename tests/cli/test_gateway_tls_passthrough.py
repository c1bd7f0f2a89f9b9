"""``meshctl gateway run -f`` TLS passthrough listeners on loopback: real TLS backends (Python
``ssl`` servers with their own certificates) reached through the gateway by SNI, the client
verifying the backend's certificate end to end; bytes exact both ways; wildcard and no-SNI
routes; an unknown name closed without an alert; a slow hello bounded by the header
timeout."""

from __future__ import annotations

import contextlib
import hashlib
import socket
import socketserver
import ssl
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.harness import gateway as gw


def _pattern(n: int, seed: int) -> bytes:
    block = bytes((i * 7 + seed) % 256 for i in range(4096))
    return (block * (n // len(block) + 1))[:n]


class _Exchange(socketserver.BaseRequestHandler):
    """One TLS connection: reads ``UP DOWN\\n`` and UP bytes, answers ``NAME SHA256\\n`` (of what
    it read) and DOWN bytes of a pattern, then closes."""

    def handle(self) -> None:
        server: Any = self.server
        with server.context.wrap_socket(self.request, server_side=True) as tls:
            head = b""
            while not head.endswith(b"\n"):
                byte = tls.recv(1)
                if not byte:
                    return
                head += byte
            up, down = (int(x) for x in head.split())
            digest = hashlib.sha256()
            left = up
            while left:
                chunk = tls.recv(min(left, 65536))
                if not chunk:
                    return
                digest.update(chunk)
                left -= len(chunk)
            server.served.append(up)
            tls.sendall(f"{server.name} {digest.hexdigest()}\n".encode())
            tls.sendall(_pattern(down, seed=len(server.name)))


@dataclass
class TlsBackend:
    name: str
    port: int
    cert: bytes
    served: list[int]


@contextlib.contextmanager
def tls_backend(name: str, *hostnames: str, tmp: Path) -> Iterator[TlsBackend]:
    chain, key = gw.server_cert(*hostnames, label=name)
    (tmp / f"{name}.crt").write_bytes(chain)
    (tmp / f"{name}.key").write_bytes(key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / f"{name}.crt", tmp / f"{name}.key")
    server: Any = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _Exchange)
    server.daemon_threads = True
    server.context, server.name, server.served = context, name, []
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield TlsBackend(name, server.server_address[1], chain, server.served)
    finally:
        server.shutdown()
        server.server_close()


def tls_route(
    name: str, backend: str, hostnames: tuple[str, ...] = (), section: str = "tls"
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parentRefs": [{"name": "gw", "namespace": "infra", "sectionName": section}],
        "rules": [{"backendRefs": [{"name": backend, "port": 443}]}],
    }
    if hostnames:
        spec["hostnames"] = list(hostnames)
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "TLSRoute",
        "metadata": {"name": name, "namespace": "app", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec,
    }


def passthrough_listener(name: str, port: int) -> dict[str, Any]:
    return {
        "name": name,
        "port": port,
        "protocol": "TLS",
        "tls": {"mode": "Passthrough"},
        "allowedRoutes": {"namespaces": {"from": "All"}},
    }


def _backend_objects(backend: TlsBackend) -> list[dict[str, Any]]:
    return [
        gw.service(backend.name, ports=(443,)),
        gw.endpoint_slice(backend.name, [("127.0.0.1", True)], backend.port, service_port=443),
    ]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[gw.Running, dict[str, TlsBackend]]]:
    with contextlib.ExitStack() as stack:
        backends = {
            "a": stack.enter_context(tls_backend("a", "a.example.com", tmp=tmp_path)),
            "b": stack.enter_context(tls_backend("b", "b.example.com", tmp=tmp_path)),
            "w": stack.enter_context(
                tls_backend("w", "*.wild.test", "*.er.wild.test", tmp=tmp_path)
            ),
            "d": stack.enter_context(tls_backend("d", "default.test", tmp=tmp_path)),
        }
        objects = [
            gw.gateway_class(),
            gw.gateway(passthrough_listener("tls", 443), passthrough_listener("any", 8443)),
            tls_route("a", "a", ("a.example.com",)),
            tls_route("b", "b", ("b.example.com",)),
            tls_route("w", "w", ("*.wild.test",)),
            tls_route("d", "d", section="any"),
        ]
        for backend in backends.values():
            objects += _backend_objects(backend)
        proc = stack.enter_context(
            gw.run_gateway(
                tmp_path,
                objects,
                listener_ports=(443, 8443),
                env={"MESHCTL_HEADER_TIMEOUT": "1s"},
            )
        )
        yield proc, backends


def _client(backend: TlsBackend) -> ssl.SSLContext:
    """Trusts only ``backend``'s own certificate: a handshake that completes was with it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cadata=backend.cert.decode())
    return ctx


def _exchange(
    proc: gw.Running,
    backend: TlsBackend,
    sni: str | None,
    *,
    up: int = 1000,
    down: int = 1000,
    port: int = 443,
) -> tuple[str, bytes]:
    """(backend name, what it answered) after sending ``up`` bytes through the gateway."""
    ctx = _client(backend)
    if sni is None:
        ctx.check_hostname = False  # no name to check; the certificate is still verified
    raw = socket.create_connection(("127.0.0.1", proc.port(port)), timeout=10)
    with ctx.wrap_socket(raw, server_hostname=sni) as tls:
        payload = _pattern(up, seed=99)
        tls.sendall(f"{up} {down}\n".encode() + payload)
        answer = b""
        while not answer.endswith(b"\n"):
            answer += tls.recv(1)
        name, digest = answer.decode().split()
        assert digest == hashlib.sha256(payload).hexdigest()  # every byte up, exactly
        data = bytearray()
        while len(data) < down:
            chunk = tls.recv(65536)
            assert chunk, f"closed after {len(data)} of {down} bytes"
            data += chunk
        return name, bytes(data)


def test_two_hostnames_reach_two_backends_each_with_its_own_certificate(running):
    proc, backends = running
    name, data = _exchange(proc, backends["a"], "a.example.com")
    assert name == "a"
    assert data == _pattern(1000, seed=1)
    name, _ = _exchange(proc, backends["b"], "b.example.com")
    assert name == "b"


def test_a_large_transfer_is_byte_exact_both_ways(running):
    proc, backends = running
    size = 8 * 1024 * 1024
    name, data = _exchange(proc, backends["a"], "a.example.com", up=size, down=size)
    assert name == "a"
    assert data == _pattern(size, seed=1)
    assert backends["a"].served[-1] == size
    to_a = {"destination_service_name": "a", "response_flags": "-"}
    deadline = time.monotonic() + 5
    while gw.metric(proc, "istio_tcp_connections_closed_total", **to_a) < 1:
        assert time.monotonic() < deadline
        time.sleep(0.05)
    assert gw.metric(proc, "istio_tcp_received_bytes_total", **to_a) > size  # TLS records


def test_a_wildcard_route_takes_any_name_under_it(running):
    proc, backends = running
    assert _exchange(proc, backends["w"], "x.wild.test")[0] == "w"
    assert _exchange(proc, backends["w"], "deep.er.wild.test")[0] == "w"


def test_a_connection_without_sni_takes_the_route_that_names_no_hostname(running):
    proc, backends = running
    assert _exchange(proc, backends["d"], None, port=8443)[0] == "d"


def _handshake_closed(ctx: ssl.SSLContext, port: int, server_hostname: str | None) -> None:
    """The handshake ends by the gateway's close (a FIN or a reset), never by a TLS alert."""
    raw = socket.create_connection(("127.0.0.1", port), timeout=5)
    with (
        pytest.raises((ssl.SSLEOFError, ConnectionResetError, ssl.SSLZeroReturnError)),
        ctx.wrap_socket(raw, server_hostname=server_hostname),
    ):
        pass


def test_an_unknown_name_is_closed_without_an_alert(running):
    proc, backends = running
    _handshake_closed(_client(backends["a"]), proc.port(443), "c.example.com")
    proc.wait_log("sni=c.example.com")
    refused = {"response_flags": "NR", "request_protocol": "tcp"}
    assert gw.metric(proc, "istio_tcp_connections_opened_total", **refused) == 1
    assert gw.metric(proc, "istio_tcp_connections_closed_total", **refused) == 1
    assert 'reason="no-route (sni c.example.com: no route)"' in proc.output()
    assert _exchange(proc, backends["a"], "a.example.com")[0] == "a"  # others unaffected


def test_an_unknown_names_hello_gets_not_one_byte_back(running):
    proc, _ = running
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    hello_maker = ssl.create_default_context().wrap_bio(
        incoming, outgoing, server_hostname="nobody.example.com"
    )
    with contextlib.suppress(ssl.SSLWantReadError):
        hello_maker.do_handshake()
    hello = outgoing.read()
    with socket.create_connection(("127.0.0.1", proc.port(443)), timeout=5) as sock:
        sock.sendall(hello)
        answer = b""
        with contextlib.suppress(ConnectionResetError):  # closed: a FIN or a reset
            while chunk := sock.recv(100):
                answer += chunk
    assert answer == b""


def test_no_sni_where_every_route_names_a_hostname_is_closed_without_an_alert(running):
    proc, backends = running
    ctx = _client(backends["a"])
    ctx.check_hostname = False
    _handshake_closed(ctx, proc.port(443), None)


def test_bytes_that_are_not_tls_are_closed_without_an_alert(running):
    proc, _ = running
    with socket.create_connection(("127.0.0.1", proc.port(443)), timeout=5) as sock:
        sock.sendall(b"GET / HTTP/1.1\r\nhost: a.example.com\r\n\r\n")
        assert sock.recv(100) == b""
    proc.wait_log('reason="not-tls')


def test_a_slow_hello_is_dropped_at_the_header_timeout_and_others_go_on(running):
    proc, backends = running
    with socket.create_connection(("127.0.0.1", proc.port(443)), timeout=10) as slow:
        slow.sendall(b"\x16\x03\x01")  # the start of a record header, then nothing
        began = time.monotonic()
        assert _exchange(proc, backends["a"], "a.example.com")[0] == "a"
        with contextlib.suppress(ConnectionResetError):  # closed: a FIN or a reset
            assert slow.recv(100) == b""
        waited = time.monotonic() - began
    assert 0.5 < waited < 5, waited
    proc.wait_log('reason="hello-timeout (3 bytes in 1s)"')


def test_passthrough_listeners_are_served_by_workers_too(tmp_path: Path):
    with tls_backend("a", "a.example.com", tmp=tmp_path) as backend:
        objects = [
            gw.gateway_class(),
            gw.gateway(passthrough_listener("tls", 443)),
            tls_route("a", "a", ("a.example.com",)),
            *_backend_objects(backend),
        ]
        with gw.run_gateway(
            tmp_path, objects, listener_ports=(443,), args=("--workers", "2")
        ) as proc:
            for _ in range(4):
                name, data = _exchange(proc, backend, "a.example.com", up=70000, down=70000)
                assert (name, data) == ("a", _pattern(70000, seed=1))
