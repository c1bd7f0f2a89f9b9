"""Two injected sidecars with no files at all: their identities (mTLS certificates from the CA)
and their workloads (discovery) come from ``meshctl controlplane run`` (real kube-apiserver, real
TokenRequest tokens bound to their pods), and they carry traffic between real network
namespaces; an L4 DENY AuthorizationPolicy created through the CRD refuses the connection, and
deleting it lets traffic through again.

The pods exist twice, as in a cluster: Pod objects in the API (their status written with the
namespaces' addresses, as a kubelet would) and network namespaces on a node bridge. The control
plane listens on the host's loopback; the pods reach it at their node's gateway through a relay
(as they would reach a Service), and check its certificate by the Service name.
"""

from __future__ import annotations

import hashlib
import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.harness import controlplane as cp
from tests.harness.kube import KubeCluster, create_namespace, delete_namespace, forward_into
from tests.harness.netns import node_with_pods
from tests.netns.ztunnel_harness import (
    TD,
    EchoServer,
    Sidecar,
    capture,
    echo_roundtrip,
    pattern,
)

pytestmark = [pytest.mark.kube, pytest.mark.netns]

APP_PORT = 8080
SVC_PORT = 80
INJECTED = {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'}


def wait_for(check, what, timeout=30.0):
    end = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < end:
        last = check()
        if last:
            return last
        time.sleep(0.1)
    raise AssertionError(f"{what}: not after {timeout}s (last: {last!r})")


def set_status(cluster: KubeCluster, ns: str, name: str, ip: str) -> None:
    with cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        pod = core.read_namespaced_pod(name, ns)
        pod.status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True"}],
        }
        core.replace_namespaced_pod_status(name, ns, pod)


@pytest.fixture
def mesh(kube_cluster: KubeCluster, tmp_path: Path) -> Iterator[Any]:
    system, apps = f"esys-{secrets.token_hex(3)}", f"eapp-{secrets.token_hex(3)}"
    with kube_cluster.api_client() as api:
        create_namespace(api, system)
        create_namespace(api, apps)
        try:
            with (
                cp.running(kube_cluster, system, tmp_path) as plane,
                node_with_pods(2) as node,
                # The pods reach the control plane at the gateway, as they would its Service.
                forward_into(node.ns, plane.grpc_port, (node.gateway, plane.grpc_port)),
            ):
                yield build(kube_cluster, api, plane, node, system, apps, tmp_path)
        finally:
            delete_namespace(api, apps)
            delete_namespace(api, system)


class Built:
    pass


def build(cluster, api, plane, node, system, apps, tmp):
    a, b = node.pods
    mesh = Built()
    mesh.__dict__.update(cluster=cluster, plane=plane, node=node, apps=apps, a=a, b=b)
    # The API's view: two injected pods on this node, a Service selecting the server.
    tokens = {}
    for pod, sa, labels in ((a, "client", {"app": "client"}), (b, "server", {"app": "server"})):
        tokens[sa] = cp.pod_token(
            cluster, apps, sa, sa, node="node-1", labels=labels, annotations=INJECTED
        )
        set_status(cluster, apps, sa, pod.ip)
    service = k8s.CoreV1Api(api).create_namespaced_service(
        apps,
        {
            "metadata": {"name": "echo"},
            "spec": {
                "selector": {"app": "server"},
                "ports": [{"name": "tcp", "port": SVC_PORT, "targetPort": APP_PORT}],
            },
        },
    )
    mesh.vip = service.spec.cluster_ip
    roots = tmp / "root-cert.pem"  # what the meshctl-ca-root-cert volume holds
    roots.write_bytes(cp.root_pem(api, system))
    uid = str(os.getuid())
    mesh.cars = []
    address = f"{node.gateway}:{plane.grpc_port}"
    for pod, sa, group in ((a, "client", 1337), (b, "server", None)):
        token = tmp / f"{sa}.token"
        token.write_text(tokens[sa])
        empty = tmp / f"{sa}-certs"  # no files at all: identity from the CA
        empty.mkdir()
        car = Sidecar(
            pod.ns,
            f"{apps}/{sa}/{sa}",
            empty,
            None,  # no local config: workloads from discovery
            extra=(
                *("--ca-address", address, "--ca-root", str(roots)),
                *("--xds-address", address, "--xds-root-ca", str(roots)),
                *("--token-file", str(token)),
            ),
            env={
                "ALT_CA_HOSTNAME": plane.server_name,
                "ALT_XDS_HOSTNAME": plane.server_name,
                "POD_NAME": sa,
                "POD_NAMESPACE": apps,
                "INSTANCE_IP": pod.ip,
                "NODE_NAME": "node-1",
            },
            log_path=tmp / f"{sa}.log",
            group=group,
        )
        mesh.cars.append(car)
    capture(a.ns)
    capture(b.ns, "--proxy-uid", uid, "--proxy-gid", uid)
    mesh.echo = EchoServer(b.ns, b.ip, APP_PORT)
    return mesh


