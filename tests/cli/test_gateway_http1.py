"""``meshctl gateway run -f`` over HTTP/1.1 on loopback: a real gateway process, a real backend,
each answer the gateway gives checked on the wire (bodies byte for byte)."""

from __future__ import annotations

import base64
import http.client
import json
import os
import socket
import time
from collections.abc import Iterator
from typing import Any

import pytest

from tests.harness import gateway as gw


def _objects(web: gw.Backend, other: gw.Backend) -> list[dict[str, Any]]:
    header_filter = {
        "type": "RequestHeaderModifier",
        "requestHeaderModifier": {
            "set": [{"name": "x-set", "value": "gateway"}],
            "add": [{"name": "x-added", "value": "yes"}],
            "remove": ["x-secret"],
        },
    }
    response_filter = {
        "type": "ResponseHeaderModifier",
        "responseHeaderModifier": {
            "set": [{"name": "x-frame-options", "value": "DENY"}],
            "remove": ["x-backend"],
        },
    }
    return [
        gw.gateway_class(),
        gw.gateway(gw.http_listener()),
        gw.route(
            "web",
            [
                gw.rule("/api", "web:80"),
                gw.rule("/filtered", "web:80", filters=[header_filter, response_filter]),
                gw.rule(
                    "/old",
                    "web:80",
                    filters=[
                        {
                            "type": "URLRewrite",
                            "urlRewrite": {
                                "hostname": "rewritten.example",
                                "path": {
                                    "type": "ReplacePrefixMatch",
                                    "replacePrefixMatch": "/new",
                                },
                            },
                        }
                    ],
                ),
                gw.rule(
                    "/secure",
                    filters=[
                        {
                            "type": "RequestRedirect",
                            "requestRedirect": {"scheme": "https", "statusCode": 301},
                        }
                    ],
                ),
                {"matches": [{"path": {"type": "PathPrefix", "value": "/nobackend"}}]},
                gw.rule("/missing", "absent:80"),
                gw.rule("/unready", "unready:80"),
                gw.rule("/refused", "refused:80"),
                gw.rule("/other", "other:80"),
            ],
            hostnames=["example.com"],
        ),
        gw.service("web"),
        gw.endpoint_slice("web", [("127.0.0.1", True)], web.port),
        gw.service("other"),
        gw.endpoint_slice("other", [("127.0.0.1", True)], other.port),
        gw.service("unready"),
        gw.endpoint_slice("unready", [("127.0.0.1", False)], web.port),
        gw.service("refused"),
        gw.endpoint_slice("refused", [("127.0.0.1", True)], _closed_port()),
    ]


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.fixture(scope="module")
def running(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[gw.Running, gw.Backend]]:
    tmp = tmp_path_factory.mktemp("gateway")
    with (
        gw.backend("web") as web,
        gw.backend("other") as other,
        gw.run_gateway(
            tmp,
            _objects(web, other),
            listener_ports=(80,),
            args=("--header-timeout", "1s", "--max-request-body", "1000000"),
        ) as proc,
    ):
        yield proc, web


def _request(
    proc: gw.Running,
    method: str,
    path: str,
    *,
    host: str = "example.com",
    body: bytes | None = None,
    headers: dict[str, str] | None = None,
    conn: http.client.HTTPConnection | None = None,
) -> tuple[http.client.HTTPResponse, bytes]:
    conn = conn or http.client.HTTPConnection("127.0.0.1", proc.port(80), timeout=10)
    conn.request(method, path, body=body, headers={"Host": host, **(headers or {})})
    response = conn.getresponse()
    return response, response.read()


def _echo(data: bytes) -> dict[str, Any]:
    out: dict[str, Any] = json.loads(data)
    out["body"] = base64.b64decode(out["body"])
    out["headers"] = dict(out["headers"])
    return out


def test_a_routed_request_reaches_the_backend_with_its_body_byte_for_byte(running):
    proc, _ = running
    payload = os.urandom(300_000)
    response, data = _request(proc, "POST", "/api/items?x=1", body=payload)
    assert response.status == 200
    echo = _echo(data)
    assert echo["server"] == "web"
    assert echo["path"] == "/api/items?x=1"
    assert echo["body"] == payload


