"""The real node runs what Kubernetes users run: pods, Deployments, DaemonSets, Services.

Each test uses its own namespace on the session's node (`node_namespace`); traffic stays between
pods on the node bridge and the node's own apiserver.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from tests.harness import workloads as wl
from tests.harness.node import TestNode

pytestmark = pytest.mark.node

INDEX = b"served by the node\n"


def test_pod_runs_and_answers_logs_and_exec(kube_node: TestNode, node_namespace: str):
    image = kube_node.image("busybox")
    with kube_node.cluster.api_client() as api:
        pod = wl.busybox_pod(
            "hello", image, ["sh", "-c", "echo hello from $HOSTNAME; exec sleep 3600"]
        )
        k8s.CoreV1Api(api).create_namespaced_pod(node_namespace, pod)
        ready = wl.wait_pod_ready(api, node_namespace, "hello")
        assert ready.spec.node_name == kube_node.cluster.node_name
        assert ready.status.pod_ip.startswith("10.250.0.")
        assert ready.status.host_ip == kube_node.cluster.node_ip
        # containerd writes the log file a moment after the container wrote to its stdout.
        logs = wl.retry(lambda: wl.pod_logs(api, node_namespace, "hello"), bool, timeout=10)
        assert logs == "hello from hello\n"
        ok = wl.pod_exec(api, node_namespace, "hello", ["sh", "-c", "echo out; echo err >&2"])
        assert (ok.returncode, ok.stdout, ok.stderr) == (0, "out\n", "err\n")
        failed = wl.pod_exec(api, node_namespace, "hello", ["sh", "-c", "exit 3"])
        assert failed.returncode == 3


def test_deployment_and_daemonset_roll_out(kube_node: TestNode, node_namespace: str):
    image = kube_node.image("busybox")

    def template(app: str):
        spec = wl.busybox_pod(app, image, ["sleep", "3600"])
        return {"metadata": {"labels": {"app": app}}, "spec": spec["spec"]}

    objects = [
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web"},
            "spec": {
                "replicas": 2,
                "selector": {"matchLabels": {"app": "web"}},
                "template": template("web"),
            },
        },
        {
            "apiVersion": "apps/v1",
            "kind": "DaemonSet",
            "metadata": {"name": "agent"},
            "spec": {"selector": {"matchLabels": {"app": "agent"}}, "template": template("agent")},
        },
    ]
    with kube_node.cluster.api_client() as api:
        wl.apply(api, objects, node_namespace)
        wl.wait_rollout(api, "Deployment", node_namespace, "web")
        wl.wait_rollout(api, "DaemonSet", node_namespace, "agent")
        assert len(wl.pods(api, node_namespace, "app=web")) == 2
        assert len(wl.pods(api, node_namespace, "app=agent")) == 1
        # Applying the same objects again changes nothing (server-side apply is idempotent).
        before = (
            k8s.AppsV1Api(api).read_namespaced_deployment("web", node_namespace).metadata.generation
        )
        wl.apply(api, objects, node_namespace)
        after = (
            k8s.AppsV1Api(api).read_namespaced_deployment("web", node_namespace).metadata.generation
        )
        assert before == after


def test_pod_reaches_a_service_and_the_apiserver_through_kube_proxy(
    kube_node: TestNode, node_namespace: str
):
    image = kube_node.image("busybox")
    serve = (
        f"mkdir -p /tmp/www && printf '{INDEX.decode().strip()}\\n' > /tmp/www/index.html"
        " && exec httpd -f -p 8080 -h /tmp/www"
    )
    server = wl.busybox_pod("server", image, ["sh", "-c", serve])
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "server"},
        "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": 8080}]},
    }
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespaced_pod(node_namespace, server)
        core.create_namespaced_pod(
            node_namespace, wl.busybox_pod("client", image, ["sleep", "3600"])
        )
        wl.apply(api, [service], node_namespace)
        wl.wait_pod_ready(api, node_namespace, "server")
        wl.wait_pod_ready(api, node_namespace, "client")
        cluster_ip = core.read_namespaced_service("server", node_namespace).spec.cluster_ip

        def fetch() -> wl.ExecResult:
            return wl.pod_exec(
                api,
                node_namespace,
                "client",
                ["wget", "-q", "-O", "-", f"http://{cluster_ip}/index.html"],
            )

        # kube-proxy programs the Service a moment after its endpoints appear.
        got = wl.retry(fetch, lambda r: r.returncode == 0, timeout=30)
        assert got.stdout.encode() == INDEX
        # kubernetes.default is the apiserver on the node address (lease reconciler): a plain
        # HTTP request to its TLS port gets Go's own answer for that mistake.
        api_ip = core.read_namespaced_service("kubernetes", "default").spec.cluster_ip
        probe = ["sh", "-c", f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc {api_ip} 443"]
        reply = wl.retry(
            lambda: wl.pod_exec(api, node_namespace, "client", probe),
            lambda r: "HTTP request to an HTTPS server" in r.stdout,
            timeout=30,
        )
        assert reply.stdout.startswith("HTTP/1.0 400 Bad Request")
