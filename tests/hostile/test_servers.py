"""The hostile corpus against every server a peer can reach: each answers in its own protocol (an
HTTP status, a gRPC status, a dropped ZDS connection) and goes on serving others, proven by a
good request after the bad ones; none logs a traceback.

Servers, through the harnesses their own tests use: the injection webhook (``meshctl inject
webhook``, a subprocess), the standalone CA (``meshctl controlplane ca``, a subprocess, gRPC over
TLS), the discovery server (Delta ADS over TLS, in process), the node agent's ZDS server and its
plugin-event socket (in process, on unix sockets), and the proxy's HTTP ports (admin, metrics,
readiness: the one server behind them, in process on loopback).
"""

from __future__ import annotations

import asyncio
import http.client
import importlib
import signal
import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import grpc.aio
import pytest

from meshctl.core.pki.identity import SpiffeId
from tests.bench.bench_inject import review_body
from tests.cli import test_controlplane_ca as ca_tests
from tests.harness.inject_webhook import WebhookProcess, start_webhook
from tests.hostile.corpus import SMALL
from tests.netns.zds_peer import ProxyPeer
from tests.unit.plugins.controlplane import test_discovery_server as xds_tests

ITEMS = list(SMALL)
GOOD_REVIEW = review_body(1)


def _not_http(data: bytes) -> bytes:
    """An item as it reaches a port: whatever bytes, the peer then stops writing."""
    return data or b"\x00"


def exchange(sock: socket.socket, data: bytes) -> bytes:
    """Send ``data`` and stop writing, then read the answer; a server that answers and closes
    before taking it all (a body over its limit) is not an error here: what came back is."""
    sock.settimeout(30)
    try:
        sock.sendall(data)
        sock.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError, OSError):
        pass  # the server already answered and closed: read what it said
    answer = b""
    try:
        while chunk := sock.recv(65536):
            answer += chunk
    except ConnectionResetError:
        pass  # closed with our bytes unread: the answer, if any, came first
    return answer


# Items a server may refuse by closing while they are still arriving (its read limit is lower):
# the answer can be lost to the reset that unread bytes cause; the next request proves it lives.
LARGE = {name for name, data in SMALL.items() if len(data) > 60_000}


# --- the injection webhook ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    server = start_webhook(tmp_path_factory.mktemp("webhook"))
    yield server
    server.process.send_signal(signal.SIGTERM)
    server.process.wait(timeout=30)
    log = server.process.stderr.read().decode() if server.process.stderr else ""
    assert "Traceback" not in log, log[-3000:]


def _post(server: WebhookProcess, body: bytes, content_type: str = "application/json") -> int:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=server.context("http/1.1"), timeout=30
    )
    try:
        conn.request("POST", "/inject", body=body, headers={"Content-Type": content_type})
        response = conn.getresponse()
        response.read()
        return response.status
    finally:
        conn.close()


@pytest.mark.parametrize("item", ITEMS)
def test_the_webhook_answers_a_hostile_body_with_a_4xx_and_keeps_serving(webhook, item: str):
    status = _post(webhook, SMALL[item])
    assert 400 <= status < 500, f"{item}: HTTP {status}"
    assert _post(webhook, GOOD_REVIEW) == 200


def test_the_webhook_refuses_an_oversized_body_and_plain_garbage(webhook):
    assert _post(webhook, b"[" * (9 << 20)) == 413
    assert _post(webhook, SMALL["nested-flow"], "text/yaml") == 415
    for data in (SMALL["binary"], b"GET / HTTP/1.1\r\n\r\n", b""):  # not TLS at all
        with socket.create_connection(("127.0.0.1", webhook.port), timeout=10) as raw:
            exchange(raw, data)
    context = webhook.context("http/1.1")
    with (
        socket.create_connection(("127.0.0.1", webhook.port), timeout=10) as raw,
        context.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
    ):
        tls.sendall(SMALL["binary"] + b"\r\n\r\n")  # TLS, then no HTTP
        answer = tls.recv(65536)
    assert answer.startswith(b"HTTP/1.1 400"), answer[:100]
    assert _post(webhook, GOOD_REVIEW) == 200


# --- the standalone CA (gRPC) ------------------------------------------------------------------

CREATE = "/istio.v1.auth.IstioCertificateService/CreateCertificate"


@pytest.fixture(scope="module")
def ca(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, bytes]]:
    folder = tmp_path_factory.mktemp("ca")
    port = ca_tests._free_port()
    process = ca_tests._start(folder, port)
    yield port, (folder / "ca" / "ca-cert.pem").read_bytes()
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=30)
    log = process.stderr.read() if process.stderr else ""
    assert "Traceback" not in log, log[-3000:]


