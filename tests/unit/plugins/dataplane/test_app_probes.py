"""The app-probe runner against real servers on loopback: HTTP(S), TCP and gRPC health.

The gRPC peer is grpcio's own server (C-core's HTTP/2), not ours, so the h2 client is checked
against an independent implementation. Every case asserts the answer the kubelet would get.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import json
import socket
import ssl
import threading
import time
from collections.abc import Iterator
from concurrent import futures
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import grpc
import pytest
from meshctl_plugins.dataplane.app_probes import AppProbes

from meshctl.core.k8s.appprobes import parse_probers
from meshctl.core.pki import certs
from meshctl.core.pki.identity import SpiffeId
from meshctl.proto import health_pb2


def plain_socket(ip: str, *, inbound: bool = False) -> socket.socket:
    family = socket.AF_INET6 if ":" in ip else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock


class App(http.server.BaseHTTPRequestHandler):
    """/ok 200, /fail 500, /slow sleeps, /hop redirects to /ok, /away redirects elsewhere,
    /loop redirects to itself, /echo answers 200 only with the probe's header."""

    seen: list[dict[str, str]] = []  # noqa: RUF012 -- shared by the test's server threads

    def do_GET(self) -> None:
        App.seen.append({k.lower(): v for k, v in self.headers.items()})
        code, location = {
            "/ok": (200, ""),
            "/fail": (500, ""),
            "/hop": (302, "/ok"),
            "/away": (302, "http://192.0.2.1/elsewhere"),
            "/loop": (302, "/loop"),
        }.get(self.path, (404, ""))
        if self.path == "/slow":
            time.sleep(2)
            code = 200
        if self.path == "/metrics":
            body = b"# EOF\napp_up 1\n# EOF\n"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
            return
        if self.path == "/echo":
            code = 200 if self.headers.get("X-Probe") == "yes" else 401
        self.send_response(code)
        if location:
            self.send_header("Location", location)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: Any) -> None:
        pass


@contextlib.contextmanager
def http_app(tls: ssl.SSLContext | None = None) -> Iterator[int]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), App)
    if tls is not None:
        server.socket = tls.wrap_socket(server.socket, server_side=True)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()


class Health(grpc.GenericRpcHandler):
    def __init__(self, statuses: dict[str, int]) -> None:
        self.statuses = statuses

    def service(self, handler_call_details: Any) -> Any:
        if handler_call_details.method != "/grpc.health.v1.Health/Check":
            return None

        def check(request: Any, context: Any) -> Any:
            if request.service not in self.statuses:
                context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
            return health_pb2.HealthCheckResponse(status=self.statuses[request.service])

        return grpc.unary_unary_rpc_method_handler(
            check,
            request_deserializer=health_pb2.HealthCheckRequest.FromString,
            response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
        )


