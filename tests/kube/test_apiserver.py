"""Acceptance tests of the kube harness (tests/harness/kube.py) against a real kube-apiserver.

Each test proves one thing the rest of the suite relies on: the official client, watches and
selectors, TokenRequest/TokenReview audiences, URL-registered mutating webhooks, kubectl with the
harness kubeconfig, and the kubelet stand-in giving pods real, reachable IPs.
"""

from __future__ import annotations

import ipaddress
import json
import os
import subprocess
import sys
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import watch

from tests.harness.kube import (
    KubeCluster,
    Kubelet,
    WebhookServer,
    register_mutating_webhook,
    request_token,
    wait_webhook_active,
)
from tests.harness.netns import host_link_names

pytestmark = pytest.mark.kube


def _pod(name: str, labels: dict[str, str] | None = None) -> k8s.V1Pod:
    return k8s.V1Pod(
        metadata=k8s.V1ObjectMeta(name=name, labels=labels or {}),
        # Never pulled: nothing runs containers here.
        spec=k8s.V1PodSpec(
            containers=[k8s.V1Container(name="app", image="registry.invalid/app:1")]
        ),
    )


def test_client_creates_namespace_service_account_and_pod(
    kube_api: k8s.ApiClient, kube_namespace: str
) -> None:
    core = k8s.CoreV1Api(kube_api)
    core.create_namespaced_service_account(
        kube_namespace, k8s.V1ServiceAccount(metadata=k8s.V1ObjectMeta(name="sa-a"))
    )
    pod = _pod("web")
    assert pod.spec is not None
    pod.spec.service_account_name = "sa-a"
    core.create_namespaced_pod(kube_namespace, pod)

    assert core.read_namespace(kube_namespace).metadata.name == kube_namespace
    accounts = {
        sa.metadata.name for sa in core.list_namespaced_service_account(kube_namespace).items
    }
    assert accounts == {"default", "sa-a"}
    stored = core.read_namespaced_pod("web", kube_namespace)
    assert stored.spec.service_account_name == "sa-a"
    assert stored.status.phase == "Pending"  # nothing schedules it: the harness plays kubelet


def test_watch_sees_added_modified_deleted_and_selector_filters(
    kube_api: k8s.ApiClient, kube_namespace: str
) -> None:
    core = k8s.CoreV1Api(kube_api)
    start = core.list_namespaced_pod(kube_namespace).metadata.resource_version
    core.create_namespaced_pod(kube_namespace, _pod("web", {"app": "web"}))
    core.create_namespaced_pod(kube_namespace, _pod("db", {"app": "db"}))
    core.patch_namespaced_pod("web", kube_namespace, {"metadata": {"labels": {"stage": "patched"}}})
    core.delete_namespaced_pod("web", kube_namespace)

    # Replayed from the resource version taken before the changes, so no event can be missed;
    # the server ends the watch after timeout_seconds.
    seen = [
        (
            event["type"],
            event["object"].metadata.name,
            event["object"].metadata.labels.get("stage", ""),
        )
        for event in watch.Watch().stream(
            core.list_namespaced_pod,
            kube_namespace,
            label_selector="app=web",
            resource_version=start,
            timeout_seconds=3,
        )
    ]
    assert seen[:2] == [("ADDED", "web", ""), ("MODIFIED", "web", "patched")]
    assert seen[-1] == ("DELETED", "web", "patched")
    # Between them only the deletion's own update (deletionTimestamp set) may appear.
    assert set(seen[2:-1]) <= {("MODIFIED", "web", "patched")}
    assert {name for _, name, _ in seen} == {"web"}, "the selector must keep the db pod out"

    listed = core.list_namespaced_pod(kube_namespace, label_selector="app=db").items
    assert [p.metadata.name for p in listed] == ["db"]
    assert core.list_namespaced_pod(kube_namespace, label_selector="app=none").items == []


def test_token_review_accepts_requested_audience_only(
    kube_cluster: KubeCluster, kube_api: k8s.ApiClient, kube_namespace: str
) -> None:
    token = request_token(kube_cluster, kube_namespace, "sa-a", "meshctl-ca")
    auth = k8s.AuthenticationV1Api(kube_api)

    def review(audience: str) -> k8s.V1TokenReviewStatus:
        answer = auth.create_token_review(
            k8s.V1TokenReview(spec=k8s.V1TokenReviewSpec(token=token, audiences=[audience]))
        )
        assert answer.status is not None
        return answer.status

    accepted = review("meshctl-ca")
    assert accepted.authenticated is True
    assert accepted.user is not None
    assert accepted.user.username == f"system:serviceaccount:{kube_namespace}:sa-a"
    assert accepted.audiences == ["meshctl-ca"]

    refused = review("some-other-audience")
    assert not refused.authenticated
    assert refused.error


