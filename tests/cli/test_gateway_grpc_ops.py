"""``meshctl gateway routes`` and ``explain`` over GRPCRoutes: their rows (the method match as
``grpc service/method``), and ``grpc://HOST/pkg.Service/Method`` calls explained with the gRPC
status the gateway answers when it routes them nowhere."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from tests.harness import gateway as gw
from tests.harness.cli import run_meshctl


def _objects(tmp_path: Path) -> Path:
    grpc_route = gw.route(
        "rpc",
        [
            {
                "matches": [{"method": {"service": "pkg.Echo", "method": "Echo"}}],
                "backendRefs": [{"name": "echo", "port": 9000}],
            },
            {
                "matches": [{"headers": [{"name": "version", "value": "two"}]}],
                "backendRefs": [{"name": "gone", "port": 9000}],
            },
        ],
    )
    grpc_route["kind"] = "GRPCRoute"
    path = tmp_path / "objects.yaml"
    gw.write_objects(
        path,
        [
            gw.gateway_class(),
            gw.gateway(gw.http_listener()),
            grpc_route,
            gw.service("echo", ports=(9000,)),
        ],
    )
    return path


def _explain(config: Path, url: str, *args: str) -> dict[str, Any]:
    done = run_meshctl("gateway", "explain", url, *args, "-f", str(config), "-o", "json")
    assert done.returncode == 0, done.stderr
    data: dict[str, Any] = json.loads(done.stdout)
    return data


def test_routes_lists_grpcroute_rows_with_their_method_match(tmp_path):
    done = run_meshctl("gateway", "routes", "-f", str(_objects(tmp_path)), "-o", "json")
    assert done.returncode == 0, done.stderr
    rows = json.loads(done.stdout)["ports"][0]["listeners"][0]["hosts"][0]["routes"]
    assert [(r["match"], r["route"]) for r in rows] == [
        ("grpc pkg.Echo/Echo", "GRPCRoute app/rpc rules[0]"),
        ("grpc */* header[version]=two", "GRPCRoute app/rpc rules[1]"),
    ]


def test_explain_a_grpc_call_routed_and_the_status_of_one_routed_nowhere(tmp_path):
    config = _objects(tmp_path)
    data = _explain(config, "grpc://gw.example/pkg.Echo/Echo")
    assert (data["outcome"], data["reason"]) == ("forward", "GRPCRoute app/rpc rules[0]")
    assert "grpcStatus" not in data
    data = _explain(config, "grpc://gw.example/pkg.Other/Call")
    assert data["outcome"] == "no-route"
    assert data["grpcStatus"] == "12 UNIMPLEMENTED (HTTP 200, trailers-only)"
    data = _explain(config, "grpc://gw.example/pkg.Other/Call", "-H", "version:two")
    assert data["outcome"] == "no-backend"
    assert data["grpcStatus"] == "14 UNAVAILABLE (HTTP 200, trailers-only)"
    # the same path as a plain HTTP request takes no GRPCRoute row
    assert _explain(config, "http://gw.example/pkg.Echo/Echo")["outcome"] == "no-route"
