"""The programs inside the test images, built as packaging/image/build.py builds them (cached).

``meshtest`` (testapp image) serves HTTP/1.1, h2c, TCP and gRPC health on loopback: checked with
independent peers (Python's http.client, the h2 library speaking gRPC by hand, raw sockets) and
with its own clients. ``pause`` runs as PID 1 of a fresh PID namespace: it reaps an orphan and
exits 0 on SIGTERM. Needs Go and gcc -static (``packaging`` marker: no silent skip in CI).
"""

from __future__ import annotations

import contextlib
import hashlib
import http.client
import importlib.util
import json
import os
import secrets
import signal
import socket
import struct
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import h2.config
import h2.connection
import h2.events
import pytest

from tests.harness.kube import free_port
from tests.harness.wait import eventually

pytestmark = pytest.mark.packaging
IMAGE_DIR = Path(__file__).resolve().parents[2] / "packaging" / "image"


def builder() -> ModuleType:
    name = "meshctl_image_build"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, IMAGE_DIR / "build.py")
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[name] = module
        spec.loader.exec_module(module)
    return sys.modules[name]


def program(name: str) -> Path:
    build = builder()
    try:
        return build.testapp_program() if name == "meshtest" else build.pause_program()
    except build.BuildError as exc:
        pytest.skip(str(exc))


@pytest.fixture(scope="module")
def server() -> Iterator[tuple[Path, dict[str, int]]]:
    meshtest = program("meshtest")
    ports = {"http": free_port(), "tcp": free_port(), "grpc": free_port()}
    proc = subprocess.Popen(
        [
            str(meshtest), "serve", "--name", "t1", "--grpc-service", "shop",
            "--http", f"127.0.0.1:{ports['http']}", "--tcp", f"127.0.0.1:{ports['tcp']}",
            "--grpc", f"127.0.0.1:{ports['grpc']}",
        ],
        stdout=subprocess.PIPE,
        text=True,
    )  # fmt: skip

    def listening() -> bool:
        with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", ports["grpc"])):
            return True
        return False

    try:
        eventually("meshtest listening", listening, 10)
        yield meshtest, ports
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(10) == 0  # SIGTERM: a clean exit
        log = proc.stdout.read() if proc.stdout else ""
        assert "http HTTP/1.1 POST /echo?q=1 from 127.0.0.1:" in log
        assert "terminated: shutting down" in log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def client(meshtest: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(meshtest), *args], capture_output=True, text=True, timeout=30, check=False
    )


def test_http_echo_answers_an_independent_http11_client(server):
    _, ports = server
    conn = http.client.HTTPConnection("127.0.0.1", ports["http"], timeout=5)
    conn.request("POST", "/echo?q=1", body=b"abc", headers={"X-Test": "yes", "Host": "shop.local"})
    response = conn.getresponse()
    reply = json.loads(response.read())
    conn.close()
    assert response.status == 200
    assert reply["name"] == "t1"
    assert (reply["method"], reply["path"], reply["query"]) == ("POST", "/echo", "q=1")
    assert reply["host"] == "shop.local"
    assert reply["headers"]["X-Test"] == "yes"
    assert reply["body_bytes"] == 3
    assert reply["proto"] == "HTTP/1.1"
    assert reply["local"] == f"127.0.0.1:{ports['http']}"


def test_the_http_client_reports_status_and_speaks_h2c(server):
    meshtest, ports = server
    url = f"http://127.0.0.1:{ports['http']}"
    ok = client(meshtest, "http", "-H", "Host: a.b", f"{url}/x")
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["host"] == "a.b"
    failed = client(meshtest, "http", f"{url}/status/503")
    assert failed.returncode == 1
    assert json.loads(failed.stdout)["status"] == 503
    assert "503" in failed.stderr
    h2c = client(meshtest, "http", "--h2c", f"{url}/y")
    assert json.loads(h2c.stdout)["proto"] == "HTTP/2.0"
    refused = client(meshtest, "http", "--timeout", "2s", f"http://127.0.0.1:{free_port()}/")
    assert refused.returncode == 1
    assert "connection refused" in refused.stderr
    assert client(meshtest, "http").returncode == 2  # usage


