"""``meshctl gateway routes`` and ``explain`` over TLS passthrough and TCP listeners: their rows
(no match column) and ``tls://NAME:PORT`` / ``tcp://:PORT`` connections explained, with what the
wire shows when nothing is routed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.harness import gateway as gw
from tests.harness.cli import run_meshctl


def _route(kind: str, name: str, section: str, hostnames: list[str]) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parentRefs": [{"name": "gw", "namespace": "infra", "sectionName": section}],
        "rules": [{"backendRefs": [{"name": name, "port": 443}]}],
    }
    if hostnames:
        spec["hostnames"] = hostnames
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": kind,
        "metadata": {"name": name, "namespace": "app", "creationTimestamp": "2026-01-01T00:00:00Z"},
        "spec": spec,
    }


def _objects(tmp_path: Path) -> Path:
    every = {"namespaces": {"from": "All"}}
    path = tmp_path / "objects.yaml"
    gw.write_objects(
        path,
        [
            gw.gateway_class(),
            gw.gateway(
                {
                    "name": "tls",
                    "port": 443,
                    "protocol": "TLS",
                    "tls": {"mode": "Passthrough"},
                    "allowedRoutes": every,
                },
                {"name": "tcp", "port": 31400, "protocol": "TCP", "allowedRoutes": every},
            ),
            _route("TLSRoute", "a", "tls", ["a.example.com"]),
            _route("TCPRoute", "db", "tcp", []),
            gw.service("a", ports=(443,)),
            gw.service("db", ports=(443,)),
        ],
    )
    return path


def _explain(config: Path, url: str) -> dict[str, Any]:
    done = run_meshctl("gateway", "explain", url, "-f", str(config), "-o", "json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def test_routes_lists_tls_and_tcp_rows_without_a_match(tmp_path):
    done = run_meshctl("gateway", "routes", "-f", str(_objects(tmp_path)), "-o", "json")
    assert done.returncode == 0, done.stderr
    ports = {p["port"]: p for p in json.loads(done.stdout)["ports"]}
    assert ports[443]["protocol"] == "TLS"
    tls_row = ports[443]["listeners"][0]["hosts"][0]["routes"][0]
    assert tls_row == {"route": "TLSRoute app/a rules[0]", "backends": ["app/a:443 weight 1"]}
    assert ports[31400]["protocol"] == "TCP"
    table = run_meshctl("gateway", "routes", "-f", str(_objects(tmp_path)))
    assert table.returncode == 0, table.stderr
    assert "443/TLS" in table.stdout
    assert "31400/TCP" in table.stdout
    assert "TCPRoute app/db rules[0]" in table.stdout


def test_explain_a_tls_connection_by_its_sni(tmp_path):
    config = _objects(tmp_path)
    data = _explain(config, "tls://a.example.com:443")
    assert (data["outcome"], data["reason"]) == ("forward", "TLSRoute app/a rules[0]")
    assert data["listener"] == "infra/gw/tls"
    assert "connection" not in data
    data = _explain(config, "tls://b.example.com")  # 443 by default
    assert data["outcome"] == "no-route"
    assert data["connection"] == "closed"
    assert _explain(config, "tls://:443")["reason"] == "no-route (sni (none): no route)"


def test_explain_a_tcp_connection_by_its_port(tmp_path):
    config = _objects(tmp_path)
    data = _explain(config, "tcp://:31400")
    assert (data["outcome"], data["backends"]) == ("forward", ["app/db:443 weight 1"])
    assert _explain(config, "tcp://:9")["connection"] == "refused: nothing listens on port 9"
    assert _explain(config, "tcp://:443")["connection"] == "port 443 is a TLS listener, not TCP"
    done = run_meshctl("gateway", "explain", "tcp://db", "-f", str(config))
    assert done.returncode == 2
    assert "names no port" in done.stderr
