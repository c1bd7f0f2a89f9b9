"""Operating ``meshctl gateway run``: readiness, Istio's request metrics, the admin dump, a
config change while a request is in flight, the drain on SIGTERM, its own port taken, and
``meshctl gateway routes`` / ``explain`` over the same files and a running gateway."""

from __future__ import annotations

import http.client
import json
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
from tests.harness.cli import run_meshctl


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
    conn.request("GET", path, headers={"Host": host})
    response = conn.getresponse()
    return response.status, response.read(), {k.lower(): v for k, v in response.getheaders()}


def test_metrics_count_requests_with_istios_names_and_labels(tmp_path):
    with gw.backend() as web, gw.run_gateway(tmp_path, _objects(web), listener_ports=(80,)) as proc:
        for _ in range(3):
            assert _get(proc.port(80), "/api/m")[0] == 200
        assert _get(proc.port(80), "/nowhere")[0] == 404
        status, text, _ = _get(15020 + proc.offset, "/stats/prometheus")
    assert status == 200
    lines = text.decode().splitlines()
    ok = [
        line
        for line in lines
        if line.startswith("istio_requests_total{") and 'response_code="200"' in line
    ]
    assert len(ok) == 1
    assert 'destination_service="web.app.svc.cluster.local"' in ok[0]
    assert 'destination_service_name="web"' in ok[0]
    assert 'reporter="source"' in ok[0]
    assert ok[0].endswith(" 3.0")
    assert any(
        line.startswith("istio_requests_total{") and 'response_code="404"' in line for line in lines
    )
    assert any(line.startswith("istio_request_duration_milliseconds_bucket{") for line in lines)


def test_config_dump_shows_the_route_table_per_listener(tmp_path):
    with gw.backend() as web, gw.run_gateway(tmp_path, _objects(web), listener_ports=(80,)) as proc:
        status, text, _ = _get(15000 + proc.offset, "/config_dump")
    dump = json.loads(text)
    assert status == 200
    assert dump["gateway"] == "infra/gw"
    listener = dump["routes"]["ports"][0]["listeners"][0]
    assert listener["listener"] == "infra/gw/http"
    assert listener["hosts"][0]["hostname"] == "example.com"
    assert listener["hosts"][0]["routes"][0]["route"] == "HTTPRoute app/web rules[0]"
    assert dump["endpoints"] == {"app/web:80": [f"127.0.0.1:{web.port}"]}


def test_readiness_waits_for_the_listeners_and_says_why_not(tmp_path):
    offset = gw.free_offset((80,))
    config = tmp_path / "gw.yaml"
    with gw.backend() as web:
        gw.write_objects(config, _objects(web))
        holder = socket.socket()
        holder.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        holder.bind(("127.0.0.1", 80 + offset))
        holder.listen()
        proc = subprocess.Popen(
            [
                *(sys.executable, "-m", "meshctl", "gateway", "run", "-f", str(config)),
                *("--bind-address", "127.0.0.1", "--port-offset", str(offset)),
                *("--reload-interval", "200ms"),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path)},
        )
        try:
            deadline = time.monotonic() + 20
            while True:
                try:
                    status, body, _ = _get(15021 + offset, "/healthz/ready")
                    break
                except OSError:
                    assert time.monotonic() < deadline
                    time.sleep(0.1)
            assert status == 503
            assert b"listeners not bound" in body
            assert f"127.0.0.1:{80 + offset}".encode() in body
            holder.close()
            deadline = time.monotonic() + 10
            while _get(15021 + offset, "/healthz/ready")[0] != 200:
                assert time.monotonic() < deadline
                time.sleep(0.1)
            assert _get(80 + offset, "/api/x")[0] == 200
        finally:
            holder.close()
            proc.terminate()
            proc.wait(10)


def test_a_config_change_keeps_the_request_in_flight_and_serves_the_new_route(tmp_path):
    with gw.backend() as web, gw.run_gateway(tmp_path, _objects(web), listener_ports=(80,)) as proc:
        result: dict[str, Any] = {}

        def slow() -> None:
            result["answer"] = _get(proc.port(80), "/api/slow/1.5")

        thread = threading.Thread(target=slow)
        thread.start()
        time.sleep(0.3)
        assert _get(proc.port(80), "/extra/x")[0] == 404
        gw.write_objects(proc.config, _objects(web, gw.rule("/extra", "web:80")))
        deadline = time.monotonic() + 10
        while _get(proc.port(80), "/extra/x")[0] != 200:
            assert time.monotonic() < deadline
            time.sleep(0.1)
        thread.join(10)
        assert result["answer"][0] == 200
        assert json.loads(result["answer"][1])["path"] == "/api/slow/1.5"


def test_sigterm_finishes_the_request_in_flight_then_stops_accepting(tmp_path):
    with gw.backend() as web, gw.run_gateway(tmp_path, _objects(web), listener_ports=(80,)) as proc:
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


