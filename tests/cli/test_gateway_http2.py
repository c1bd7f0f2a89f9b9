"""``meshctl gateway run -f`` over HTTP/2: ALPN h2 over TLS and h2c with prior knowledge, as the
h2 library and Node.js's http2 (an independent peer) speak it; streams byte for byte, the
abuse budgets (rapid reset, SETTINGS flood) and GOAWAY on drain."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import re
import shutil
import signal
import socket
import ssl
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import h2.config
import h2.connection
import h2.events
import h2.settings
import pytest

from tests.harness import gateway as gw

NODE_CLIENT = Path(__file__).parents[1] / "interop" / "gateway_h2_client.js"


def _objects(web: gw.Backend, cert: tuple[bytes, bytes]) -> list[dict[str, Any]]:
    return [
        gw.gateway_class(),
        gw.gateway(gw.http_listener(), gw.https_listener("a", "a.example", "cert-a")),
        gw.route("web", [gw.rule("/", "web:80")]),
        gw.service("web"),
        gw.endpoint_slice("web", [("127.0.0.1", True)], web.port),
        gw.tls_secret("cert-a", *cert),
    ]


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[gw.Running, gw.Backend]]:
    cert = gw.server_cert("a.example")
    with (
        gw.backend("web") as web,
        gw.run_gateway(tmp_path, _objects(web, cert), listener_ports=(80, 443)) as proc,
    ):
        yield proc, web


class Client:
    """A blocking HTTP/2 client on the h2 library, enough for these tests."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.conn.initiate_connection()
        self.sock.sendall(self.conn.data_to_send())
        self.events: list[Any] = []
        self.goaways: list[tuple[int, int]] = []  # (last stream id, error code) as received
        self._pending = b""

    @classmethod
    def tls(cls, port: int, sni: str) -> Client:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        ctx.set_alpn_protocols(["h2"])
        sock = ctx.wrap_socket(
            socket.create_connection(("127.0.0.1", port), 5), server_hostname=sni
        )
        assert sock.selected_alpn_protocol() == "h2"
        return cls(sock)

    @classmethod
    def h2c(cls, port: int) -> Client:
        return cls(socket.create_connection(("127.0.0.1", port), 5))

    def send(self, path: str, authority: str, body: bytes = b"", method: str = "GET") -> int:
        sid = self.conn.get_next_available_stream_id()
        headers = [
            (":method", method),
            (":path", path),
            (":authority", authority),
            (":scheme", "https"),
        ]
        self.conn.send_headers(sid, headers, end_stream=not body)
        if body:
            self._send_body(sid, body)
        self.sock.sendall(self.conn.data_to_send())
        return sid

    def _send_body(self, sid: int, body: bytes) -> None:
        view = memoryview(body)
        while view:
            window = min(
                self.conn.local_flow_control_window(sid), self.conn.max_outbound_frame_size
            )
            if window <= 0:
                self.sock.sendall(self.conn.data_to_send())
                self._read_once()
                continue
            self.conn.send_data(sid, view[:window].tobytes())
            view = view[window:]
        self.conn.end_stream(sid)

    def _frames(self, data: bytes) -> bytes:
        """``data`` without GOAWAY frames, which are recorded instead: the h2 library closes
        its state on one and would refuse the streams a graceful GOAWAY lets finish."""
        self._pending += data
        out = b""
        while len(self._pending) >= 9:
            length = int.from_bytes(self._pending[:3], "big")
            if len(self._pending) < 9 + length:
                break
            frame, self._pending = self._pending[: 9 + length], self._pending[9 + length :]
            if frame[3] == 0x7:  # GOAWAY (RFC 9113 6.8)
                last = int.from_bytes(frame[9:13], "big") & 0x7FFFFFFF
                self.goaways.append((last, int.from_bytes(frame[13:17], "big")))
            else:
                out += frame
        return out

    def _read_once(self) -> bool:
        data = self.sock.recv(65536)
        if not data:
            return False
        for event in self.conn.receive_data(self._frames(data)):
            self.events.append(event)
            if isinstance(event, h2.events.DataReceived):
                self.conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
        out = self.conn.data_to_send()
        if out:
            self.sock.sendall(out)
        return True

    def responses(self, sids: list[int], timeout: float = 10.0) -> dict[int, tuple[int, bytes]]:
        """(status, body) per stream, once every one of ``sids`` ended."""
        self.sock.settimeout(timeout)
        while not all(
            any(isinstance(e, h2.events.StreamEnded) and e.stream_id == s for e in self.events)
            for s in sids
        ):
            if not self._read_once():
                break
        out = {}
        for sid in sids:
            status = next(
                int(dict(e.headers)[b":status"])
                for e in self.events
                if isinstance(e, h2.events.ResponseReceived) and e.stream_id == sid
            )
            body = b"".join(
                e.data
                for e in self.events
                if isinstance(e, h2.events.DataReceived) and e.stream_id == sid
            )
            out[sid] = (status, body)
        return out

    def goaway(self, timeout: float = 5.0) -> tuple[int, int] | None:
        """The first GOAWAY the server sent: (last stream id, error code)."""
        self.sock.settimeout(timeout)
        deadline = time.monotonic() + timeout
        while not self.goaways and time.monotonic() < deadline:
            try:
                if not self._read_once():
                    break
            except (OSError, h2.exceptions.ProtocolError):
                break
        return self.goaways[0] if self.goaways else None


def _echo(body: bytes) -> dict[str, Any]:
    data: dict[str, Any] = json.loads(body)
    data["body"] = base64.b64decode(data["body"])
    return data