def _raw_call(port: int, roots: bytes, data: bytes, token: str = "tok-client") -> grpc.StatusCode:
    credentials = grpc.ssl_channel_credentials(root_certificates=roots)
    with grpc.secure_channel(f"127.0.0.1:{port}", credentials) as channel:
        call = channel.unary_unary(CREATE)  # bytes in, bytes out: no message classes
        try:
            call(data, metadata=(("authorization", f"Bearer {token}"),), timeout=20)
        except grpc.RpcError as exc:
            return exc.code()  # type: ignore[no-any-return]
    return grpc.StatusCode.OK


@pytest.mark.parametrize("item", ITEMS)
def test_the_ca_answers_a_hostile_message_with_a_grpc_status_and_keeps_serving(ca, item: str):
    port, roots = ca
    code = _raw_call(port, roots, SMALL[item])
    # Not OK (no certificate for garbage), not UNKNOWN (a handler that raised), no hang.
    assert code not in (grpc.StatusCode.OK, grpc.StatusCode.UNKNOWN), f"{item}: {code}"
    assert code != grpc.StatusCode.DEADLINE_EXCEEDED
    me = SpiffeId("cluster.local", "default", "client")
    assert ca_tests._ask(port, roots, "tok-client", me)


def test_the_ca_refuses_oversized_messages_unknown_tokens_and_plain_garbage(ca):
    port, roots = ca
    assert _raw_call(port, roots, b"\x0a" * (8 << 20)) == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert _raw_call(port, roots, b"", token="no-such-token") == grpc.StatusCode.UNAUTHENTICATED
    assert _raw_call(port, roots, SMALL["binary"]) == grpc.StatusCode.INVALID_ARGUMENT
    for data in (SMALL["binary"], SMALL["nested-flow"], b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"):
        with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
            exchange(raw, data)  # not TLS: the handshake fails and the connection closes
    me = SpiffeId("cluster.local", "default", "client")
    assert ca_tests._ask(port, roots, "tok-client", me)


# --- discovery (Delta ADS) ---------------------------------------------------------------------

DELTA = "/envoy.service.discovery.v3.AggregatedDiscoveryService/DeltaAggregatedResources"


def test_the_discovery_server_ends_hostile_streams_with_a_status_and_keeps_serving():
    async def scenario() -> dict[str, grpc.StatusCode]:
        harness = xds_tests.Harness({"node": xds_tests.NODE_PROXY})
        await harness.start()
        codes = {}
        try:
            credentials = grpc.ssl_channel_credentials(root_certificates=harness.ca.cert_pem)
            for item in [*ITEMS, "oversized"]:
                data = SMALL.get(item, b"\x0a" * (8 << 20))
                async with grpc.aio.secure_channel(f"127.0.0.1:{harness.port}", credentials) as ch:
                    call = ch.stream_stream(DELTA)
                    stream = call(metadata=(("authorization", "Bearer node"),), timeout=20)
                    try:
                        await stream.write(data)
                        await stream.done_writing()
                        async for _ in stream:
                            pass
                        codes[item] = grpc.StatusCode.OK
                    except grpc.RpcError as exc:
                        codes[item] = exc.code()
                    except grpc.aio.UsageError:  # the server ended the call before our write
                        codes[item] = await stream.code()
            channel, stream = await harness.stream()
            first = await xds_tests.subscribe_both(stream)
            assert len(first) == 2
            await stream.close()
            await channel.close()
        finally:
            await harness.stop()
        return codes

    codes = asyncio.run(scenario())
    unhandled = {item: code for item, code in codes.items() if code == grpc.StatusCode.UNKNOWN}
    hung = {item: code for item, code in codes.items() if code == grpc.StatusCode.DEADLINE_EXCEEDED}
    assert not unhandled, unhandled
    assert not hung, hung
    assert codes["binary"] != grpc.StatusCode.OK
    # 8 MiB is under this server's 200 MiB limit (Istio's): decoded, and refused as garbage.
    assert codes["oversized"] == grpc.StatusCode.INVALID_ARGUMENT


# --- the node agent: ZDS and plugin events -----------------------------------------------------


def test_the_zds_server_drops_a_hostile_proxy_and_serves_the_next(tmp_path: Path):
    zdsserver = importlib.import_module("meshctl_plugins.cni.zdsserver")

    async def scenario() -> int:
        ready = asyncio.Event()
        ready.set()
        path = tmp_path / "ztunnel.sock"
        server = zdsserver.ZdsServer(str(path))
        server.start(snapshot=list, on_snapshot=lambda uid, ack: None, ready=ready)
        loop = asyncio.get_running_loop()
        try:
            for item in ITEMS:
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
                sock.setblocking(False)
                await loop.sock_connect(sock, str(path))
                await loop.sock_sendall(sock, SMALL[item][: 64 << 10])
                closed = await asyncio.wait_for(loop.sock_recv(sock, 4096), 15)
                sock.close()
                assert closed == b"" or item == "empty", f"{item}: the server answered {closed!r}"
            peer = ProxyPeer(path).start()
            for _ in range(100):
                if server.connected:
                    break
                await asyncio.sleep(0.1)
            peer.close()
            return server.connected
        finally:
            await server.close()

    assert asyncio.run(scenario()) == 1


def _http_over(path: Path, request: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(path))
        return exchange(sock, request)


def test_the_plugin_event_socket_answers_hostile_requests_with_http_errors(tmp_path: Path):
    pluginserver = importlib.import_module("meshctl_plugins.cni.pluginserver")

    async def accept(event: dict[str, Any]) -> tuple[int, str]:
        return (200, "ok") if isinstance(event.get("podName"), str) else (400, "no podName")

    async def scenario() -> dict[str, bytes]:
        path = tmp_path / "pluginevent.sock"
        server = pluginserver.PluginServer(str(path), {"/cmdadd": accept})
        await server.start()
        loop = asyncio.get_running_loop()
        answers = {}
        try:
            for item in ITEMS:
                body = SMALL[item]
                post = b"POST /cmdadd HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body) + body
                answers[item] = await loop.run_in_executor(None, _http_over, path, post)
                answers[f"raw {item}"] = await loop.run_in_executor(
                    None, _http_over, path, _not_http(body)
                )
            good = b'{"podName": "p", "podNamespace": "default"}'
            request = b"POST /cmdadd HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(good) + good
            answers["good"] = await loop.run_in_executor(None, _http_over, path, request)
        finally:
            await server.close()
        return answers

    answers = asyncio.run(scenario())
    assert answers.pop("good").startswith(b"HTTP/1.1 200")
    wrong = {
        item: a[:40]
        for item, a in answers.items()
        if not a.startswith(b"HTTP/1.1 400") and not (a == b"" and item.split()[-1] in LARGE)
    }
    assert not wrong, wrong


def test_the_cni_request_route_answers_hostile_bodies_with_400_or_the_spec_error(tmp_path: Path):
    # The thin client's route: a body not in its form is 400; the corpus as the config of an
    # ADD (its environment well-formed) is the CNI error JSON with exit code 1.
    pluginserver = importlib.import_module("meshctl_plugins.cni.pluginserver")
    route = importlib.import_module("meshctl_plugins.cni.requestroute")
    env = b"CNI_COMMAND=ADD\0CNI_CONTAINERID=c\0CNI_NETNS=/x\0CNI_IFNAME=eth0\0\0"

    async def scenario() -> dict[str, bytes]:
        path = tmp_path / "pluginevent.sock"
        requests = route.CniRequests(str(tmp_path))
        requests.start()
        server = pluginserver.PluginServer(
            str(path), {}, {"/cni": requests.handle}, raw_limit=route.MAX_REQUEST
        )
        await server.start()
        loop = asyncio.get_running_loop()
        answers = {}
        try:
            for item in ITEMS:
                for name, body in ((f"raw {item}", SMALL[item]), (item, env + SMALL[item])):
                    post = b"POST /cni HTTP/1.1\r\nContent-Length: %d\r\n\r\n" % len(body)
                    answers[name] = await loop.run_in_executor(None, _http_over, path, post + body)
        finally:
            await server.close()
            requests.close()
        return answers

    answers = asyncio.run(scenario())
    wrong = {}
    for name, answer in answers.items():
        head, _, body = answer.partition(b"\r\n\r\n")
        if head.startswith(b"HTTP/1.1 400"):
            if not name.startswith("raw "):
                wrong[name] = answer[:60]
            continue
        code, _, out = body.partition(b"\n")
        if not head.startswith(b"HTTP/1.1 200") or code != b"1" or b'"code": ' not in out:
            wrong[name] = answer[:80]
    assert not wrong, wrong


def test_the_proxys_http_ports_answer_hostile_requests_with_400(tmp_path: Path):
    from meshctl.proxy import responder

    async def handler(method: str, path: str, query: object, headers: object) -> Any:
        return 200, "text/plain", b"ok\n"

    async def scenario() -> dict[str, bytes]:
        listener = socket.create_server(("127.0.0.1", 0))
        port = listener.getsockname()[1]
        server = await responder.serve(listener, handler)
        loop = asyncio.get_running_loop()
        answers = {}

        def send(data: bytes) -> bytes:
            with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
                return exchange(sock, data)

        try:
            for item in ITEMS:
                answers[item] = await loop.run_in_executor(None, send, _not_http(SMALL[item]))
            answers["good"] = await loop.run_in_executor(
                None, send, b"GET /healthz/ready HTTP/1.1\r\nHost: x\r\n\r\n"
            )
        finally:
            server.close()
            await server.wait_closed()
        return answers

    answers = asyncio.run(scenario())
    assert answers.pop("good").startswith(b"HTTP/1.1 200")
    # A few items are a request line the server can read ("a: b..." is a method "a:", a path):
    # those get the handler's answer; everything else is a 400, never silence.
    silent = {
        item: a[:40]
        for item, a in answers.items()
        if not a.startswith(b"HTTP/1.1 ") and not (a == b"" and item in LARGE)
    }
    assert not silent, silent
