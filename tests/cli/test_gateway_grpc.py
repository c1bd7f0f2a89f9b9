"""``meshctl gateway run -f`` with GRPCRoutes on loopback, called by a real gRPC client (grpcio)
over h2c and over a TLS-terminated HTTPS listener, to grpcio servers behind it: method and
header matches pick the backend, RequestHeaderModifier reaches it, the backend's status, message
and trailing metadata come back whole (after streamed messages and trailers-only), and what the
gateway answers itself is a gRPC status: no route UNIMPLEMENTED, no endpoint or an endpoint that
refuses UNAVAILABLE; the access log and metrics name the call as gRPC; a meshed endpoint is
called through an HBONE stream."""

from __future__ import annotations

import contextlib
import socket
import subprocess
from collections.abc import Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import pytest

from tests.harness import gateway as gw
from tests.harness.cli import MESHCTL

HTTP, HTTPS = 80, 443
SERVICE = "test.Echo"


def _handlers(name: str) -> grpc.GenericRpcHandler:
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        added = dict(context.invocation_metadata()).get("x-added", "-")
        context.set_trailing_metadata((("x-backend", name),))
        return f"{name} x-added={added} ".encode() + request

    def count(request: bytes, context: grpc.ServicerContext) -> Iterator[bytes]:
        for i in range(int(request)):
            yield f"{name} {i}".encode()
        context.set_trailing_metadata((("x-counted", request.decode()),))

    def fail(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.set_trailing_metadata((("x-why", "asked to"),))
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, "refused: 100% on purpose")

    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            "Echo": grpc.unary_unary_rpc_method_handler(echo),
            "Count": grpc.unary_stream_rpc_method_handler(count),
            "Fail": grpc.unary_unary_rpc_method_handler(fail),
        },
    )


@contextlib.contextmanager
def grpc_backend(name: str) -> Iterator[int]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
    server.add_generic_rpc_handlers((_handlers(name),))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def grpc_route(name: str, rules: list[dict[str, Any]]) -> dict[str, Any]:
    out = gw.route(name, [])
    out["kind"] = "GRPCRoute"
    out["spec"]["rules"] = rules
    return out


def grpc_rule(backend: str, **match: Any) -> dict[str, Any]:
    out: dict[str, Any] = {"backendRefs": [{"name": backend, "port": 9000}]}
    if match:
        out["matches"] = [match]
    return out


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[gw.Running]:
    tmp = tmp_path_factory.mktemp("grpc")
    chain, key = gw.server_cert("rpc.example")
    with contextlib.ExitStack() as stack:
        ports = {n: stack.enter_context(grpc_backend(n)) for n in ("one", "two")}
        ports["refusing"] = _closed_port()
        headered = grpc_rule(
            "two",
            method={"service": SERVICE, "method": "Echo"},
            headers=[{"name": "version", "value": "two"}],
        )
        headered["filters"] = [
            {
                "type": "RequestHeaderModifier",
                "requestHeaderModifier": {"set": [{"name": "x-added", "value": "by-gateway"}]},
            }
        ]
        objects: list[dict[str, Any]] = [
            gw.gateway_class(),
            gw.gateway(
                gw.http_listener("http", HTTP),
                gw.https_listener("https", "rpc.example", "cert", HTTPS),
            ),
            gw.tls_secret("cert", chain, key),
            grpc_route(
                "rpc",
                [
                    headered,
                    grpc_rule("one", method={"service": SERVICE}),
                    grpc_rule("empty", method={"service": "test.Empty"}),
                    grpc_rule("refusing", method={"service": "test.Refusing"}),
                ],
            ),
            gw.service("empty", ports=(9000,)),
        ]
        for name in ("one", "two", "refusing"):
            objects.append(gw.service(name, ports=(9000,)))
            objects.append(
                gw.endpoint_slice(name, [("127.0.0.1", True)], ports[name], service_port=9000)
            )
        proc = stack.enter_context(gw.run_gateway(tmp, objects, listener_ports=(HTTP, HTTPS)))
        proc.cert = chain  # type: ignore[attr-defined]
        yield proc


@pytest.fixture
def channel(running: gw.Running) -> Iterator[grpc.Channel]:
    with grpc.insecure_channel(f"127.0.0.1:{running.port(HTTP)}") as ch:
        yield ch


def _unary(ch: grpc.Channel, method: str) -> Any:
    return ch.unary_unary(method)


def test_method_and_header_matches_pick_the_backend_and_the_filter_reaches_it(channel):
    echo = _unary(channel, f"/{SERVICE}/Echo")
    reply, call = echo.with_call(b"hi", metadata=(("version", "two"),), timeout=10)
    assert reply == b"two x-added=by-gateway hi"
    assert ("x-backend", "two") in call.trailing_metadata()
    assert echo(b"hi", timeout=10) == b"one x-added=- hi"


def test_streamed_messages_then_the_backends_trailers_come_back(channel):
    count = channel.unary_stream(f"/{SERVICE}/Count")
    call = count(b"3", timeout=10)
    assert list(call) == [b"one 0", b"one 1", b"one 2"]
    assert call.code() is grpc.StatusCode.OK
    assert ("x-counted", "3") in call.trailing_metadata()