def test_h2_over_tls_carries_concurrent_streams_byte_for_byte(running):
    proc, _ = running
    client = Client.tls(proc.port(443), "a.example")
    bodies = {i: os.urandom(100_000 + i) for i in range(8)}
    sids = {client.send(f"/api/{i}", "a.example", body, "POST"): i for i, body in bodies.items()}
    answers = client.responses(list(sids))
    for sid, i in sids.items():
        status, body = answers[sid]
        assert status == 200
        echo = _echo(body)
        assert echo["path"] == f"/api/{i}"
        assert echo["body"] == bodies[i]
        assert dict(echo["headers"])["host"] == "a.example"


def test_a_large_h2_response_arrives_within_flow_control(running):
    proc, _ = running
    client = Client.tls(proc.port(443), "a.example")
    sid = client.send("/big/2000000", "a.example")
    status, body = client.responses([sid])[sid]
    assert status == 200
    assert body == bytes(i % 251 for i in range(2_000_000))


def test_h2c_with_prior_knowledge_is_served_on_a_plaintext_port(running):
    proc, _ = running
    client = Client.h2c(proc.port(80))
    sid = client.send("/api/h2c", "example.com")
    status, body = client.responses([sid])[sid]
    assert status == 200
    assert _echo(body)["path"] == "/api/h2c"
    sid = client.send("/api/x", "nowhere.example")
    status, _ = client.responses([sid])[sid]
    assert status == 200  # the route has no hostnames: every host


def test_the_gateways_own_answers_reach_h2_clients_with_their_reason(running):
    proc, _ = running
    client = Client.tls(proc.port(443), "a.example")
    sid = client.send("/x", "b.example")  # no listener names b.example on 443
    status, body = client.responses([sid])[sid]
    assert status == 404
    headers = next(
        dict(e.headers)
        for e in client.events
        if isinstance(e, h2.events.ResponseReceived) and e.stream_id == sid
    )
    assert headers[b"x-meshctl-route"] == b"no-route (host b.example: no listener)"
    assert body == b"no-route (host b.example: no listener)\n"


@pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (node) for interop")
def test_nodejs_http2_client_gets_every_stream_byte_for_byte(running):
    proc, _ = running
    done = subprocess.run(
        [
            "node",
            str(NODE_CLIENT),
            f"https://127.0.0.1:{proc.port(443)}",
            "a.example",
            "a.example",
            "10",
            "50000",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    results = json.loads(done.stdout)["results"]
    assert len(results) == 10
    assert all(r["status"] == 200 and r["same"] and r["protocol"] == "h2" for r in results)
    assert sorted(r["path"] for r in results) == sorted(f"/api/node/{i}" for i in range(10))


def test_rapid_reset_is_answered_with_goaway_enhance_your_calm(running):
    proc, _ = running
    client = Client.tls(proc.port(443), "a.example")
    for _ in range(400):
        sid = client.conn.get_next_available_stream_id()
        client.conn.send_headers(
            sid,
            [
                (":method", "GET"),
                (":path", "/slow/1"),
                (":authority", "a.example"),
                (":scheme", "https"),
            ],
        )
        client.conn.reset_stream(sid)
    with contextlib.suppress(OSError):
        client.sock.sendall(client.conn.data_to_send())
    goaway = client.goaway()
    assert goaway is not None
    assert goaway[1] == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    fresh = Client.tls(proc.port(443), "a.example")  # others unaffected
    sid = fresh.send("/api/after", "a.example")
    assert fresh.responses([sid])[sid][0] == 200


def test_a_settings_flood_is_answered_with_goaway_enhance_your_calm(running):
    proc, _ = running
    client = Client.tls(proc.port(443), "a.example")
    for _ in range(500):
        client.conn.update_settings({h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: 50})
    with contextlib.suppress(OSError):
        client.sock.sendall(client.conn.data_to_send())
    goaway = client.goaway()
    assert goaway is not None
    assert goaway[1] == h2.errors.ErrorCodes.ENHANCE_YOUR_CALM
    fresh = Client.tls(proc.port(443), "a.example")  # others unaffected
    sid = fresh.send("/api/after", "a.example")
    assert fresh.responses([sid])[sid][0] == 200


def test_sigterm_sends_goaway_and_finishes_the_stream_in_flight(running):
    proc, _ = running
    client = Client.tls(proc.port(443), "a.example")
    sid = client.send("/slow/1", "a.example")
    time.sleep(0.3)
    proc.proc.send_signal(signal.SIGTERM)
    status, body = client.responses([sid])[sid]
    assert status == 200
    assert _echo(body)["path"] == "/slow/1"
    assert client.goaways == [(sid, h2.errors.ErrorCodes.NO_ERROR)]
    assert proc.proc.wait(10) == 0


def test_sigterm_with_two_workers_sends_goaway_on_every_connection_and_finishes_it(
    tmp_path: Path,
) -> None:
    cert = gw.server_cert("a.example")
    with (
        gw.backend("web") as web,
        gw.run_gateway(
            tmp_path, _objects(web, cert), listener_ports=(80, 443), args=("--workers", "2")
        ) as proc,
    ):
        clients = [Client.tls(proc.port(443), "a.example") for _ in range(6)]
        sids = [client.send("/slow/1", "a.example") for client in clients]
        time.sleep(0.3)
        proc.proc.send_signal(signal.SIGTERM)
        for client, sid in zip(clients, sids, strict=True):
            status, body = client.responses([sid])[sid]
            assert status == 200
            assert _echo(body)["path"] == "/slow/1"
            assert client.goaways == [(sid, h2.errors.ErrorCodes.NO_ERROR)]
        assert proc.proc.wait(10) == 0
        served = set(re.findall(r"\[gateway (worker=\d+) pid=\d+\] \"GET /slow/1 ", proc.output()))
    assert served  # by the workers (the access log names them)
