"""``meshctl gateway run --workers 2``: a supervisor and two worker processes on loopback. Both
workers serve the listener port (the supervisor's socket, one accept queue), a killed one is
replaced while requests under load keep succeeding (none reset), the metrics are the sum over
both, a config change (routes, and listener ports added or removed) reaches both, and SIGTERM
drains them."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from tests.harness import gateway as gw

WORKERS = ("--workers", "2")


def _objects(web: gw.Backend, *extra_rules: dict[str, Any]) -> list[dict[str, Any]]:
    return [
        gw.gateway_class(),
        gw.gateway(gw.http_listener()),
        gw.route("web", [gw.rule("/api", "web:80"), *extra_rules], hostnames=["example.com"]),
        gw.service("web"),
        gw.endpoint_slice("web", [("127.0.0.1", True)], web.port),
    ]


def _get(port: int, path: str, host: str = "example.com") -> tuple[int, bytes, dict[str, str]]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": host})
        response = conn.getresponse()
        return response.status, response.read(), {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()


def _workers(proc: gw.Running) -> dict[int, int]:
    """Worker index -> pid, from the supervisor's /config_dump."""
    status, body, _ = _get(15000 + proc.offset, "/config_dump")
    assert status == 200
    return {w["index"]: w["pid"] for w in json.loads(body)["workers"]}


def _serving_workers(proc: gw.Running, path: str) -> set[str]:
    """The ``worker=N pid=P`` of every access-log line for ``path``."""
    pattern = re.compile(r"\[gateway (worker=\d+ pid=\d+)\] \"GET " + re.escape(path) + " ")
    return set(pattern.findall(proc.output()))


def _spread(proc: gw.Running, path: str, count: int = 40) -> None:
    """``count`` requests on new connections (each hashed to a worker by its source port)."""
    for _ in range(count):
        assert _get(proc.port(80), path)[0] == 200


def _wait_for(what: Any, timeout: float = 10.0) -> Any:
    deadline = time.monotonic() + timeout
    while not (value := what()):
        assert time.monotonic() < deadline
        time.sleep(0.1)
    return value


def test_two_workers_both_serve_requests_on_the_listener_port(tmp_path: Path) -> None:
    with (
        gw.backend() as web,
        gw.run_gateway(tmp_path, _objects(web), listener_ports=(80,), args=WORKERS) as proc,
    ):
        pids = _workers(proc)
        assert sorted(pids) == [0, 1]
        assert os.getpid() not in pids.values()
        _spread(proc, "/api/both")
        expected = {f"worker={i} pid={pid}" for i, pid in pids.items()}
        assert _wait_for(lambda: _serving_workers(proc, "/api/both") == expected)


def test_a_killed_worker_is_replaced_and_requests_keep_succeeding(tmp_path: Path) -> None:
    with (
        gw.backend() as web,
        gw.run_gateway(tmp_path, _objects(web), listener_ports=(80,), args=WORKERS) as proc,
    ):
        before = _workers(proc)
        stop = threading.Event()
        load: list[int] = []

        def hammer() -> None:  # new connections queue on the port while worker 1 dies
            while not stop.is_set():
                try:
                    load.append(_get(proc.port(80), "/api/load")[0])
                except (OSError, http.client.HTTPException):
                    load.append(-1)

        threads = [threading.Thread(target=hammer) for _ in range(4)]
        for thread in threads:
            thread.start()
        time.sleep(0.3)
        os.kill(before[1], signal.SIGKILL)
        killed = len(load)  # what worker 1 had already accepted when it died may be lost
        deadline = time.monotonic() + 15
        while _workers(proc).get(1) in (None, before[1]):
            assert time.monotonic() < deadline
            assert _get(proc.port(80), "/api/meanwhile")[0] == 200
            time.sleep(0.05)
        time.sleep(0.3)
        stop.set()
        for thread in threads:
            thread.join(10)
        assert len(load) > killed + 20
        assert set(load[killed + 8 :]) == {200}  # 4 threads: at most 2 in flight each at kill
        after = _workers(proc)
        assert after[0] == before[0]
        assert after[1] != before[1]
        _wait_for(lambda: _get(15021 + proc.offset, "/healthz/ready")[0] == 200)
        _spread(proc, "/api/after")
        assert f"worker=1 pid={after[1]}" in _serving_workers(proc, "/api/after")
        assert "exited with -9" in proc.output()


def test_metrics_are_the_sum_over_both_workers(tmp_path: Path) -> None:
    with (
        gw.backend() as web,
        gw.run_gateway(tmp_path, _objects(web), listener_ports=(80,), args=WORKERS) as proc,
    ):
        _spread(proc, "/api/counted", count=30)
        assert len(_wait_for(lambda: _serving_workers(proc, "/api/counted"))) == 2
        status, text, _ = _get(15020 + proc.offset, "/stats/prometheus")
    assert status == 200
    ok = [
        line
        for line in text.decode().splitlines()
        if line.startswith("istio_requests_total{") and 'response_code="200"' in line
    ]
    assert len(ok) == 1
    assert ok[0].endswith(" 30.0")
    assert 'destination_service_name="web"' in ok[0]