def test_the_backends_error_status_message_and_trailers_are_kept(channel, running):
    with pytest.raises(grpc.RpcError) as caught:
        _unary(channel, f"/{SERVICE}/Fail")(b"", timeout=10)
    error: Any = caught.value
    assert error.code() is grpc.StatusCode.FAILED_PRECONDITION
    assert error.details() == "refused: 100% on purpose"
    assert ("x-why", "asked to") in error.trailing_metadata()
    running.wait_log(f'"POST /{SERVICE}/Fail HTTP/2" 200')
    running.wait_log("grpc_status=9")


def test_no_route_is_unimplemented_with_the_reason(channel, running):
    with pytest.raises(grpc.RpcError) as caught:
        _unary(channel, "/other.Service/Call")(b"", timeout=10)
    error: Any = caught.value
    assert error.code() is grpc.StatusCode.UNIMPLEMENTED
    assert error.details().startswith("no-route")
    running.wait_log('"POST /other.Service/Call HTTP/2" 200 NR')


@pytest.mark.parametrize(
    ("method", "reason"),
    [("/test.Empty/Call", "no-endpoint"), ("/test.Refusing/Call", "no-healthy-upstream")],
)
def test_no_endpoint_and_a_refusing_endpoint_are_unavailable(channel, method, reason):
    with pytest.raises(grpc.RpcError) as caught:
        _unary(channel, method)(b"", timeout=10)
    error: Any = caught.value
    assert error.code() is grpc.StatusCode.UNAVAILABLE
    assert error.details().startswith(reason)


def test_grpc_over_a_tls_terminated_listener(running):
    credentials = grpc.ssl_channel_credentials(root_certificates=running.cert)
    target = f"127.0.0.1:{running.port(HTTPS)}"
    options = (("grpc.ssl_target_name_override", "rpc.example"),)
    with grpc.secure_channel(target, credentials, options=options) as ch:
        assert _unary(ch, f"/{SERVICE}/Echo")(b"tls", timeout=10) == b"one x-added=- tls"


def test_calls_are_counted_as_grpc_in_the_metrics(channel, running):
    before = gw.metric(running, "istio_requests_total", request_protocol="grpc")
    _unary(channel, f"/{SERVICE}/Echo")(b"m", timeout=10)
    assert gw.metric(running, "istio_requests_total", request_protocol="grpc") == before + 1


def _certs(tmp: Path, workload: str, name: str) -> Path:
    out = tmp / name
    argv = ["ztunnel", "certs", "--out", str(out), "--workload", workload]
    subprocess.run(
        [*MESHCTL, *argv, "--ca-dir", str(tmp / "ca")],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out


def test_a_meshed_grpc_endpoint_is_called_through_hbone(tmp_path):
    gateway_certs = _certs(tmp_path, "infra/gw/gw-sa", "gateway")
    peer_certs = _certs(tmp_path, "app/rpc-0/rpc", "rpc")
    with grpc_backend("meshed") as port, gw.hbone_peer(peer_certs, port) as peer:
        slice_ = gw.endpoint_slice("rpc", [(peer.address, True)], 8080, service_port=9000)
        slice_["endpoints"][0]["targetRef"] = {"kind": "Pod", "name": "rpc-0", "namespace": "app"}
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "name": "rpc-0",
                "namespace": "app",
                "labels": {"istio.io/dataplane-mode": "ambient"},
            },
            "spec": {"serviceAccountName": "rpc"},
        }
        objects = [
            gw.gateway_class(),
            gw.gateway(gw.http_listener("http", HTTP)),
            grpc_route("rpc", [grpc_rule("rpc", method={"service": SERVICE})]),
            gw.service("rpc", ports=(9000,)),
            slice_,
            pod,
        ]
        env = {
            "POD_NAMESPACE": "infra",
            "SERVICE_ACCOUNT": "gw-sa",
            "MESHCTL_CERT_DIR": str(gateway_certs),
        }
        with (
            gw.run_gateway(tmp_path, objects, listener_ports=(HTTP,), env=env) as proc,
            grpc.insecure_channel(f"127.0.0.1:{proc.port(HTTP)}") as ch,
        ):
            echo = _unary(ch, f"/{SERVICE}/Echo")
            reply, call = echo.with_call(b"over hbone", timeout=10)
            assert reply == b"meshed x-added=- over hbone"
            assert ("x-backend", "meshed") in call.trailing_metadata()
            proc.wait_log("identity=spiffe://cluster.local/ns/app/sa/rpc")
    assert peer.seen[0]["san"] == ["spiffe://cluster.local/ns/infra/sa/gw-sa"]


def test_request_messages_the_gateway_never_reads_do_not_shrink_the_connections_window(channel):
    # Each unrouted call's message arrives before its answer and is never forwarded: its bytes
    # must still be given back to the client's flow-control window, or the connection stalls
    # once they add up to the window (64 KiB).
    call = _unary(channel, "/other.Service/Upload")
    for _ in range(40):
        with pytest.raises(grpc.RpcError) as caught:
            call(b"x" * 16384, timeout=5)
        error: Any = caught.value
        assert error.code() is grpc.StatusCode.UNIMPLEMENTED
