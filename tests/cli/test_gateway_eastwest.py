"""``meshctl gateway`` with an east-west port (Istio's 15443, AUTO_PASSTHROUGH) on loopback:
``explain`` says where an ``outbound_.`` name goes or why nowhere, ``routes`` marks the listener,
and a running gateway whose reloaded files turn the port east-west forwards by the SNI at once,
still encrypted (the client sees the backend's own certificate)."""

from __future__ import annotations

import contextlib
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import gateway as gw
from tests.harness.cli import run_meshctl

SNI = "outbound_.8080_._.web.app.svc.cluster.local"


def _objects(backend_port: int, *, east_west: bool = True) -> list[dict[str, Any]]:
    listener = {"name": "cross-network", "port": 15443, "protocol": "TLS"}
    listener["tls"] = {"mode": "Passthrough"}
    gateway = gw.gateway(listener)
    if east_west:
        gateway["metadata"]["labels"] = {"topology.istio.io/network": "network-1"}
    return [
        gw.gateway_class(),
        gateway,
        gw.service("web", ports=(8080,)),
        gw.endpoint_slice("web", [("127.0.0.1", True)], backend_port, service_port=8080),
    ]


def _explain(config: Path, url: str) -> dict[str, Any]:
    done = run_meshctl("gateway", "explain", url, "-f", str(config), "-o", "json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def test_explain_says_where_an_outbound_name_goes_or_why_nowhere(tmp_path):
    config = tmp_path / "objects.yaml"
    gw.write_objects(config, _objects(9001))
    found = _explain(config, f"tls://{SNI}:15443")
    assert found["outcome"] == "forward"
    assert found["service"] == "app/web:8080"
    assert found["endpoints"] == ["127.0.0.1:9001"]
    assert "connection" not in found
    wrong_port = _explain(config, "tls://outbound_.81_._.web.app.svc.cluster.local:15443")
    assert wrong_port["outcome"] == "unknown-port"
    assert "has no port 81 (ports: 8080)" in wrong_port["reason"]
    assert wrong_port["connection"] == "closed"
    plain = _explain(config, "tls://web.app.svc.cluster.local:15443")
    assert plain["outcome"] == "bad-sni"


def test_routes_marks_the_east_west_listener(tmp_path):
    config = tmp_path / "objects.yaml"
    gw.write_objects(config, _objects(9001))
    done = run_meshctl("gateway", "routes", "-f", str(config), "-o", "json")
    assert done.returncode == 0, done.stderr
    (port,) = json.loads(done.stdout)["ports"]
    assert port["port"] == 15443
    assert port["listeners"][0]["tlsMode"] == "AUTO_PASSTHROUGH"


@contextlib.contextmanager
def _tls_backend(tmp: Path) -> Iterator[tuple[int, bytes]]:
    """A TLS server with its own certificate: answers ``ok <line>``; yields (port, cert DER)."""
    chain, key = gw.server_cert("web.app.svc.cluster.local", label="web")
    (tmp / "web.crt").write_bytes(chain)
    (tmp / "web.key").write_bytes(key)
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(tmp / "web.crt", tmp / "web.key")
    listener = socket.create_server(("127.0.0.1", 0))

    def serve() -> None:
        while True:
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with contextlib.suppress(OSError), context.wrap_socket(conn, server_side=True) as tls:
                tls.settimeout(10)
                line = tls.recv(1024)
                tls.sendall(b"ok " + line)

    threading.Thread(target=serve, daemon=True).start()
    try:
        yield listener.getsockname()[1], ssl.PEM_cert_to_DER_cert(chain.decode())
    finally:
        listener.close()


def _call(port: int, sni: str = SNI) -> tuple[bytes, bytes]:
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE  # the test compares the certificate itself
    with (
        socket.create_connection(("127.0.0.1", port), timeout=10) as sock,
        context.wrap_socket(sock, server_hostname=sni) as tls,
    ):
        tls.sendall(b"hello\n")
        return tls.recv(1024), tls.getpeercert(binary_form=True) or b""


def test_a_reload_that_makes_the_port_east_west_forwards_by_the_sni_without_a_restart(tmp_path):
    with _tls_backend(tmp_path) as (backend_port, backend_der):
        objects = _objects(backend_port, east_west=False)
        with gw.run_gateway(tmp_path, objects, listener_ports=(15443,)) as running:
            with pytest.raises((ssl.SSLError, OSError)):  # a TLS port with no TLSRoute: closed
                _call(running.port(15443))
            gw.write_objects(running.config, _objects(backend_port))
            deadline = time.monotonic() + 10  # the files are read again every 100ms
            while True:
                try:
                    answer, der = _call(running.port(15443))
                    break
                except (ssl.SSLError, OSError):
                    assert time.monotonic() < deadline, running.output()
                    time.sleep(0.1)
            log = running.wait_log("auto-passthrough app/web:8080")
    assert answer == b"ok hello\n"
    assert der == backend_der  # the backend's own certificate: the gateway never terminated
    assert f"sni={SNI}" in log


def test_a_port_with_nothing_ready_or_nothing_answering_is_closed_and_counted(tmp_path):
    idle = gw.endpoint_slice("idle", [("127.0.0.1", False)], 9, service_port=8080)
    with socket.socket() as probe:  # a port nothing listens on: the connect is refused
        probe.bind(("127.0.0.1", 0))
        closed_port = probe.getsockname()[1]
    gone = gw.endpoint_slice("gone", [("127.0.0.1", True)], closed_port, service_port=8080)
    objects = [
        *_objects(9),
        gw.service("idle", ports=(8080,)),
        gw.service("gone", ports=(8080,)),
        idle,
        gone,
    ]
    with gw.run_gateway(tmp_path, objects, listener_ports=(15443,)) as running:
        for service in ("idle", "gone"):
            with pytest.raises((ssl.SSLError, OSError)):
                _call(running.port(15443), f"outbound_.8080_._.{service}.app.svc.cluster.local")
        log = running.wait_log("no-healthy-upstream")
        failed = gw.metric(
            running, "istio_tcp_connections_closed_total", destination_service_name="gone"
        )
    idle_line = next(line for line in log.splitlines() if "sni=outbound_.8080_._.idle." in line)
    assert "flags=UH" in idle_line
    assert 'reason="no-endpoint (app/idle:8080 has no ready endpoint)"' in idle_line
    gone_line = next(line for line in log.splitlines() if "sni=outbound_.8080_._.gone." in line)
    assert "flags=UF" in gone_line
    assert failed == 1
