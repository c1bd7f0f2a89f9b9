"""Faults: a killed data plane comes back, SIGTERM drains, certificates rotate in place.

The time bounds here only catch a hang (a loaded 2-core CI machine is slow, not broken); how
fast the restart and the drain are is measured by ``tests/bench/bench_hbone.py`` (its faults
rows, beside a warm round trip and the drain deadline of the same run).
"""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import threading
import time

import pytest

from meshctl.core.pki.identity import SpiffeId
from tests.harness.wait import eventually
from tests.netns.ztunnel_harness import TD, echo_roundtrip, metric_sum
from tests.netns.ztunnel_topology import APP_PORT, two_pod_mesh

pytestmark = pytest.mark.netns


class SlowStream:
    """A client connection through the mesh that sends a chunk every ``gap`` seconds."""

    def __init__(self, ns, addr, chunks: int, gap: float) -> None:
        self.sent = b""
        self.reply = b""
        self.error: Exception | None = None
        self._thread = threading.Thread(target=self._run, args=(ns, addr, chunks, gap), daemon=True)
        self._thread.start()

    def _run(self, ns, addr, chunks, gap):
        try:
            with ns.socket() as s:
                s.settimeout(30)
                s.connect(addr)
                s.sendall(b"E")
                for i in range(chunks):
                    piece = bytes([i % 256]) * 10_000
                    s.sendall(piece)
                    self.sent += piece
                    time.sleep(gap)
                s.shutdown(socket.SHUT_WR)
                while chunk := s.recv(65536):
                    self.reply += chunk
        except OSError as exc:  # the test asserts on it
            self.error = exc

    def join(self, timeout: float) -> None:
        self._thread.join(timeout)

    @property
    def intact(self) -> bool:
        return self.error is None and self.reply == hashlib.sha256(self.sent).digest() + self.sent


def _wait_for_opened(car, count: int, timeout: float = 10) -> None:
    def opened() -> bool:
        name = "istio_tcp_connections_opened_total"
        return metric_sum(car.metrics(), name, reporter="destination") >= count

    eventually(f"{car} opened {count} connections", opened, timeout)


def test_killed_data_plane_is_restarted_and_new_connections_are_served(tmp_path):
    with two_pod_mesh(tmp_path) as m:
        addr = (m.b.ip, APP_PORT)
        assert echo_roundtrip(m.a.ns, addr, b"before")[32:] == b"before"
        victim = m.car_a.dataplane_pid()
        streams = [SlowStream(m.a.ns, addr, 20, 0.05) for _ in range(5)]
        time.sleep(0.3)
        os.kill(victim, signal.SIGKILL)
        killed = time.monotonic()
        # The supervisor keeps the listening sockets: connections made now wait in the backlog
        # and are served by the new data plane (one attempt: not refused, not dropped).
        assert echo_roundtrip(m.a.ns, addr, b"after", timeout=20)[32:] == b"after"
        elapsed = time.monotonic() - killed
        assert elapsed < 15, f"first new connection took {elapsed:.2f}s: a restart that hangs"
        assert m.car_a.dataplane_pid() != victim
        for s in streams:
            s.join(10)
        # Connections the killed process carried are lost (no state survives a SIGKILL).
        assert not all(s.intact for s in streams)


def test_sigterm_drains_open_connections_within_the_deadline(tmp_path):
    with two_pod_mesh(tmp_path, extra_b=("--drain-deadline", "3s")) as m:
        addr = (m.b.ip, APP_PORT)
        streams = [SlowStream(m.a.ns, addr, 15, 0.1) for _ in range(3)]  # ~1.5 s each
        # The drain keeps flows B has opened; one still in its handshake when SIGTERM lands is
        # refused like any new connection. So wait until B has opened all three (a loaded CI
        # machine can take longer than any fixed sleep).
        _wait_for_opened(m.car_b, 3)
        start = time.monotonic()
        assert m.car_b.proc is not None
        m.car_b.proc.send_signal(signal.SIGTERM)
        code = m.car_b.proc.wait(30)
        took = time.monotonic() - start
        for s in streams:
            s.join(10)
        assert code == 0
        assert all(s.intact for s in streams), [
            (s.error, len(s.sent), len(s.reply)) for s in streams
        ]
        assert took < 3 + 12, f"exit {took:.1f}s after SIGTERM with a 3 s deadline: a hang"
        # After the drain, B accepts nothing: new connections fail.
        try:
            reply = echo_roundtrip(m.a.ns, addr, b"late", timeout=5)
        except OSError:
            reply = b""
        assert reply == b""


def test_certificate_rotation_keeps_open_connections_and_serves_new_ones(tmp_path):
    with two_pod_mesh(tmp_path) as m:
        addr = (m.b.ip, APP_PORT)
        before = m.car_b.config_dump()["certificates"][0]["certChain"][0]["serialNumber"]
        stream = SlowStream(m.a.ns, addr, 30, 0.05)
        time.sleep(0.2)
        m.ca.issue("b", SpiffeId(TD, "prod", "server"))  # same identity, new key and serial
        end = time.monotonic() + 10
        after = before
        while after == before and time.monotonic() < end:
            time.sleep(0.1)
            after = m.car_b.config_dump()["certificates"][0]["certChain"][0]["serialNumber"]
        assert after != before
        stream.join(15)
        assert stream.intact, stream.error
        assert echo_roundtrip(m.a.ns, addr, b"new")[32:] == b"new"
        assert metric_sum(m.car_b.metrics(), "istio_tcp_connections_failed_total") == 0
