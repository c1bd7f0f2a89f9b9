"""``meshctl gateway run -f`` into the mesh: a meshed endpoint (its Pod ambient) is reached by
HBONE with the gateway's own SPIFFE identity (mounted files, or from the mesh CA); a peer with
another identity is refused (503)."""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import os
import re
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

from tests.harness import gateway as gw
from tests.harness.cli import MESHCTL


def _certs(tmp: Path, workload: str, name: str) -> Path:
    out = tmp / name
    subprocess.run(
        [
            *MESHCTL,
            "ztunnel",
            "certs",
            "--out",
            str(out),
            "--workload",
            workload,
            "--ca-dir",
            str(tmp / "ca"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    return out


def _objects(address: str, port: int, account: str) -> list[dict[str, Any]]:
    slice_ = gw.endpoint_slice("web", [(address, True)], port)
    slice_["endpoints"][0]["targetRef"] = {"kind": "Pod", "name": "web-0", "namespace": "app"}
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": "web-0",
            "namespace": "app",
            "labels": {"istio.io/dataplane-mode": "ambient"},
        },
        "spec": {"serviceAccountName": account},
    }
    return [
        gw.gateway_class(),
        gw.gateway(gw.http_listener()),
        gw.route("web", [gw.rule("/", "web:80")]),
        gw.service("web"),
        slice_,
        pod,
    ]


def _get(port: int) -> tuple[int, bytes, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", "/mesh/x", headers={"Host": "example.com"})
    response = conn.getresponse()
    return response.status, response.read(), response.getheader("x-meshctl-route") or ""


def _env(tmp: Path, gateway_certs: Path) -> dict[str, str]:
    return {
        "POD_NAMESPACE": "infra",
        "SERVICE_ACCOUNT": "gw-sa",
        "MESHCTL_CERT_DIR": str(gateway_certs),
        "HOME": str(tmp),
    }


def test_a_meshed_endpoint_is_reached_over_hbone_with_the_gateways_identity(tmp_path):
    gateway_certs = _certs(tmp_path, "infra/gw/gw-sa", "gateway")
    peer_certs = _certs(tmp_path, "app/web-0/web", "web")
    with gw.backend() as web, gw.hbone_peer(peer_certs, web.port) as peer:
        objects = _objects(peer.address, 8080, "web")
        with gw.run_gateway(
            tmp_path, objects, listener_ports=(80,), env=_env(tmp_path, gateway_certs)
        ) as proc:
            status, body, _ = _get(proc.port(80))
            assert status == 200, proc.output()
            assert json.loads(body)["path"] == "/mesh/x"
            status, _, _ = _get(proc.port(80))  # a second request: the pooled tunnel again
            assert status == 200
            conn = http.client.HTTPConnection("127.0.0.1", proc.port(80), timeout=20)
            conn.request("GET", "/big/3000000", headers={"Host": "example.com"})
            response = conn.getresponse()
            assert response.status == 200
            assert response.read() == bytes(i % 251 for i in range(3_000_000))
            payload = os.urandom(2_000_000)
            conn.request("POST", "/mesh/upload", body=payload, headers={"Host": "example.com"})
            response = conn.getresponse()
            assert base64.b64decode(json.loads(response.read())["body"]) == payload
            log = proc.output()
    assert peer.seen[0] == {
        "authority": f"{peer.address}:8080",
        "san": ["spiffe://cluster.local/ns/infra/sa/gw-sa"],
    }
    assert "identity=spiffe://cluster.local/ns/app/sa/web" in log


def test_a_peer_without_the_endpoints_identity_is_refused_with_503(tmp_path):
    gateway_certs = _certs(tmp_path, "infra/gw/gw-sa", "gateway")
    impostor = _certs(tmp_path, "app/web-0/other", "impostor")
    with gw.backend() as web, gw.hbone_peer(impostor, web.port) as peer:
        objects = _objects(peer.address, 8080, "web")
        with gw.run_gateway(
            tmp_path, objects, listener_ports=(80,), env=_env(tmp_path, gateway_certs)
        ) as proc:
            status, _, reason = _get(proc.port(80))
    assert status == 503
    assert "server identity refused" in reason
    assert web.seen == []


def test_a_meshed_endpoint_without_a_gateway_certificate_is_503_saying_why(tmp_path):
    with gw.backend() as web:
        objects = _objects("127.0.0.1", web.port, "web")
        with gw.run_gateway(
            tmp_path, objects, listener_ports=(80,), env={"HOME": str(tmp_path)}
        ) as proc:
            status, _, reason = _get(proc.port(80))
    assert status == 503
    assert "no mesh certificate" in reason


def _start_ca(tmp: Path) -> tuple[subprocess.Popen[str], int]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    tokens = tmp / "tokens.csv"
    tokens.write_text(
        "tok-gw,system:serviceaccount:infra:gw-sa,u1\ntok-web,system:serviceaccount:app:web,u2\n"
    )
    proc = subprocess.Popen(
        [
            *MESHCTL,
            "controlplane",
            "ca",
            "--ca-dir",
            str(tmp / "ca"),
            "--tokens",
            str(tokens),
            "--grpc-address",
            f"127.0.0.1:{port}",
            "--serving-names",
            "127.0.0.1",
        ],
        stderr=subprocess.PIPE,
        text=True,
    )
    end = time.monotonic() + 30
    while time.monotonic() < end:
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, port
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the CA did not listen")


def _certs_from_ca(tmp: Path, port: int, token: str, account: str) -> Path:
    """The peer's certificate as the CA issues it to the workload (its own token)."""
    from meshctl import rpc
    from meshctl.core.pki import certs
    from meshctl.core.pki.identity import SpiffeId
    from meshctl.proxy.ca_client import CaClient

    roots = (tmp / "ca" / "ca-cert.pem").read_bytes()
    identity = SpiffeId("cluster.local", "app", account)

    async def ask() -> tuple[list[str], bytes]:
        client = CaClient(f"127.0.0.1:{port}", auth=rpc.CallAuth(token=token))
        try:
            csr, key = certs.new_csr(identity)
            return await client.create(csr, roots=roots, ttl_seconds=3600), key
        finally:
            await client.close()

    chain, key = asyncio.run(ask())
    out = tmp / account
    out.mkdir()
    (out / "cert-chain.pem").write_text("".join(chain))
    (out / "key.pem").write_bytes(key)
    (out / "root-cert.pem").write_bytes(roots)
    return out


def test_without_mounted_files_the_gateway_gets_its_certificate_from_the_ca(tmp_path):
    ca, port = _start_ca(tmp_path)
    try:
        peer_certs = _certs_from_ca(tmp_path, port, "tok-web", "web")
        env = {
            "POD_NAMESPACE": "infra",
            "SERVICE_ACCOUNT": "gw-sa",
            "MESHCTL_CERT_DIR": str(tmp_path / "no-files"),
            "CA_ADDRESS": f"127.0.0.1:{port}",
            "CA_ROOT_CA": str(tmp_path / "ca" / "ca-cert.pem"),
            "AUTH_TOKEN": "tok-gw",
            "HOME": str(tmp_path),
        }
        with gw.backend() as web, gw.hbone_peer(peer_certs, web.port) as peer:
            objects = _objects(peer.address, 8080, "web")
            with gw.run_gateway(tmp_path, objects, listener_ports=(80,), env=env) as proc:
                deadline = time.monotonic() + 20
                while (answer := _get(proc.port(80)))[0] != 200:
                    assert time.monotonic() < deadline, (answer, proc.output())
                    time.sleep(0.2)
                log = proc.output()
        assert peer.seen[-1]["san"] == ["spiffe://cluster.local/ns/infra/sa/gw-sa"]
        assert "certificates from the CA at 127.0.0.1:" in log
    finally:
        ca.terminate()
        ca.wait(10)


def test_every_worker_dials_hbone_with_the_certificate_its_supervisor_holds(tmp_path):
    gateway_certs = _certs(tmp_path, "infra/gw/gw-sa", "gateway")
    peer_certs = _certs(tmp_path, "app/web-0/web", "web")
    with gw.backend() as web, gw.hbone_peer(peer_certs, web.port) as peer:
        objects = _objects(peer.address, 8080, "web")
        with gw.run_gateway(
            tmp_path,
            objects,
            listener_ports=(80,),
            env=_env(tmp_path, gateway_certs),
            args=("--workers", "2"),
        ) as proc:
            for _ in range(30):  # new connections: spread over both workers by the kernel
                status, _, _ = _get(proc.port(80))
                assert status == 200, proc.output()
            log = proc.output()
    served = set(re.findall(r"\[gateway (worker=\d+) pid=\d+\] \"GET /mesh/x ", log))
    assert served == {"worker=0", "worker=1"}
    assert {tuple(seen["san"]) for seen in peer.seen} == {
        ("spiffe://cluster.local/ns/infra/sa/gw-sa",)
    }