def test_an_own_port_in_use_stops_the_gateway_at_start_with_exit_1(tmp_path):
    offset = gw.free_offset((80,))
    config = tmp_path / "gw.yaml"
    config.write_text(gw.MINIMAL)
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 15021 + offset))
        holder.listen()
        done = run_meshctl(
            *("gateway", "run", "-f", str(config), "--bind-address", "127.0.0.1"),
            *("--port-offset", str(offset)),
            env={"HOME": str(tmp_path)},
            timeout=30,
        )
    assert done.returncode == 1, done.stderr
    errors = [line for line in done.stderr.splitlines() if line.startswith("Error: ")]
    assert len(errors) == 1
    assert f"127.0.0.1:{15021 + offset}" in errors[0]
    assert errors[0].endswith("the port is already in use")
    # The error and its hint are all: no warning of a config source that never started.
    assert "never awaited" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 2, done.stderr


def _routes_objects(tmp_path: Path) -> Path:
    config = tmp_path / "gw.yaml"
    gw.write_objects(
        config,
        [
            gw.gateway_class(),
            gw.gateway(gw.http_listener()),
            gw.route(
                "web",
                [
                    gw.rule("/api", "web:80"),
                    {"matches": [{"path": {"type": "Exact", "value": "/x"}}]},
                ],
                hostnames=["example.com"],
            ),
            gw.service("web"),
        ],
    )
    return config


def test_routes_prints_the_table_from_the_files_as_a_table_and_as_json(tmp_path):
    config = _routes_objects(tmp_path)
    done = run_meshctl("gateway", "routes", "-f", str(config))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[0].split() == ["PORT", "LISTENER", "HOST", "MATCH", "ROUTE", "BACKENDS"]
    assert any("/x" in line and "(none: 500)" in line for line in lines[1:])
    assert any("app/web:80" in line and "example.com" in line for line in lines[1:])
    assert any("(none: 500)" in line for line in lines[1:])
    done = run_meshctl("gateway", "routes", "gw", "-n", "infra", "-f", str(config), "-o", "json")
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["gateway"] == "infra/gw"
    assert data["ports"][0]["port"] == 80


def test_routes_reads_a_running_gateways_admin_port(tmp_path):
    with gw.backend() as web, gw.run_gateway(tmp_path, _objects(web), listener_ports=(80,)) as proc:
        done = run_meshctl(
            "gateway", "routes", "--admin", f"127.0.0.1:{15000 + proc.offset}", "-o", "json"
        )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["routes"]["ports"][0]["listeners"][0]["listener"] == (
        "infra/gw/http"
    )


def test_routes_without_a_running_gateway_says_so(tmp_path):
    done = run_meshctl("gateway", "routes", "--admin", f"127.0.0.1:{gw.free_offset(()) + 1}")
    assert done.returncode != 0
    assert "no gateway answers at" in done.stderr
    assert "Traceback" not in done.stderr


def test_explain_names_the_rule_and_backend_or_why_none(tmp_path):
    config = _routes_objects(tmp_path)
    done = run_meshctl(
        "gateway", "explain", "http://example.com/api/v1", "-f", str(config), "-o", "json"
    )
    assert done.returncode == 0, done.stderr
    data = json.loads(done.stdout)
    assert data["outcome"] == "forward"
    assert data["listener"] == "infra/gw/http"
    assert data["reason"] == "HTTPRoute app/web rules[0]"
    assert data["backends"] == ["app/web:80 weight 1"]
    done = run_meshctl(
        "gateway", "explain", "http://other.example/", "-f", str(config), "-o", "json"
    )
    data = json.loads(done.stdout)
    assert (data["outcome"], data["status"]) == ("no-route", 404)
    assert data["reason"] == "no-route (host other.example)"
    done = run_meshctl(
        "gateway", "explain", "http://example.com/x", "-f", str(config), "-o", "json"
    )
    data = json.loads(done.stdout)
    assert (data["outcome"], data["status"]) == ("no-backend", 500)


def test_explain_says_when_the_connection_itself_would_be_refused(tmp_path):
    config = _routes_objects(tmp_path)
    done = run_meshctl("gateway", "explain", "https://example.com/api", "-f", str(config))
    assert done.returncode == 0, done.stderr
    assert "connection: 'refused: nothing listens on port 443'" in done.stdout, done.stdout
    done = run_meshctl("gateway", "explain", "http://example.com/api", "-f", str(config))
    assert "connection:" not in done.stdout, done.stdout
    chain, key = gw.server_cert("a.example.com")
    tls = tmp_path / "tls.yaml"
    gw.write_objects(
        tls,
        [
            gw.gateway_class(),
            gw.gateway(gw.https_listener("a", "a.example.com", "a-cert")),
            gw.tls_secret("a-cert", chain, key),
        ],
    )
    done = run_meshctl("gateway", "explain", "https://b.example.com/", "-f", str(tls))
    assert done.returncode == 0, done.stderr
    assert (
        "connection: 'TLS handshake refused: no HTTPS listener on port 443 covers b.example.com'"
    ) in done.stdout, done.stdout


def test_explain_refuses_what_is_not_an_http_url(tmp_path):
    config = _routes_objects(tmp_path)
    done = run_meshctl("gateway", "explain", "ftp://example.com/", "-f", str(config))
    assert done.returncode == 2
    assert "is not an http(s) URL" in done.stderr
    for url in ("http://[::1/", "http://example.com:99999/"):
        done = run_meshctl("gateway", "explain", url, "-f", str(config))
        assert done.returncode == 2, done.stderr
        assert "internal error" not in done.stderr
        assert done.stderr.startswith(f"Error: {url!r} is not a URL"), done.stderr