def test_a_config_change_reaches_every_worker(tmp_path: Path) -> None:
    with (
        gw.backend() as web,
        gw.run_gateway(tmp_path, _objects(web), listener_ports=(80,), args=WORKERS) as proc,
    ):
        assert _get(proc.port(80), "/extra/x")[0] == 404
        gw.write_objects(proc.config, _objects(web, gw.rule("/extra", "web:80")))
        _wait_for(lambda: _get(proc.port(80), "/extra/x")[0] == 200)
        time.sleep(0.3)  # every worker got the update in the same broadcast
        _spread(proc, "/extra/new")
        pids = _workers(proc)
        expected = {f"worker={i} pid={pid}" for i, pid in pids.items()}
        assert _wait_for(lambda: _serving_workers(proc, "/extra/new") == expected)


def test_sigterm_drains_every_worker_with_a_request_in_flight(tmp_path: Path) -> None:
    with (
        gw.backend() as web,
        gw.run_gateway(tmp_path, _objects(web), listener_ports=(80,), args=WORKERS) as proc,
    ):
        pids = _workers(proc)
        result: dict[str, Any] = {}

        def slow() -> None:
            result["answer"] = _get(proc.port(80), "/api/slow/1")

        thread = threading.Thread(target=slow)
        thread.start()
        time.sleep(0.3)
        proc.proc.send_signal(signal.SIGTERM)
        time.sleep(0.3)
        with pytest.raises(ConnectionRefusedError):
            _get(proc.port(80), "/api/new")
        thread.join(10)
        assert result["answer"][0] == 200
        assert result["answer"][2]["connection"] == "close"
        assert proc.proc.wait(10) == 0
        assert "draining: 1 connection(s), 1 request(s) in flight" in proc.output()
        for pid in pids.values():
            with pytest.raises(ProcessLookupError):
                os.kill(pid, 0)


def test_a_listener_port_added_and_removed_at_run_time_reaches_every_worker(
    tmp_path: Path,
) -> None:
    def objects(web: gw.Backend, *ports: int) -> list[dict[str, Any]]:
        listeners = [gw.http_listener(f"http-{p}", port=p) for p in ports]
        return [
            gw.gateway_class(),
            gw.gateway(*listeners),
            gw.route("web", [gw.rule("/api", "web:80")], hostnames=["example.com"]),
            gw.service("web"),
            gw.endpoint_slice("web", [("127.0.0.1", True)], web.port),
        ]

    with (
        gw.backend() as web,
        gw.run_gateway(tmp_path, objects(web, 80), listener_ports=(80, 8081), args=WORKERS) as proc,
    ):
        with pytest.raises(ConnectionRefusedError):
            _get(proc.port(8081), "/api/x")
        gw.write_objects(proc.config, objects(web, 80, 8081))

        def served() -> bool:
            try:
                return _get(proc.port(8081), "/api/x")[0] == 200
            except ConnectionRefusedError:
                return False

        _wait_for(served)
        for _ in range(40):
            assert _get(proc.port(8081), "/api/added")[0] == 200
        pids = _workers(proc)
        expected = {f"worker={i} pid={pid}" for i, pid in pids.items()}
        assert _wait_for(lambda: _serving_workers(proc, "/api/added") == expected)
        gw.write_objects(proc.config, objects(web, 80))
        _wait_for(lambda: not served())
        with pytest.raises(ConnectionRefusedError):
            _get(proc.port(8081), "/api/gone")
        assert _get(proc.port(80), "/api/still")[0] == 200


def test_readiness_waits_for_every_worker_to_bind_the_listeners(tmp_path: Path) -> None:
    offset = gw.free_offset((80,))
    config = tmp_path / "gw.yaml"
    with gw.backend() as web:
        gw.write_objects(config, _objects(web))
        holder = socket.socket()  # the gateway's supervisor cannot bind this port
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 80 + offset))
        holder.listen()
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "meshctl", "gateway", "run", "-f", str(config)),
                *("--bind-address", "127.0.0.1", "--port-offset", str(offset)),
                *("--reload-interval", "200ms", *WORKERS),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
        try:

            def answer() -> tuple[int, bytes, dict[str, str]] | None:
                try:
                    return _get(15021 + offset, "/healthz/ready")
                except OSError:
                    return None

            status, body, _ = _wait_for(answer, timeout=20)
            time.sleep(1)  # both workers started and tried the port
            status, body, _ = _get(15021 + offset, "/healthz/ready")
            assert status == 503
            assert body.startswith(b"not ready: listeners not bound: 80: ")
            assert f"127.0.0.1:{80 + offset}".encode() in body
            holder.close()
            _wait_for(lambda: _get(15021 + offset, "/healthz/ready")[0] == 200)
            assert _get(80 + offset, "/api/x")[0] == 200
        finally:
            holder.close()
            proc.terminate()
            assert proc.wait(10) == 0