def test_tcp_echo_returns_every_byte(server):
    meshtest, ports = server
    payload = secrets.token_bytes(1_000_000)
    with socket.create_connection(("127.0.0.1", ports["tcp"]), timeout=10) as sock:
        sock.sendall(payload)
        sock.shutdown(socket.SHUT_WR)
        received = b"".join(iter(lambda: sock.recv(65536), b""))
    assert hashlib.sha256(received).digest() == hashlib.sha256(payload).digest()
    echoed = client(meshtest, "tcp", "--send", "ping\n", f"127.0.0.1:{ports['tcp']}")
    assert (echoed.returncode, echoed.stdout) == (0, "ping\n")


def grpc_check(port: int, service: str) -> tuple[dict[str, str], bytes]:
    """One unary grpc.health.v1.Health/Check with the h2 library: (trailers, response message)."""
    request = b"" if not service else b"\x0a" + bytes([len(service)]) + service.encode()
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
        conn.send_headers(
            1,
            [
                (":method", "POST"), (":scheme", "http"), (":path", "/grpc.health.v1.Health/Check"),
                (":authority", f"127.0.0.1:{port}"), ("content-type", "application/grpc"),
                ("te", "trailers"),
            ],
        )  # fmt: skip
        conn.send_data(1, b"\0" + struct.pack(">I", len(request)) + request, end_stream=True)
        sock.sendall(conn.data_to_send())
        headers: dict[str, str] = {}
        body = b""
        while True:
            data = sock.recv(65536)
            assert data, "connection closed before the stream ended"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                    headers.update({k.decode(): v.decode() for k, v in event.headers})
                elif isinstance(event, h2.events.DataReceived):
                    body += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, 1)
                elif isinstance(event, h2.events.StreamEnded):
                    return headers, body[5:]
            sock.sendall(conn.data_to_send())


def test_grpc_health_answers_an_independent_h2_client_and_its_own(server):
    meshtest, ports = server
    headers, message = grpc_check(ports["grpc"], "")
    assert headers[":status"] == "200"
    assert headers["grpc-status"] == "0"
    assert message == b"\x08\x01"  # status: SERVING
    headers, _ = grpc_check(ports["grpc"], "nope")
    assert headers["grpc-status"] == "5"  # NOT_FOUND
    addr = f"127.0.0.1:{ports['grpc']}"
    assert client(meshtest, "grpc-health", "--service", "shop", addr).stdout == "SERVING\n"
    missing = client(meshtest, "grpc-health", "--service", "nope", addr)
    assert missing.returncode == 1
    assert "grpc-status 5" in missing.stderr


def test_health_can_be_turned_off_and_on(server):
    meshtest, ports = server
    url = f"http://127.0.0.1:{ports['http']}/healthz"
    addr = f"127.0.0.1:{ports['grpc']}"
    try:
        assert client(meshtest, "http", "-X", "POST", f"{url}?healthy=false").returncode == 1
        assert client(meshtest, "http", url).returncode == 1
        down = client(meshtest, "grpc-health", addr)
        assert (down.returncode, down.stdout) == (1, "NOT_SERVING\n")
    finally:
        client(meshtest, "http", "-X", "POST", f"{url}?healthy=true")
    assert client(meshtest, "grpc-health", addr).returncode == 0


def _children(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def test_pause_as_pid_1_reaps_orphans_and_exits_0_on_sigterm():
    pause = program("pause")
    if os.geteuid() != 0:
        pytest.skip("a new PID namespace needs root here")
    outer = subprocess.Popen(["unshare", "--pid", "--fork", str(pause)])
    try:
        eventually("pause started", lambda: bool(_children(outer.pid)), 10)
        (pid,) = _children(outer.pid)
        # sh starts in pause's PID namespace, leaves a child behind and exits: the orphan is
        # re-parented to PID 1, which must reap it when it exits.
        subprocess.run(
            ["nsenter", "--target", str(pid), "--pid", "--", "sh", "-c", "sleep 0.3 & exit 0"],
            check=True,
            timeout=10,
        )
        eventually("orphan adopted", lambda: bool(_children(pid)), 5)
        time.sleep(0.6)
        assert _children(pid) == []  # exited and reaped: no zombie left
        os.kill(pid, signal.SIGTERM)
        assert outer.wait(10) == 0
    finally:
        if outer.poll() is None:
            outer.kill()
            outer.wait(10)
