"""Issue 26's acceptance for TLS passthrough, through a real ``meshctl gateway run -f`` process:
10 MiB each way at once byte-exact; a hundred concurrent connections, each with its own SNI,
each reaching its own backend; the client seeing the backend's own certificate (the gateway
has none); the client's ALPN reaching the backend and the backend's choice reaching the client.
"""

from __future__ import annotations

import contextlib
import hashlib
import selectors
import socket
import ssl
import threading
import time
from collections.abc import Iterator

import pytest

from tests.cli.tls_backends import (
    ALPN,
    TlsBackend,
    client_context,
    gateway_objects,
    pattern,
    tls_backends,
)
from tests.harness import gateway as gw

NAMES = [f"svc{i:03d}.passthrough.test" for i in range(100)]


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[gw.Running, dict]]:
    tmp = tmp_path_factory.mktemp("passthrough")
    with (
        tls_backends(NAMES, tmp) as backends,
        gw.run_gateway(tmp, gateway_objects(backends), listener_ports=(443,)) as proc,
    ):
        yield proc, backends


def _connect(proc: gw.Running, backend: TlsBackend, alpn: tuple[str, ...] = ()) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", proc.port(443)), timeout=30)
    return client_context(backend, alpn).wrap_socket(raw, server_hostname=backend.name)


def _exchange(tls: ssl.SSLSocket, up: int, down: int) -> tuple[str, str, bytes]:
    """Sends UP bytes while reading DOWN (both ways at once); (name, alpn, what came down) after
    checking the backend's digest of what went up."""
    payload = pattern(up, seed=99)
    tls.sendall(f"{up} {down}\n".encode())
    received = _both_ways(tls, memoryview(payload), down)
    data, trailer = received[:down], received[down:]
    assert trailer.endswith(b"\n"), f"closed before the trailer: {trailer!r}"
    name, alpn, digest = trailer.decode().split()
    assert digest == hashlib.sha256(payload).hexdigest()  # every byte up, exactly
    return name, alpn, bytes(data)


def _both_ways(tls: ssl.SSLSocket, out: memoryview, down: int, timeout: float = 60) -> bytearray:
    """Writes ``out`` while reading until ``down`` bytes and a trailer line came back, in one
    thread (one SSL object must never be read and written from two threads at once)."""
    tls.setblocking(False)
    data = bytearray()
    deadline = time.monotonic() + timeout
    with selectors.DefaultSelector() as selector:
        selector.register(tls, selectors.EVENT_READ | selectors.EVENT_WRITE)
        while not (len(data) > down and data.endswith(b"\n")):
            left = deadline - time.monotonic()
            assert left > 0, f"not done in {timeout}s: {len(data)} of {down} bytes down"
            selector.modify(tls, selectors.EVENT_READ | (selectors.EVENT_WRITE if out else 0))
            if tls.pending() == 0:
                selector.select(left)
            if out:
                with contextlib.suppress(ssl.SSLWantWriteError, ssl.SSLWantReadError):
                    out = out[tls.send(out[:65536]) :]
            with contextlib.suppress(ssl.SSLWantReadError, ssl.SSLWantWriteError):
                chunk = tls.recv(65536)
                assert chunk, f"closed after {len(data)} of {down} bytes"
                data += chunk
    tls.setblocking(True)
    return data


def test_ten_mib_each_way_at_once_arrives_byte_exact(running):
    proc, backends = running
    backend = backends[NAMES[0]]
    size = 10 * 1024 * 1024
    with _connect(proc, backend) as tls:
        name, _, data = _exchange(tls, up=size, down=size)
    assert name == backend.name
    assert hashlib.sha256(data).digest() == hashlib.sha256(pattern(size, len(name))).digest()
    assert size in backend.seen


def test_a_hundred_concurrent_connections_each_reach_the_backend_of_their_sni(running):
    proc, backends = running
    together = threading.Barrier(len(NAMES), timeout=60)
    answers: dict[str, tuple[str, bytes]] = {}
    errors: list[str] = []

    def one(name: str) -> None:
        backend = backends[name]
        try:
            with _connect(proc, backend) as tls:
                together.wait()  # all hundred handshakes done and open at once
                got, _, data = _exchange(tls, up=4096 + len(answers), down=20000)
                answers[name] = (got, data)
        except Exception as exc:  # noqa: BLE001 (reported below, per name)
            errors.append(f"{name}: {exc!r}")
            together.abort()

    threads = [threading.Thread(target=one, args=(name,)) for name in NAMES]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(120)
    assert errors == []
    assert sorted(answers) == sorted(NAMES)
    for name, (got, data) in answers.items():
        assert got == name
        assert data == pattern(20000, seed=len(name))


def test_the_client_sees_the_backends_own_certificate(running):
    proc, backends = running
    for name in (NAMES[1], NAMES[2]):
        with _connect(proc, backends[name]) as tls:
            assert tls.getpeercert(binary_form=True) == backends[name].der
            assert _exchange(tls, 10, 10)[0] == name
    # Trusting another backend's certificate only, the handshake fails: no certificate of the
    # gateway's (it has none) or of another name's backend stands in.
    raw = socket.create_connection(("127.0.0.1", proc.port(443)), timeout=10)
    wrong = client_context(backends[NAMES[4]])
    with pytest.raises(ssl.SSLCertVerificationError):
        wrong.wrap_socket(raw, server_hostname=NAMES[3])
    raw.close()


def test_the_clients_alpn_reaches_the_backend_and_its_choice_the_client(running):
    proc, backends = running
    backend = backends[NAMES[5]]
    offered = ("h2", ALPN[0])  # the backend speaks ALPN[0] and not h2: its choice, not ours
    with _connect(proc, backend, alpn=offered) as tls:
        assert tls.selected_alpn_protocol() == ALPN[0]
        name, backend_alpn, _ = _exchange(tls, 10, 10)
    assert (name, backend_alpn) == (backend.name, ALPN[0])
    proc.wait_log(f"sni={backend.name} alpn=h2,{ALPN[0]} ")
