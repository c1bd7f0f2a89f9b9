"""``meshctl gateway run -f`` HTTPS listeners on loopback: the certificate chosen by SNI among
two listeners, a replaced Secret served from the next handshake on, 421 for a host of another
listener, an unknown name refused in the handshake, and ALPN."""

from __future__ import annotations

import http.client
import json
import socket
import ssl
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness import gateway as gw


def _objects(web: gw.Backend, certs: dict[str, tuple[bytes, bytes]]) -> list[dict[str, Any]]:
    return [
        gw.gateway_class(),
        gw.gateway(
            gw.https_listener("a", "a.example", "cert-a"),
            gw.https_listener("b", "b.example", "cert-b"),
        ),
        gw.route("web", [gw.rule("/", "web:80")]),
        gw.service("web"),
        gw.endpoint_slice("web", [("127.0.0.1", True)], web.port),
        gw.tls_secret("cert-a", *certs["a"]),
        gw.tls_secret("cert-b", *certs["b"]),
    ]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[gw.Running, gw.Backend, dict[str, Any]]]:
    certs = {
        "a": gw.server_cert("a.example", label="first a"),
        "b": gw.server_cert("b.example", label="first b"),
    }
    with (
        gw.backend("web") as web,
        gw.run_gateway(tmp_path, _objects(web, certs), listener_ports=(443,)) as proc,
    ):
        yield proc, web, certs


def _client_context(alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # the tests read the certificate served instead
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def _handshake(proc: gw.Running, sni: str, alpn: tuple[str, ...] = ("http/1.1",)) -> ssl.SSLSocket:
    raw = socket.create_connection(("127.0.0.1", proc.port(443)), timeout=5)
    return _client_context(alpn).wrap_socket(raw, server_hostname=sni)


def _served(proc: gw.Running, sni: str) -> str:
    with _handshake(proc, sni) as tls:
        der = tls.getpeercert(binary_form=True)
        assert der is not None
        return gw.peer_organisation(der)


def _get(proc: gw.Running, sni: str, host: str) -> http.client.HTTPResponse:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", proc.port(443), timeout=5, context=_client_context()
    )
    conn.connect()
    conn.sock = _client_context().wrap_socket(  # type: ignore[assignment]
        socket.create_connection(("127.0.0.1", proc.port(443)), timeout=5), server_hostname=sni
    )
    conn.request("GET", "/hello", headers={"Host": host})
    return conn.getresponse()


def test_each_listener_serves_its_own_certificate_by_sni(running):
    proc, _, _ = running
    assert _served(proc, "a.example") == "first a"
    assert _served(proc, "b.example") == "first b"


def test_a_request_over_https_reaches_the_backend_with_forwarded_proto(running):
    proc, _, _ = running
    response = _get(proc, "a.example", "a.example")
    assert response.status == 200
    echo = json.loads(response.read())
    assert dict(echo["headers"])["x-forwarded-proto"] == "https"
    assert echo["path"] == "/hello"


def test_a_host_of_another_listener_with_another_certificate_is_421(running):
    proc, web, _ = running
    seen = len(web.seen)
    response = _get(proc, "a.example", "b.example")
    assert response.status == 421
    assert "b.example belongs to listener infra/gw/b" in response.getheader("x-meshctl-route")
    assert len(web.seen) == seen


def test_a_name_no_listener_covers_is_refused_in_the_handshake(running):
    proc, _, _ = running
    # The callback answers unrecognized_name; the event loop's TLS transport closes the
    # connection on the failed handshake, and whether the alert record leaves first is its own.
    with pytest.raises((ssl.SSLError, ConnectionError)):
        _handshake(proc, "c.example").close()
    assert _served(proc, "a.example") == "first a"  # and the gateway still serves
    assert "Traceback" not in proc.output()


def test_alpn_offers_http_1_1(running):
    proc, _, _ = running
    with _handshake(proc, "a.example", ("http/1.1",)) as tls:
        assert tls.selected_alpn_protocol() == "http/1.1"


def test_a_replaced_secret_is_served_to_the_next_handshake_without_a_restart(running):
    proc, web, certs = running
    pid = proc.proc.pid
    certs = {**certs, "a": gw.server_cert("a.example", label="second a")}
    gw.write_objects(proc.config, _objects(web, certs))
    deadline = time.monotonic() + 10
    while _served(proc, "a.example") != "second a":
        assert time.monotonic() < deadline, proc.output()
        time.sleep(0.1)
    assert _served(proc, "b.example") == "first b"
    assert proc.proc.pid == pid
    assert proc.proc.poll() is None


def test_a_secret_that_does_not_load_keeps_the_gateway_up_and_its_name_refused(running):
    proc, web, certs = running
    broken = {**certs, "b": (certs["b"][0], certs["a"][1])}  # b's chain with a's key
    gw.write_objects(proc.config, _objects(web, broken))
    proc.wait_log("Secret infra/cert-b: certificate and key do not load")
    deadline = time.monotonic() + 10
    while True:
        try:
            _handshake(proc, "b.example").close()
        except ssl.SSLError:
            break
        assert time.monotonic() < deadline
        time.sleep(0.1)
    assert _served(proc, "a.example") == "first a"
