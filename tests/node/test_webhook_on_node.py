"""`meshctl inject webhook` on the real node: the apiserver calls it for the pods the ReplicaSet
controller creates, and the injected pods run our sidecar and talk over HBONE.

The webhook runs on the host and is registered as ``meshctl inject webhook-config --url`` prints
it. Two Deployments (client, server) in a namespace labelled for injection get their pods meshed
by it; each proxy, from the meshctl image in sidecar mode, takes its certificate from a Secret
minted by ``meshctl ztunnel certs`` (mounted at its cert dir by the injector's userVolume
annotations) and the workloads from a ConfigMap. The client fetches a page from the server, and
a capture on the node bridge shows only TLS records between the two pods, none of the plaintext.
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes import client as k8s

from meshctl.core.k8s.inject.render import CERTS_PATH
from tests.harness import node_sidecars as mesh
from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.node import TestNode
from tests.netns.ztunnel_harness import Segment, Sniffer

pytestmark = pytest.mark.node

APP_PORT = 8080
HBONE_PORT = 15008
# TLS record content types (RFC 8446 section 5.1); legacy versions 0x0301 (first ClientHello)
# and 0x0303 (everything else).
TLS_CONTENT_TYPES = {20, 21, 22, 23}
TLS_VERSIONS = {b"\x03\x01", b"\x03\x03"}


def tls_records(stream: bytes) -> list[int]:
    """The content types of the TLS records ``stream`` consists of; AssertionError if any byte
    of it is not part of a well-formed record."""
    types, at = [], 0
    while at < len(stream):
        header = stream[at : at + 5]
        assert len(header) == 5, f"a partial TLS record header at byte {at}: {header!r}"
        assert header[0] in TLS_CONTENT_TYPES, f"not a TLS record at byte {at}: {header!r}"
        assert header[1:3] in TLS_VERSIONS, f"not a TLS record at byte {at}: {header!r}"
        length = int.from_bytes(header[3:5], "big")
        assert at + 5 + length <= len(stream), f"a TLS record cut short at byte {at}"
        types.append(header[0])
        at += 5 + length
    return types


def between(segments: list[Segment], a: str, b: str) -> list[Segment]:
    return [s for s in segments if {s.src[0], s.dst[0]} == {a, b} and s.payload]


def assert_meshed_by_the_webhook(pod: Any, image: str) -> None:
    """Created by the ReplicaSet controller, meshed by our webhook on the way in, its proxy
    from ``image`` in sidecar mode with the Secret at its cert dir, running and ready."""
    assert [o.kind for o in pod.metadata.owner_references] == ["ReplicaSet"]
    status = json.loads(pod.metadata.annotations["sidecar.istio.io/status"])
    assert status["initContainers"] == ["istio-init", "istio-proxy"]
    (proxy,) = [c for c in pod.spec.init_containers if c.name == "istio-proxy"]
    assert proxy.image == image
    assert proxy.args == ["ztunnel", "run", "--mode", "sidecar"]
    certs_mount = [m for m in proxy.volume_mounts if m.mount_path == CERTS_PATH]
    assert [m.name for m in certs_mount] == ["mesh-certs"]
    (running,) = [s for s in pod.status.init_container_statuses if s.name == "istio-proxy"]
    assert running.ready, running
    assert running.state.running is not None, running
    assert running.restart_count == 0


def assert_tls_only(segments: list[Segment], client_ip: str, server_ip: str, secret: list[str]):
    """Between the pods: only the server's HBONE port, never the app's, every byte both ways
    part of a TLS record (handshake first, then application data), none of ``secret``."""
    meshed = between(segments, client_ip, server_ip)
    wire = b"".join(s.payload for s in meshed)
    assert wire, "the capture saw nothing between the pods"
    for text in secret:
        assert text.encode() not in wire
    assert {s.dst for s in meshed if s.src[0] == client_ip} == {(server_ip, HBONE_PORT)}
    up = tls_records(b"".join(s.payload for s in meshed if s.src[0] == client_ip))
    down = tls_records(b"".join(s.payload for s in meshed if s.src[0] == server_ip))
    assert up[0] == down[0] == 22, (up, down)
    assert 23 in up, up
    assert 23 in down, down


def config_dump(api: k8s.ApiClient, namespace: str, pod: str) -> dict[str, Any]:
    """The pod's proxy's /config_dump (its admin port is on the pod's loopback)."""
    out = wl.pod_exec(
        api, namespace, pod, ["wget", "-q", "-O", "-", "http://127.0.0.1:15000/config_dump"], "main"
    )
    assert out.returncode == 0, out.stderr
    dump: dict[str, Any] = json.loads(out.stdout)
    return dump


def test_webhook_meshes_replicaset_pods_which_talk_hbone_with_only_tls_on_the_bridge(
    kube_node: TestNode, node_namespace: str, tmp_path: Path
):
    image = kube_node.image("meshctl")
    busybox = kube_node.image("busybox")
    ns = node_namespace
    page = f"served-{secrets.token_hex(8)}"  # the plaintext that must not cross the bridge
    path = f"/asked-{secrets.token_hex(8)}.txt"
    serve = (
        f"mkdir -p /tmp/www && echo {page} > /tmp/www{path}"
        f" && exec httpd -f -p {APP_PORT} -h /tmp/www"
    )
    app = {"name": "main", "image": busybox, "imagePullPolicy": "Never"}
    objects = [
        mesh.deployment("server", "server", [{**app, "command": ["sh", "-c", serve]}]),
        mesh.deployment("client", "client", [{**app, "command": ["sleep", "3600"]}]),
    ]
    with (
        kube_node.cluster.api_client() as api,
        mesh.injecting(api, tmp_path / "webhook", image),
    ):
        mesh.enable_injection(api, ns)
        mesh.publish_certificates(api, ns, ["client", "server"], tmp_path / "certs")
        mesh.publish_workloads(api, ns, [])
        wl.apply(api, objects, ns)
        for name in ("server", "client"):
            wl.wait_rollout(api, "Deployment", ns, name, timeout=180)
        pods = {name: wl.pods(api, ns, f"app={name}") for name in ("server", "client")}
        for listed in pods.values():
            assert len(listed) == 1, listed
            assert_meshed_by_the_webhook(listed[0], image)
        client, server = pods["client"][0], pods["server"][0]
        client_ip, server_ip = client.status.pod_ip, server.status.pod_ip
        mesh.publish_workloads(api, ns, [client, server])
        # The kubelet refreshes the ConfigMap's files (syncFrequency 10s); the proxy re-reads.
        dump = wl.retry(
            lambda: config_dump(api, ns, client.metadata.name),
            lambda d: len(d["workloads"]) == 2,
            timeout=90,
            interval=2,
        )
        assert len(dump["workloads"]) == 2, dump["workloads"]
        # The proxy's certificate is the one in the client's Secret.
        secret = k8s.CoreV1Api(api).read_namespaced_secret("client-certs", ns)
        minted = x509.load_pem_x509_certificate(
            (tmp_path / "certs" / "client" / "cert-chain.pem").read_bytes()
        )
        assert set(secret.data) == {"cert-chain.pem", "key.pem", "root-cert.pem"}
        (cert,) = dump["certificates"]
        assert cert["identity"] == f"spiffe://cluster.local/ns/{ns}/sa/client"
        assert cert["state"] == "Available"
        # Decimal, as ztunnel writes serial numbers.
        assert int(cert["certChain"][0]["serialNumber"]) == minted.serial_number, cert
        assert cert["source"]["kind"] == "files", cert["source"]

        sniffer = Sniffer(None, nodehost.BRIDGE, promiscuous=True)
        try:
            fetched = wl.pod_exec(
                api,
                ns,
                client.metadata.name,
                ["wget", "-q", "-O", "-", f"http://{server_ip}:{APP_PORT}{path}"],
                "main",
            )
        finally:
            segments = sniffer.stop()
        assert (fetched.returncode, fetched.stdout) == (0, page + "\n"), fetched

        assert_tls_only(segments, client_ip, server_ip, [page, path])
        # The server's proxy saw the client's identity (mutual TLS) on that connection.
        metrics = wl.pod_exec(
            api,
            ns,
            server.metadata.name,
            ["wget", "-q", "-O", "-", "http://127.0.0.1:15020/stats/prometheus"],
            "main",
        ).stdout
        client_id = f"spiffe://cluster.local/ns/{ns}/sa/client"
        assert any(
            line.startswith("istio_tcp_connections_opened_total")
            and f'source_principal="{client_id}"' in line
            and 'connection_security_policy="mutual_tls"' in line
            for line in metrics.splitlines()
        ), metrics[-3000:]