def policy(cluster, ns, name, spec=None, *, delete=False):
    with cluster.api_client() as api:
        custom = k8s.CustomObjectsApi(api)
        args = ("security.istio.io", "v1", ns, "authorizationpolicies")
        if delete:
            custom.delete_namespaced_custom_object(*args, name)
            return
        body = {
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": name},
            "spec": spec,
        }
        custom.create_namespaced_custom_object(*args, body)


def echoed(payload: bytes) -> bytes:
    """What the echo server answers: the payload's SHA-256, then the payload."""
    return hashlib.sha256(payload).digest() + payload


def connects(mesh, addr) -> bool:
    payload = pattern(64 * 1024)
    try:
        return echo_roundtrip(mesh.a.ns, addr, payload, timeout=10) == echoed(payload)
    except OSError:
        return False


def test_sidecars_fed_by_discovery_carry_traffic_and_a_crd_policy_refuses_it(mesh):
    try:
        for car in mesh.cars:
            car.start(wait_ready=False)
        for car in mesh.cars:
            car.wait_ready(timeout=60)  # ready only once discovery ACKed both types
        dump = mesh.cars[0].config_dump()
        assert dump["xds"]["synced"]
        assert dump["xds"]["connected"]
        assert {t["acked"] for t in dump["xds"]["types"].values()} == {True}
        names = {w["name"] for w in dump["workloads"]}
        assert {"client", "server"} <= names
        server = next(w for w in dump["workloads"] if w["name"] == "server")
        assert server["protocol"] == "HBONE"
        # ztunnel's shapes: the workload names its services, each service lists its endpoints.
        echo_host = f"echo.{mesh.apps}.svc.cluster.local"
        assert server["services"] == [f"{mesh.apps}/{echo_host}"]
        echo = next(s for s in dump["services"] if s["hostname"] == echo_host)
        assert echo["endpoints"][server["uid"]]["port"] == {"80": 8080}
        # Through the mesh: by service VIP (resolved to the server's pod and port) and by pod.
        payload = pattern(256 * 1024)
        assert echo_roundtrip(mesh.a.ns, (mesh.vip, SVC_PORT), payload) == echoed(payload)
        assert echo_roundtrip(mesh.a.ns, (mesh.b.ip, APP_PORT), payload) == echoed(payload)
        opened = mesh.cars[1].metrics()
        assert "istio_tcp_connections_opened_total" in opened
        # An L4 DENY from the client's namespace on the app port, through the CRD.
        policy(
            mesh.cluster,
            mesh.apps,
            "deny-client",
            {
                "action": "DENY",
                "rules": [
                    {
                        "from": [{"source": {"principals": [f"{TD}/ns/{mesh.apps}/sa/client"]}}],
                        "to": [{"operation": {"ports": [str(APP_PORT)]}}],
                    }
                ],
            },
        )
        wait_for(lambda: not connects(mesh, (mesh.vip, SVC_PORT)), "the deny policy refusing")
        dump_b = mesh.cars[1].config_dump()
        assert [p["name"] for p in dump_b["policies"]] == ["deny-client"]
        assert not connects(mesh, (mesh.b.ip, APP_PORT))
        policy(mesh.cluster, mesh.apps, "deny-client", delete=True)
        wait_for(lambda: connects(mesh, (mesh.vip, SVC_PORT)), "traffic after the policy went")
    finally:
        for car in mesh.cars:
            car.stop()
        mesh.echo.close()


def test_a_pod_ip_change_reaches_the_sidecar_without_a_restart(mesh):
    try:
        for car in mesh.cars:
            car.start(wait_ready=False)
        for car in mesh.cars:
            car.wait_ready(timeout=60)
        assert connects(mesh, (mesh.vip, SVC_PORT))
        # The server pod's address moves (as after a restart on another sandbox): the client's
        # sidecar learns it from discovery and follows.
        new_ip = str(mesh.node.subnet.network_address + 77)
        mesh.b.ns.run(
            ["ip", "addr", "add", f"{new_ip}/{mesh.node.subnet.prefixlen}", "dev", "eth0"]
        )
        mesh.echo.close()
        mesh.echo = EchoServer(mesh.b.ns, new_ip, APP_PORT)
        set_status(mesh.cluster, mesh.apps, "server", new_ip)

        def moved():
            server = [w for w in mesh.cars[0].config_dump()["workloads"] if w["name"] == "server"]
            return server and server[0]["workloadIps"] == [new_ip]

        wait_for(moved, "the new address in the client's store")
        assert connects(mesh, (mesh.vip, SVC_PORT))
    finally:
        for car in mesh.cars:
            car.stop()
        mesh.echo.close()