@contextlib.contextmanager
def grpc_app(statuses: dict[str, int]) -> Iterator[int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((Health(statuses),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(0)


def probe(probers: dict[str, Any], path: str, **kw: Any) -> tuple[int, str]:
    runner = AppProbes(
        parse_probers(json.dumps(probers)), pod_ip="127.0.0.1", new_socket=plain_socket
    )
    status, _, body = asyncio.run(runner.handle("GET", path, kw.get("headers", {})))
    return status, body.decode()


P = "/app-health/app/readyz"


@pytest.mark.parametrize(
    ("path", "status"),
    [("/ok", 200), ("/fail", 503), ("/hop", 200), ("/away", 200), ("/loop", 503), ("/x", 503)],
)
def test_http_probe_maps_the_apps_answer(path: str, status: int):
    with http_app() as port:
        assert probe({P: {"httpGet": {"path": path, "port": port}}}, P)[0] == status


def test_http_probe_sends_the_probes_headers_and_the_kubelets_agent():
    App.seen.clear()
    with http_app() as port:
        headers = [{"name": "X-Probe", "value": "yes"}, {"name": "Host", "value": "app.local"}]
        spec = {P: {"httpGet": {"path": "/echo", "port": port, "httpHeaders": headers}}}
        assert probe(spec, P, headers={"user-agent": "kube-probe/1.33"})[0] == 200
    assert App.seen[-1]["host"] == "app.local"
    assert App.seen[-1]["user-agent"] == "kube-probe/1.33"


def test_http_probe_times_out_with_the_probes_own_timeout():
    with http_app() as port:
        started = time.monotonic()
        spec = {P: {"httpGet": {"path": "/slow", "port": port}, "timeoutSeconds": 1}}
        status, body = probe(spec, P)
        assert status == 503
        assert "within 1s" in body
        assert time.monotonic() - started < 1.8


def test_https_probe_does_not_verify_the_certificate(tmp_path: Path):
    now = datetime.now(UTC)
    root = certs.mint_root(trust_domain="cluster.local", now=now, ttl=timedelta(days=1))
    leaf = certs.mint_workload(
        root, SpiffeId("cluster.local", "ns", "sa"), now=now, ttl=timedelta(hours=1)
    )
    (tmp_path / "c.pem").write_bytes(leaf.cert_pem)
    (tmp_path / "k.pem").write_bytes(leaf.key_pem)
    tls = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    tls.load_cert_chain(tmp_path / "c.pem", tmp_path / "k.pem")
    with http_app(tls) as port:
        spec = {P: {"httpGet": {"path": "/ok", "port": port, "scheme": "HTTPS"}}}
        assert probe(spec, P)[0] == 200


def test_tcp_probe_passes_while_listening_and_fails_once_closed():
    listener = socket.create_server(("127.0.0.1", 0))
    port = listener.getsockname()[1]
    spec = {P: {"tcpSocket": {"port": port}}}
    assert probe(spec, P)[0] == 200
    listener.close()
    status, body = probe(spec, P)
    assert (status, body) == (503, "connection refused\n")


@pytest.mark.parametrize(
    ("service", "status"),
    [("", 200), ("down", 503), ("missing", 503)],
)
def test_grpc_probe_checks_health_with_an_independent_server(service: str, status: int):
    serving = health_pb2.HealthCheckResponse.SERVING
    with grpc_app({"": serving, "down": health_pb2.HealthCheckResponse.NOT_SERVING}) as port:
        code, body = probe({P: {"grpc": {"port": port, "service": service}}}, P)
    assert code == status, body
    if service == "missing":
        assert "gRPC status 5" in body


def test_grpc_probe_against_a_plain_http_server_fails_cleanly():
    with http_app() as port:
        assert probe({P: {"grpc": {"port": port}}}, P)[0] == 503


def test_a_path_the_injector_did_not_write_is_404():
    assert probe({P: {"tcpSocket": {"port": 1}}}, "/app-health/other/livez")[0] == 404


@pytest.mark.parametrize(
    ("doc", "message"),
    [
        ("[]", "JSON object"),
        ("{", "not JSON"),
        ('{"/healthz": {"tcpSocket": {"port": 1}}}', "path must be"),
        ('{"/app-health/a/livez": {"tcpSocket": {"port": "http"}}}', "named ports"),
        ('{"/app-health/a/livez": {"tcpSocket": {"port": 1}, "grpc": {"port": 2}}}', "exactly one"),
        ('{"/app-health/a/livez": {"httpGet": {"port": 1, "scheme": "FTP"}}}', "scheme"),
        ('{"/app-health/a/livez": {"grpc": {"port": 1}, "timeoutSeconds": -1}}', "timeoutSeconds"),
    ],
)
def test_bad_prober_documents_are_refused_with_the_reason(doc: str, message: str):
    with pytest.raises(ValueError, match=message):
        parse_probers(doc)


def test_the_apps_metrics_are_fetched_for_the_merged_endpoint():
    with http_app() as port:
        runner = AppProbes(
            {}, pod_ip="127.0.0.1", new_socket=plain_socket, app_metrics=(port, "/metrics")
        )
        assert asyncio.run(runner.app_metrics_text()) == b"app_up 1\n"
        missing = AppProbes(
            {}, pod_ip="127.0.0.1", new_socket=plain_socket, app_metrics=(port, "/x")
        )
        assert asyncio.run(missing.app_metrics_text()) == b""
