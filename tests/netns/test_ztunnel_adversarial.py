"""No stream takes down its connection: an independent HTTP/2 peer resets streams at every point.

Node.js's ``http2`` (tests/interop/hbone_chaos.js) shares one HBONE connection between sibling
streams that move checksummed bytes both ways (uploads and downloads) and victim streams reset
at a chosen point: before and after the 200, mid-upload, mid-download, while one side is held
by flow control, and by the app behind the proxy (a TCP RST with bytes unread, as iperf3's
server does). Both roles: Node as the client of our :15008, and Node as the server our outbound
side pools streams to. Every sibling must arrive intact, on the one connection, and the guard in
conftest.py fails the test if any exception reached the data plane's event loop.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import random
import shutil
import socket
import struct
import subprocess
import threading
import time
from pathlib import Path

import pytest

from tests.netns.ztunnel_harness import pattern
from tests.netns.ztunnel_topology import APP_PORT, two_pod_mesh

pytestmark = [
    pytest.mark.netns,
    pytest.mark.skipif(shutil.which("node") is None, reason="needs Node.js (node) for interop"),
]

CHAOS = Path(__file__).resolve().parent.parent / "interop" / "hbone_chaos.js"
KiB, MiB = 1024, 1024 * 1024


def _client_plan(rng: random.Random, b_ip: str) -> list[dict]:
    echo, nobody = f"{b_ip}:{APP_PORT}", f"{b_ip}:9"
    plan = [
        {"authority": echo, "kind": rng.choice(["up", "down"]), "size": rng.randint(1, 1536) * KiB}
        for _ in range(30)
    ]
    victims = [
        {"kind": "reset_before_200"},
        {"kind": "reset_after_200"},
        {"kind": "reset_mid_upload", "size": 4 * MiB, "at": rng.randint(0, 1024) * KiB},
        {"kind": "reset_mid_download", "size": 8 * MiB, "at": rng.randint(16, 2048) * KiB},
        {"kind": "reset_blocked", "size": 16 * MiB, "at": rng.randint(200, 600)},
        {"kind": "app_reset", "size": 512 * KiB, "at": rng.randint(1, 200) * KiB},
        {"kind": "refused", "authority": nobody},
    ]
    for i in range(42):
        plan.append({"authority": echo, "size": 0, "at": 0, **victims[i % len(victims)]})
    rng.shuffle(plan)
    return plan


def test_node_client_resets_streams_anywhere_and_every_sibling_is_intact(tmp_path):
    seed = random.randrange(1 << 32)  # noqa: S311 (a reproducible plan, printed on failure)
    with two_pod_mesh(tmp_path) as m:
        pid = m.car_b.dataplane_pid()
        plan = _client_plan(random.Random(seed), m.b.ip)  # noqa: S311
        certs = m.tmp / "certs" / "a"
        argv = ["node", str(CHAOS), "client", m.b.ip, "15008", json.dumps(plan)]
        done = m.node.ns.run(
            [*argv, str(certs / "root-cert.pem"), str(certs)], check=False, timeout=180
        )
        result = json.loads(done.stdout.strip().splitlines()[-1])
        assert done.returncode == 0, (seed, result, done.stderr[-2000:])
        assert result["failures"] == [], (seed, result["failures"][:10])
        assert result["siblings"] == result["intact"] == 31  # 30 planned + one after the chaos
        assert result["victims"] == 42
        assert result["goaway"] is None  # the connection was never closed on it
        assert result["sessionError"] is None
        assert m.car_b.dataplane_pid() == pid  # and the data plane never went down


class _App:
    """Connections from pod A's app through its sidecar: siblings check bytes, victims don't."""

    def __init__(self, m, rng: random.Random) -> None:
        self.m = m
        self.rng = rng
        self.results: list[tuple[str, bool, str]] = []
        self._lock = threading.Lock()

    def _record(self, kind: str, ok: bool, detail: str = "") -> None:
        with self._lock:
            self.results.append((kind, ok, detail))

    def up(self, size: int) -> None:
        payload = self.rng.randbytes(size)
        try:
            reply = self._exchange(b"E" + payload, half_close=True)
            ok = reply == hashlib.sha256(payload).digest() + payload
            self._record("up", ok, f"{len(reply)} of {32 + size} bytes")
        except OSError as exc:
            self._record("up", False, str(exc))

    def down(self, size: int) -> None:
        try:
            reply = self._exchange(b"S" + size.to_bytes(8, "big"), half_close=False)
            self._record("down", reply == pattern(size), f"{len(reply)} of {size} bytes")
        except OSError as exc:
            self._record("down", False, str(exc))

    def victim(self, port: int, upload: int, abort_after: float | None = None) -> None:
        """Send ``upload`` bytes to a Node behaviour port (or the echo, to abort ourselves)."""
        with contextlib.suppress(OSError), self.m.a.ns.socket() as s:
            s.settimeout(30)
            s.connect((self.m.b.ip, port))
            if abort_after is not None:  # the app resets its own connection mid-transfer
                s.sendall(b"S" + (8 * MiB).to_bytes(8, "big") if upload == 0 else b"E")
                end = time.monotonic() + abort_after
                while time.monotonic() < end:
                    if upload:
                        s.sendall(b"v" * 16 * KiB)
                    else:
                        s.recv(64 * KiB)
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                return
            piece = b"x" * 64 * KiB
            for _ in range(upload // len(piece)):
                s.sendall(piece)
            s.shutdown(socket.SHUT_WR)
            while s.recv(64 * KiB):
                pass
        self._record("victim", True)

    def _exchange(self, request: bytes, *, half_close: bool) -> bytes:
        with self.m.a.ns.socket() as s:
            s.settimeout(60)
            s.connect((self.m.b.ip, APP_PORT))
            s.sendall(request)
            if half_close:
                s.shutdown(socket.SHUT_WR)
            chunks = []
            while chunk := s.recv(256 * KiB):
                chunks.append(chunk)
            if not half_close:
                s.shutdown(socket.SHUT_WR)
            return b"".join(chunks)


def test_node_server_resets_streams_anywhere_and_every_pooled_sibling_is_intact(tmp_path):
    seed = random.randrange(1 << 32)  # noqa: S311 (a reproducible plan, printed on failure)
    rng = random.Random(seed)  # noqa: S311
    with two_pod_mesh(tmp_path, start_b=False) as m:
        argv = ["node", str(CHAOS), "server", m.b.ip, "15008", str(m.tmp / "certs" / "b")]
        server = m.b.ns.popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            assert server.stdout is not None
            assert json.loads(server.stdout.readline()) == {"listening": 15008}
            app = _App(m, rng)
            jobs = []
            for _ in range(15):
                jobs.append((app.up, (rng.randint(1, 1536) * KiB,)))
                jobs.append((app.down, (rng.randint(1, 2048) * KiB,)))
            for port in (9101, 9102, 9103, 9104, 9105) * 6:  # Node resets these
                jobs.append((app.victim, (port, rng.randint(1, 32) * 64 * KiB)))
            for _ in range(5):  # the app resets its own connection mid-upload / mid-download
                jobs.append((app.victim, (APP_PORT, 1, rng.uniform(0.05, 0.5))))
                jobs.append((app.victim, (APP_PORT, 0, rng.uniform(0.05, 0.5))))
            rng.shuffle(jobs)
            threads = [threading.Thread(target=f, args=a, daemon=True) for f, a in jobs]
            for t in threads:
                t.start()
            for t in threads:
                t.join(120)
            after = app.results[:]
            app.up(100 * KiB)  # the pooled connection still carries a new stream
            pooled = m.car_a.config_dump()["connections"]["pooled"]
        finally:
            server.terminate()
            out, err = server.communicate(timeout=10)
        stats = json.loads(out.decode().strip().splitlines()[-1])
        siblings = [r for r in [*after, app.results[-1]] if r[0] in ("up", "down")]
        bad = [r for r in siblings if not r[1]]
        assert not bad, (seed, bad[:10])
        assert len(siblings) == 31
        assert stats["sessionErrors"] == [], (seed, stats, err.decode()[-2000:])
        assert stats["sessions"] == 1, (seed, stats)  # one pooled connection carried it all
        assert pooled == 1