def test_webhook_registered_by_url_patches_created_pod(
    kube_cluster: KubeCluster, kube_api: k8s.ApiClient, kube_namespace: str
) -> None:
    def add_label(request: dict[str, Any]) -> list[dict[str, Any]] | None:
        if request.get("dryRun"):
            return None  # the readiness probe's pod
        return [{"op": "add", "path": "/metadata/labels/meshctl.test~1mutated", "value": "yes"}]

    core = k8s.CoreV1Api(kube_api)
    with (
        WebhookServer(add_label) as server,
        register_mutating_webhook(
            kube_cluster,
            f"label-{kube_namespace}",
            server.url,
            server.ca_pem,
            # Only this test's namespace: the label is set on every namespace by the apiserver.
            namespace_selector={"matchLabels": {"kubernetes.io/metadata.name": kube_namespace}},
        ),
    ):
        wait_webhook_active(kube_cluster, kube_namespace, lambda: bool(server.reviews))
        core.create_namespaced_pod(kube_namespace, _pod("web", {"app": "web"}))
        reviews = [r for r in server.reviews if not r.get("dryRun")]

    assert len(reviews) == 1
    review = reviews[0]
    assert review["kind"] == {"group": "", "version": "v1", "kind": "Pod"}
    assert review["operation"] == "CREATE"
    assert review["namespace"] == kube_namespace
    assert review["object"]["metadata"]["name"] == "web"
    stored = core.read_namespaced_pod("web", kube_namespace)
    assert stored.metadata.labels == {"app": "web", "meshctl.test/mutated": "yes"}


def test_kubectl_lists_pods_with_harness_kubeconfig(
    kube_cluster: KubeCluster, kube_api: k8s.ApiClient, kube_namespace: str
) -> None:
    k8s.CoreV1Api(kube_api).create_namespaced_pod(kube_namespace, _pod("web"))
    proc = subprocess.run(
        [
            "kubectl",
            "--kubeconfig",
            str(kube_cluster.kubeconfig),
            "get",
            "pods",
            "-A",
            "-o",
            "json",
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={k: v for k, v in os.environ.items() if k != "KUBECONFIG"},
    )
    assert proc.returncode == 0, proc.stderr
    pods = {
        (p["metadata"]["namespace"], p["metadata"]["name"])
        for p in json.loads(proc.stdout)["items"]
    }
    assert (kube_namespace, "web") in pods


# Runs inside pod A's netns: accept one connection, echo every byte, report the peer's address.
_ECHO_SERVER = """
import socket, sys
srv = socket.create_server((sys.argv[1], int(sys.argv[2])))
print("listening", flush=True)
conn, peer = srv.accept()
data = b""
while chunk := conn.recv(65536):
    data += chunk
conn.sendall(data)
conn.close()
print(peer[0], len(data), flush=True)
"""

# Runs inside pod B's netns: send stdin, half-close, print what came back.
_ECHO_CLIENT = """
import socket, sys
payload = sys.stdin.buffer.read()
conn = socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=10)
conn.sendall(payload)
conn.shutdown(socket.SHUT_WR)
while chunk := conn.recv(65536):
    sys.stdout.buffer.write(chunk)
"""


@pytest.mark.netns
def test_kubelet_gives_pods_reachable_ips_and_releases_them(
    kube_cluster: KubeCluster, kube_api: k8s.ApiClient, kube_namespace: str, kubelet: Kubelet
) -> None:
    core = k8s.CoreV1Api(kube_api)
    for name in ("server", "client"):
        core.create_namespaced_pod(kube_namespace, _pod(name))
    server = kubelet.run_pod(kube_namespace, "server")
    # A chained plugin after bridge: tuning needs bridge's result as prevResult to find eth0.
    client = kubelet.run_pod(kube_namespace, "client", chained=[{"type": "tuning", "mtu": 1400}])

    stored = core.read_namespaced_pod("server", kube_namespace)
    assert stored.spec.node_name == kubelet.node_name
    assert stored.status.phase == "Running"
    assert stored.status.pod_ip == server.ip
    assert {c.type: c.status for c in stored.status.conditions}["Ready"] == "True"
    assert server.ip != client.ip
    assert {ipaddress.ip_address(server.ip), ipaddress.ip_address(client.ip)} <= set(
        kubelet.subnet.hosts()
    )
    assert server.netns_path.exists()
    assert "mtu 1400" in client.netns.run(["ip", "link", "show", "eth0"]).stdout
    # The bridge plugin ran in the node netns, never on the host.
    assert kubelet.bridge in kubelet.node.link_names()
    assert kubelet.bridge not in host_link_names()

    payload = os.urandom(256 * 1024)
    echo = server.netns.popen(
        [sys.executable, "-c", _ECHO_SERVER, server.ip, "8080"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert echo.stdout is not None
        assert echo.stdout.readline() == b"listening\n"
        sent = client.netns.popen(
            [sys.executable, "-c", _ECHO_CLIENT, server.ip, "8080"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        )
        received, err = sent.communicate(payload, timeout=30)
        assert sent.returncode == 0, err
        assert received == payload
        report, _ = echo.communicate(timeout=10)
        assert report.decode().split() == [client.ip, str(len(payload))]
    finally:
        echo.kill()
        echo.wait()

    # The apiserver is reachable from the node netns (where chained CNI plugins run).
    lookup = kubelet.node.popen(
        [
            "kubectl",
            "--kubeconfig",
            str(kube_cluster.kubeconfig),
            "get",
            "pod",
            "server",
            "-n",
            kube_namespace,
            "-o",
            "jsonpath={.status.podIP}",
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    out, err = lookup.communicate(timeout=60)
    assert lookup.returncode == 0, err
    assert out.decode() == server.ip

    allocation = kubelet.ipam_dir / kubelet.network_name / server.ip
    assert allocation.read_text().startswith(server.container_id)
    kubelet.delete_pod(server)
    assert not allocation.exists(), "host-local must release the IP on CNI DEL"
    assert not server.netns_path.exists()
    assert [p.metadata.name for p in core.list_namespaced_pod(kube_namespace).items] == ["client"]
    assert (kubelet.ipam_dir / kubelet.network_name / client.ip).exists()