def test_a_large_response_body_arrives_byte_for_byte(running):
    proc, _ = running
    response, data = _request(proc, "GET", "/api/big/1000000")
    assert response.status == 200
    assert data == bytes(i % 251 for i in range(1_000_000))
    response, data = _request(proc, "GET", "/other/x")
    assert _echo(data)["server"] == "other"


def test_a_chunked_request_body_is_forwarded_and_a_chunked_response_streamed_back(running):
    proc, _ = running
    conn = http.client.HTTPConnection("127.0.0.1", proc.port(80), timeout=10)
    chunks = [os.urandom(1000), os.urandom(70_000), b"end"]
    conn.request(
        "PUT",
        "/api/upload",
        body=iter(chunks),
        headers={"Host": "example.com"},
        encode_chunked=True,
    )
    response = conn.getresponse()
    assert response.status == 200
    assert _echo(response.read())["body"] == b"".join(chunks)
    response, data = _request(proc, "GET", "/api/chunked/40", conn=conn)
    assert response.status == 200
    assert data == b"".join(f"part {i};".encode() for i in range(40))


def test_keep_alive_serves_many_requests_on_one_connection_over_pooled_upstreams(running):
    proc, _ = running
    conn = http.client.HTTPConnection("127.0.0.1", proc.port(80), timeout=10)
    before = _dump(proc)["upstreamConnectionsOpened"]
    for i in range(20):
        response, data = _request(proc, "GET", f"/api/{i}", conn=conn)
        assert response.status == 200
        assert _echo(data)["path"] == f"/api/{i}"
    assert _dump(proc)["upstreamConnectionsOpened"] - before <= 1


def test_a_response_whose_head_and_body_arrive_together_keeps_its_upstream_pooled(running):
    proc, _ = running
    conn = http.client.HTTPConnection("127.0.0.1", proc.port(80), timeout=10)
    before = _dump(proc)["upstreamConnectionsOpened"]
    for _ in range(10):
        response, data = _request(proc, "GET", "/api/oneshot", conn=conn)
        assert (response.status, data) == (200, b"oneshot")
    assert _dump(proc)["upstreamConnectionsOpened"] - before <= 1


def test_requests_whose_head_and_body_arrive_together_keep_the_client_connection(running):
    proc, _ = running
    conn = http.client.HTTPConnection("127.0.0.1", proc.port(80), timeout=10)
    conn.connect()
    sock = conn.sock
    for i in range(5):
        response, data = _request(proc, "POST", f"/api/p{i}", body=b"small", conn=conn)
        assert response.status == 200
        assert response.getheader("connection") != "close"
        assert _echo(data)["body"] == b"small"
    assert conn.sock is sock  # never reconnected


def test_pipelined_requests_in_one_segment_are_each_answered_in_order(running):
    proc, _ = running
    two = (
        b"POST /api/first HTTP/1.1\r\nHost: example.com\r\nContent-Length: 3\r\n\r\none"
        b"HEAD /api/second HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n"
    )
    answer = _raw(proc, two)
    first, _, rest = answer.partition(b"\r\n\r\n")
    assert first.startswith(b"HTTP/1.1 200 ")
    length = int(
        next(line for line in first.split(b"\r\n") if line.startswith(b"content-length")).split(
            b":"
        )[1]
    )
    echo = _echo(rest[:length])
    assert (echo["method"], echo["path"], echo["body"]) == ("POST", "/api/first", b"one")
    second = rest[length:]
    assert second.startswith(b"HTTP/1.1 200 ")
    assert second.endswith(b"\r\n\r\n")  # HEAD: a head, no body


