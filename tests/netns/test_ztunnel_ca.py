"""``meshctl ztunnel run --ca-address``: sidecars with no certificate files get their identities
from ``meshctl controlplane run`` (real kube-apiserver, real TokenRequest tokens bound to pods)
and carry mTLS traffic in real network namespaces; they keep serving while the CA is down and
rotate at half-life during transfers without dropping a byte.

The control plane runs on the host; the pods reach it at the node's bridge address (a forwarder
in the node namespace), checking its certificate for the Service name (``ALT_CA_HOSTNAME``).
Workloads still come from a local config file (discovery is #12 part B).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TypeVar

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.harness import controlplane as cp
from tests.harness.kube import KubeCluster, create_namespace, delete_namespace, forward_into
from tests.harness.netns import Node, node_with_pods
from tests.netns.ztunnel_harness import (
    EchoServer,
    Sidecar,
    capture,
    echo_roundtrip,
    http_get,
    pattern,
)
from tests.netns.ztunnel_topology import APP_PORT, SVC_PORT, local_config

pytestmark = [pytest.mark.netns, pytest.mark.kube]

CA_PORT = 15012
T = TypeVar("T")


@dataclass
class CaMesh:
    node: Node
    plane: cp.ControlPlaneProcess
    home: str
    car_a: Sidecar
    car_b: Sidecar
    vip: str
    tmp: Path


def _ensure_namespace(api: k8s.ApiClient, name: str) -> bool:
    try:
        create_namespace(api, name)
    except ApiException as exc:
        if exc.status != 409:
            raise
        return False
    return True


@contextlib.contextmanager
def ca_mesh(kube_cluster: KubeCluster, tmp: Path, ttl: str) -> Iterator[CaMesh]:
    home = f"cp-{secrets.token_hex(3)}"
    with kube_cluster.api_client() as api, contextlib.ExitStack() as stack:
        create_namespace(api, home)
        stack.callback(delete_namespace, api, home)
        # The local config's workloads: default/client (pod A) and prod/server (pod B).
        if _ensure_namespace(api, "prod"):
            stack.callback(delete_namespace, api, "prod")
        plane = cp.start(kube_cluster, home, tmp)
        started: list[CaMesh] = []
        # The test may restart the CA: stop whichever replica the mesh holds last.
        stack.callback(lambda: (started[0].plane if started else plane).stop())  # noqa: PLW0108 -- late binding
        root_file = tmp / "root-cert.pem"  # what the meshctl-ca-root-cert volume holds
        root_file.write_bytes(cp.root_pem(api, home))
        node = stack.enter_context(node_with_pods(2))
        a, b = node.pods
        stack.enter_context(forward_into(node.ns, plane.grpc_port, (node.gateway, CA_PORT)))
        vip = str(node.subnet.network_address + 200)
        config = local_config(tmp / "local.yaml", a.ip, b.ip, vip)
        core = k8s.CoreV1Api(api)
        cars = []
        for pod, workload, sa_ns, sa in (
            (a, "default/client/client", "default", "client"),
            (b, "prod/server/server", "prod", "server"),
        ):
            pod_name = f"{sa}-{secrets.token_hex(3)}"
            token = cp.pod_token(kube_cluster, sa_ns, sa, pod_name)
            stack.callback(core.delete_namespaced_pod, pod_name, sa_ns, grace_period_seconds=0)
            token_file = tmp / f"{sa}.token"
            token_file.write_text(token)
            empty = tmp / f"{sa}-certs"
            empty.mkdir()
            cars.append(
                Sidecar(
                    pod.ns,
                    workload,
                    empty,  # no files: the certificate comes from the CA
                    config,
                    log_path=tmp / f"{sa}.log",
                    extra=(
                        *("--ca-address", f"{node.gateway}:{CA_PORT}"),
                        *("--ca-root", str(root_file), "--token-file", str(token_file)),
                        *("--secret-ttl", ttl),
                    ),
                    env={"ALT_CA_HOSTNAME": plane.server_name},
                    group=None if sa == "server" else 1337,
                )
            )
        car_a, car_b = cars
        echo = EchoServer(b.ns, b.ip, APP_PORT)
        stack.callback(echo.close)
        uid = str(os.getuid())
        capture(a.ns)
        capture(b.ns, "--proxy-uid", uid, "--proxy-gid", uid)
        stack.callback(car_a.stop)
        stack.callback(car_b.stop)
        car_a.start()
        car_b.start()
        started.append(CaMesh(node, plane, home, car_a, car_b, vip, tmp))
        yield started[0]


def certificate(car: Sidecar) -> dict:
    return car.config_dump()["certificates"][0]


def ready_body(car: Sidecar) -> tuple[int, str]:
    return http_get(car.ns, 15021, "/healthz/ready", timeout=2)


def roundtrip(mesh: CaMesh, size: int = 100_000) -> bool:
    payload = secrets.token_bytes(size)
    reply = echo_roundtrip(mesh.node.pods[0].ns, (mesh.vip, SVC_PORT), payload, timeout=15)
    return reply == hashlib.sha256(payload).digest() + payload


def wait(what: str, check: Callable[[], T | None], timeout: float = 30.0) -> T:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = check()
        if last:
            return last
        time.sleep(0.2)
    raise AssertionError(f"{what}: not within {timeout}s (last {last!r})")


def test_sidecars_without_files_get_identities_from_the_ca_and_survive_its_outage(
    kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    with ca_mesh(kube_cluster, tmp_path, ttl="30s") as mesh:
        for car, identity in (
            (mesh.car_a, "spiffe://cluster.local/ns/default/sa/client"),
            (mesh.car_b, "spiffe://cluster.local/ns/prod/sa/server"),
        ):
            cert = certificate(car)
            assert cert["source"]["kind"] == "ca"
            assert cert["source"]["renewing"] is True
            assert cert["certChain"][0]["uriSans"] == [identity]
            assert cert["state"] == "Available"
        assert roundtrip(mesh), "mTLS between the two sidecars"

        # The CA goes away: renewal (due after 15 s) fails, the proxies keep serving.
        port = mesh.plane.grpc_port
        assert mesh.plane.stop() == 0

        def failing() -> tuple[int, str] | None:
            answer = ready_body(mesh.car_a)
            return answer if "renewal failing" in answer[1] else None

        status, body = wait("renewal failure reported", failing)
        assert status == 200, body
        source = certificate(mesh.car_a)["source"]
        assert source["renewing"] is False
        assert "UNAVAILABLE" in source["lastError"]
        assert roundtrip(mesh), "still serving on the current certificate"

        # The CA is back (same root, from its Secret): renewal recovers.
        mesh.plane = cp.start(
            kube_cluster, mesh.home, tmp_path, grpc_port=port, revision=mesh.plane.revision
        )
        wait("renewal recovered", lambda: certificate(mesh.car_a)["source"]["renewing"])
        assert ready_body(mesh.car_a) == (200, "ready\n")
        assert roundtrip(mesh)


def test_rotation_at_half_life_during_transfers_drops_nothing(
    kube_cluster: KubeCluster, tmp_path: Path
) -> None:
    with ca_mesh(kube_cluster, tmp_path, ttl="4s") as mesh:
        a_ns = mesh.node.pods[0].ns
        size = 24 * 1024 * 1024
        result: dict[str, object] = {}

        def slow_download() -> None:
            # Mode S: the server streams ``size`` bytes; reading slowly keeps the one
            # connection (and its HBONE tunnel) open across several rotations.
            with a_ns.socket() as s:
                s.settimeout(30)
                s.connect((mesh.vip, SVC_PORT))
                s.sendall(b"S" + size.to_bytes(8, "big"))
                got = bytearray()
                while chunk := s.recv(256 * 1024):
                    got += chunk
                    time.sleep(0.05)
                result["ok"] = bytes(got) == pattern(size)
                result["bytes"] = len(got)

        serials = set()
        worker = threading.Thread(target=slow_download)
        started = time.monotonic()
        worker.start()
        short_ok = 0
        while worker.is_alive():
            serials.add(certificate(mesh.car_a)["certChain"][0]["serialNumber"])
            serials.add(certificate(mesh.car_b)["certChain"][0]["serialNumber"])
            assert roundtrip(mesh, 20_000), "a new connection failed during rotation"
            short_ok += 1
            time.sleep(0.3)
            assert time.monotonic() - started < 60
        worker.join()
        assert result.get("ok"), result
        elapsed = time.monotonic() - started
        assert elapsed > 4, "the transfer must span rotations"
        assert len(serials) >= 4, f"{len(serials)} certificates in {elapsed:.1f}s"
        assert short_ok >= 5
        for car in (mesh.car_a, mesh.car_b):
            assert ready_body(car)[0] == 200
