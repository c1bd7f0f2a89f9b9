"""``meshctl inject webhook`` over real TLS on 127.0.0.1: HTTP/2 and HTTP/1.1, as the API server.

The server runs as the console script would (a subprocess), with a throwaway CA's serving
certificate; clients negotiate h2 or http/1.1 by ALPN like Go's HTTP client does.
"""

from __future__ import annotations

import base64
import http.client
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import h2.connection
import h2.events
import pytest
from cryptography import x509

from tests.harness.inject_webhook import WebhookProcess, start_webhook, stop_webhook
from tests.harness.wait import eventually

POD = {
    "metadata": {"name": "web", "namespace": "shop"},
    "spec": {"containers": [{"name": "web", "image": "web:1"}]},
}


def review_body(uid: str = "uid-1") -> bytes:
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": uid, "namespace": "shop", "operation": "CREATE", "object": POD},
    }
    return json.dumps(review).encode()


@pytest.fixture(scope="module")
def webhook(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebhookProcess]:
    server = start_webhook(tmp_path_factory.mktemp("webhook"))
    try:
        yield server
    finally:
        stop_webhook(server)


def post_h1(
    server: WebhookProcess,
    body: bytes,
    content_type: str = "application/json",
    path: str = "/inject",
) -> tuple[int, bytes, str | None]:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=server.context("http/1.1"), timeout=10
    )
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": content_type})
        response = conn.getresponse()
        assert conn.sock is not None
        protocol = conn.sock.selected_alpn_protocol()
        return response.status, response.read(), protocol
    finally:
        conn.close()


def post_h2(
    server: WebhookProcess, bodies: list[bytes]
) -> tuple[list[tuple[int, bytes]], str | None]:
    """Sends every body on its own stream of one HTTP/2 connection, concurrently."""
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    with server.context("h2").wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        protocol = tls.selected_alpn_protocol()
        conn = h2.connection.H2Connection()
        conn.initiate_connection()
        statuses: dict[int, int] = {}
        bodies_by_stream: dict[int, bytes] = {}
        for body in bodies:
            stream = conn.get_next_available_stream_id()
            conn.send_headers(
                stream,
                [
                    (":method", "POST"),
                    (":path", "/inject"),
                    (":scheme", "https"),
                    (":authority", f"127.0.0.1:{server.port}"),
                    ("content-type", "application/json"),
                    ("content-length", str(len(body))),
                ],
            )
            conn.send_data(stream, body, end_stream=True)
            bodies_by_stream[stream] = b""
        tls.sendall(conn.data_to_send())
        done: set[int] = set()
        while len(done) < len(bodies_by_stream):
            data = tls.recv(65536)
            assert data, "connection closed early"
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.ResponseReceived):
                    statuses[event.stream_id] = int(dict(event.headers)[b":status"])
                elif isinstance(event, h2.events.DataReceived):
                    bodies_by_stream[event.stream_id] += event.data
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.StreamEnded):
                    done.add(event.stream_id)
            tls.sendall(conn.data_to_send())
        return [(statuses[s], bodies_by_stream[s]) for s in sorted(bodies_by_stream)], protocol


JSON = {"Content-Type": "application/json"}


def assert_injects(
    status: int, body: bytes, uid: str = "uid-1", *, check_body: bool = True
) -> None:
    assert status == 200, body
    if not check_body:
        return
    response = json.loads(body)["response"]
    assert response["uid"] == uid
    assert response["allowed"] is True
    assert response["patchType"] == "JSONPatch"
    ops = json.loads(base64.b64decode(response["patch"]))
    assert any(op["path"].startswith("/spec/initContainers") for op in ops)


def test_http1_1(webhook: WebhookProcess):
    status, body, protocol = post_h1(webhook, review_body())
    assert protocol == "http/1.1"
    assert_injects(status, body)


def test_http2_with_concurrent_streams(webhook: WebhookProcess):
    answers, protocol = post_h2(webhook, [review_body(f"uid-{i}") for i in range(5)])
    assert protocol == "h2"
    for i, (status, body) in enumerate(answers):
        assert_injects(status, body, f"uid-{i}")


def test_protocol_errors_over_the_wire(webhook: WebhookProcess):
    assert post_h1(webhook, review_body(), content_type="text/plain")[0] == 415
    assert post_h1(webhook, b"")[0] == 400
    assert post_h1(webhook, b"{not json")[0] == 400
    assert post_h1(webhook, review_body(), path="/other")[0] == 404
    assert post_h1(webhook, b" " * (8 << 20 | 1))[0] == 413
    # Still serving after all that.
    assert_injects(*post_h1(webhook, review_body())[:2])


def test_sigterm_stops_the_server_cleanly(tmp_path: Path):
    server = start_webhook(tmp_path)
    assert_injects(*post_h1(server, review_body())[:2])
    started = time.monotonic()
    assert stop_webhook(server) == 0
    assert time.monotonic() - started < 10


def test_sigterm_does_not_wait_for_idle_keep_alive_clients(tmp_path: Path):
    """The API server keeps connections open; the drain deadline must still end the process."""
    server = start_webhook(tmp_path, "--drain-seconds", "1")
    idle = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=server.context("http/1.1"), timeout=10
    )
    try:
        idle.request("POST", "/inject", body=review_body(), headers=JSON)
        response = idle.getresponse()
        assert_injects(response.status, response.read())  # the connection stays open, idle
        started = time.monotonic()
        assert stop_webhook(server) == 0
        assert time.monotonic() - started < 5
    finally:
        idle.close()


def _served_serial(server: WebhookProcess) -> int:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    with server.context("http/1.1").wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        der = tls.getpeercert(binary_form=True)
    assert der is not None
    return x509.load_der_x509_certificate(der).serial_number


def _replace(path: Path, data: bytes) -> None:
    """Swap a file in one step, as a Secret volume update does (no half-written state)."""
    staged = path.with_suffix(".new")
    staged.write_bytes(data)
    staged.rename(path)


def test_a_rotated_certificate_is_served_without_a_restart_and_a_broken_one_is_refused(
    tmp_path: Path,
):
    server = start_webhook(tmp_path, "--reload-interval", "0.2")
    try:
        first = _served_serial(server)
        rotated = server.ca.issue("webhook", server=True, ip_sans=["127.0.0.1"])
        _replace(server.key_file, rotated.key_pem)  # for a moment the pair does not match
        _replace(server.cert_file, rotated.cert_pem)
        eventually("the rotated certificate served", lambda: _served_serial(server) != first, 10)
        serial = _served_serial(server)
        assert serial == x509.load_pem_x509_certificate(rotated.cert_pem).serial_number
        assert post_h1(server, review_body())[0] == 200
        # A key that does not belong to the certificate: the rotated pair stays in service.
        stranger = server.ca.issue("other", server=True, ip_sans=["127.0.0.1"])
        _replace(server.key_file, stranger.key_pem)
        time.sleep(1.0)  # five checks
        assert _served_serial(server) == serial
        assert post_h1(server, review_body())[0] == 200
        assert server.process.poll() is None
    finally:
        assert stop_webhook(server) == 0