def test_head_gets_the_backends_head_without_a_body(running):
    proc, _ = running
    answer = _raw(proc, b"HEAD /api/h HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"content-length: " in head.lower()
    assert body == b""


def test_expect_100_continue_gets_its_interim_answer_then_the_response(running):
    proc, _ = running
    with socket.create_connection(("127.0.0.1", proc.port(80)), timeout=5) as sock:
        sock.sendall(
            b"POST /api/e HTTP/1.1\r\nHost: example.com\r\nContent-Length: 4\r\n"
            b"Expect: 100-continue\r\nConnection: close\r\n\r\n"
        )
        assert sock.recv(100) == b"HTTP/1.1 100 Continue\r\n\r\n"
        sock.sendall(b"body")
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
    head, _, body = out.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    echo = _echo(body)
    assert echo["body"] == b"body"
    assert "expect" not in echo["headers"]


def test_an_http_1_0_client_gets_a_close_delimited_body_and_a_closed_connection(running):
    proc, _ = running
    answer = _raw(proc, b"GET /api/chunked/3 HTTP/1.0\r\nHost: example.com\r\n\r\n")
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 ")
    assert b"transfer-encoding" not in head.lower()
    assert body == b"part 0;part 1;part 2;"


def test_a_backend_body_ended_by_its_close_is_forwarded_whole(running):
    proc, _ = running
    response, data = _request(proc, "GET", "/api/closing")
    assert (response.status, data) == (200, b"until the close")


def test_forwarded_headers_request_id_and_host_reach_the_backend(running):
    proc, _ = running
    _, data = _request(proc, "GET", "/api/h", headers={"X-Forwarded-For": "203.0.113.9"})
    headers = _echo(data)["headers"]
    assert headers["host"] == "example.com"
    assert headers["x-forwarded-for"] == "203.0.113.9, 127.0.0.1"
    assert headers["x-forwarded-proto"] == "http"
    assert len(headers["x-request-id"]) == 36
    _, data = _request(proc, "GET", "/api/h", headers={"X-Request-Id": "abc-123"})
    assert _echo(data)["headers"]["x-request-id"] == "abc-123"


def test_header_modifier_filters_change_the_request_and_the_response(running):
    proc, _ = running
    response, data = _request(
        proc, "GET", "/filtered", headers={"X-Set": "client", "X-Secret": "s3cret"}
    )
    headers = _echo(data)["headers"]
    assert headers["x-set"] == "gateway"
    assert headers["x-added"] == "yes"
    assert "x-secret" not in headers
    assert response.getheader("x-frame-options") == "DENY"
    assert response.getheader("x-backend") is None


def test_url_rewrite_replaces_the_prefix_and_the_host(running):
    proc, _ = running
    _, data = _request(proc, "GET", "/old/page?q=1")
    echo = _echo(data)
    assert echo["path"] == "/new/page?q=1"
    assert echo["headers"]["host"] == "rewritten.example"


def test_a_redirect_rule_answers_the_redirect_itself(running):
    proc, web = running
    seen = len(web.seen)
    response, _ = _request(proc, "GET", "/secure/login?next=1")
    assert response.status == 301
    assert response.getheader("location") == "https://example.com/secure/login?next=1"
    assert len(web.seen) == seen


def test_no_route_is_404_with_the_reason_in_a_header_and_the_access_log(running):
    proc, _ = running
    response, data = _request(proc, "GET", "/api/x", host="unknown.example")
    assert response.status == 404
    assert response.getheader("x-meshctl-route") == "no-route (host unknown.example)"
    assert b"no-route (host unknown.example)" in data
    proc.wait_log('reason="no-route (host unknown.example)"')
    response, _ = _request(proc, "GET", "/nothing-here")
    assert response.status == 404
    assert "no rule matches GET /nothing-here" in response.getheader("x-meshctl-route")


def test_a_rule_without_backends_or_with_a_missing_service_is_500(running):
    proc, _ = running
    response, _ = _request(proc, "GET", "/nobackend")
    assert response.status == 500
    assert "no backendRefs" in response.getheader("x-meshctl-route")
    response, _ = _request(proc, "GET", "/missing")
    assert response.status == 500
    assert "BackendNotFound app/absent:80" in response.getheader("x-meshctl-route")


def test_no_ready_endpoint_or_every_endpoint_refusing_is_503(running):
    proc, _ = running
    response, _ = _request(proc, "GET", "/unready")
    assert response.status == 503
    assert "app/unready:80 has no ready endpoint" in response.getheader("x-meshctl-route")
    response, _ = _request(proc, "GET", "/refused")
    assert response.status == 503
    assert "every endpoint of app/refused:80 refused" in response.getheader("x-meshctl-route")


def _raw(proc: gw.Running, data: bytes, *, wait: float = 5.0) -> bytes:
    """What the gateway answers ``data`` on a fresh connection, until it closes it."""
    with socket.create_connection(("127.0.0.1", proc.port(80)), timeout=wait) as sock:
        sock.sendall(data)
        out = b""
        while chunk := sock.recv(65536):
            out += chunk
        return out


def test_garbage_is_400_and_the_connection_closed(running):
    proc, _ = running
    answer = _raw(proc, b"\x16\x03\x01\x02\x00garbage\r\n\r\n")
    assert answer.startswith(b"HTTP/1.1 400 ")
    assert b"connection: close" in answer


def test_an_absolute_target_that_is_no_url_is_400_and_the_next_request_is_served(running):
    proc, _ = running
    for target in (b"http://[::1/api/x", b"https://[zz]/api/x"):
        request = b"GET " + target + b" HTTP/1.1\r\nHost: example.com\r\nConnection: close\r\n\r\n"
        answer = _raw(proc, request)
        assert answer.startswith(b"HTTP/1.1 400 "), answer[:200]
        assert b"bad request target" in answer
    response, _ = _request(proc, "GET", "/api/after")
    assert response.status == 200


def test_oversized_headers_are_431(running):
    proc, _ = running
    head = b"GET / HTTP/1.1\r\nHost: example.com\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n"
    assert _raw(proc, head).startswith(b"HTTP/1.1 431 ")


def test_a_body_above_the_limit_is_413_before_any_of_it_is_read(running):
    proc, web = running
    seen = len(web.seen)
    head = b"POST /api/x HTTP/1.1\r\nHost: example.com\r\nContent-Length: 1000001\r\n\r\n"
    assert _raw(proc, head).startswith(b"HTTP/1.1 413 ")
    assert len(web.seen) == seen


def test_garbage_and_oversized_requests_leave_other_connections_served(running):
    proc, _ = running
    kept = http.client.HTTPConnection("127.0.0.1", proc.port(80), timeout=10)
    try:
        assert _request(proc, "GET", "/api/before", conn=kept)[0].status == 200
        bad = (
            (b"\x16\x03\x01\x02\x00garbage\r\n\r\n", 400),
            (b"GET / HTTP/1.1\r\nHost: example.com\r\nX-Big: " + b"a" * 70_000 + b"\r\n\r\n", 431),
            (b"POST /api/x HTTP/1.1\r\nHost: example.com\r\nContent-Length: 1000001\r\n\r\n", 413),
        )
        for request, status in bad:
            # _raw returns once the gateway closed that connection (else its read times out).
            assert _raw(proc, request).startswith(b"HTTP/1.1 %d " % status)
            # A connection kept open from before and a new one: both still served.
            assert _request(proc, "GET", "/api/kept", conn=kept)[0].status == 200, status
            assert _request(proc, "GET", "/api/new")[0].status == 200, status
    finally:
        kept.close()


def test_a_slow_head_is_cut_off_at_the_header_timeout_and_others_are_served(running):
    proc, _ = running
    with socket.create_connection(("127.0.0.1", proc.port(80)), timeout=10) as slow:
        slow.sendall(b"GET /api/slowloris HTTP/1.1\r\nHost: exa")
        started = time.monotonic()
        response, _ = _request(proc, "GET", "/api/meanwhile")
        assert response.status == 200
        out = b""
        while chunk := slow.recv(65536):
            out += chunk
        elapsed = time.monotonic() - started
    assert out.startswith(b"HTTP/1.1 408 ")
    assert elapsed < 3.0  # --header-timeout 1s


def test_an_idle_connection_that_sends_nothing_is_closed_at_the_header_timeout(running):
    proc, _ = running
    with socket.create_connection(("127.0.0.1", proc.port(80)), timeout=10) as idle:
        started = time.monotonic()
        assert idle.recv(100) == b""  # no request came: closed without an answer
        assert time.monotonic() - started < 3.0


def test_a_client_that_resets_mid_body_leaves_other_requests_alone(running):
    proc, _ = running
    sock = socket.create_connection(("127.0.0.1", proc.port(80)), timeout=5)
    sock.sendall(b"POST /api/x HTTP/1.1\r\nHost: example.com\r\nContent-Length: 100000\r\n\r\nabc")
    time.sleep(0.2)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")
    sock.close()  # RST
    response, data = _request(proc, "POST", "/api/after", body=b"fine")
    assert response.status == 200
    assert _echo(data)["body"] == b"fine"


def _dump(proc: gw.Running) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", 15000 + proc.offset, timeout=5)
    conn.request("GET", "/config_dump")
    data: dict[str, Any] = json.loads(conn.getresponse().read())
    return data
