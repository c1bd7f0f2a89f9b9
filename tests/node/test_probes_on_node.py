"""App probes through the injected proxy on the real node: HTTP, TCP and gRPC health.

A Deployment meshed by ``meshctl inject webhook`` (as in test_webhook_on_node.py) whose app
(the test workload's ``meshtest serve``) has an HTTP liveness probe on a named port, a gRPC
readiness probe and a TCP startup probe. The injector points all three at the proxy's
``:15020/app-health/...``; the kubelet's probes so reach the proxy, which probes the app from
inside the pod. The pod becomes Ready and stays Ready for a minute with no restarts; once the
app reports itself unhealthy the gRPC readiness probe takes it out of service and the HTTP
liveness probe restarts it; an app that never listens on its TCP port never starts.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.harness import node_sidecars as mesh
from tests.harness import workloads as wl
from tests.harness.node import TestNode

pytestmark = pytest.mark.node

HTTP_PORT, TCP_PORT, GRPC_PORT = 8080, 9000, 9090
STAY_READY_SECONDS = 60


def app(image: str, *serve: str) -> dict[str, Any]:
    """The test workload with all three probe kinds (named ports for HTTP and TCP)."""
    return {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["meshtest", "serve", *serve],
        "ports": [
            {"name": "http", "containerPort": HTTP_PORT},
            {"name": "echo", "containerPort": TCP_PORT},
            {"name": "grpc", "containerPort": GRPC_PORT},
        ],
        "startupProbe": {
            "tcpSocket": {"port": "echo"},
            "periodSeconds": 1,
            "timeoutSeconds": 1,
            "failureThreshold": 10,
        },
        "readinessProbe": {
            "grpc": {"port": GRPC_PORT},
            "periodSeconds": 1,
            "timeoutSeconds": 1,
            "failureThreshold": 1,
        },
        # Slower than readiness: an unhealthy app is first taken out of service (gRPC), then
        # restarted (HTTP), and the test sees both.
        "livenessProbe": {
            "httpGet": {"path": "/healthz", "port": "http"},
            "periodSeconds": 2,
            "timeoutSeconds": 1,
            "failureThreshold": 4,
        },
    }


def the_pod(api: k8s.ApiClient, namespace: str, name: str) -> Any:
    (pod,) = wl.pods(api, namespace, f"app={name}")
    return pod


def restarts(pod: Any) -> dict[str, int]:
    statuses = (pod.status.init_container_statuses or []) + (pod.status.container_statuses or [])
    return {s.name: s.restart_count for s in statuses if s.name in ("main", "istio-proxy")}


def assert_probes_rewritten(pod: Any) -> None:
    """The kubelet probes the proxy, which got the app's probes (ports resolved)."""
    (main,) = [c for c in pod.spec.containers if c.name == "main"]
    for probe, kind in (
        (main.startup_probe, "startupz"),
        (main.readiness_probe, "readyz"),
        (main.liveness_probe, "livez"),
    ):
        assert probe.http_get.path == f"/app-health/main/{kind}", probe
        assert probe.http_get.port == 15020, probe
    (proxy,) = [c for c in pod.spec.init_containers if c.name == "istio-proxy"]
    env = {e.name: e.value for e in proxy.env}
    probers = json.loads(env["ISTIO_KUBE_APP_PROBERS"])
    assert probers["/app-health/main/livez"]["httpGet"]["port"] == HTTP_PORT
    assert probers["/app-health/main/startupz"]["tcpSocket"]["port"] == TCP_PORT
    assert probers["/app-health/main/readyz"]["grpc"]["port"] == GRPC_PORT


def test_injected_deployment_with_http_tcp_and_grpc_probes_stays_ready(
    kube_node: TestNode, node_namespace: str, tmp_path: Path
):
    image = kube_node.image("meshctl")
    testapp = kube_node.image("testapp")
    ns = node_namespace
    objects = [
        mesh.deployment("probed", "probed", [app(testapp)]),
        # Never listens on its TCP port: the startup probe, through the proxy, must fail.
        mesh.deployment("no-tcp", "probed", [app(testapp, "--tcp", "")]),
    ]
    with (
        kube_node.cluster.api_client() as api,
        mesh.injecting(api, tmp_path / "webhook", image),
    ):
        mesh.enable_injection(api, ns)
        mesh.publish_certificates(api, ns, ["probed"], tmp_path / "certs")
        mesh.publish_workloads(api, ns, [])
        wl.apply(api, objects, ns)
        wl.wait_rollout(api, "Deployment", ns, "probed", timeout=180)
        pod = the_pod(api, ns, "probed")
        assert_probes_rewritten(pod)
        assert restarts(pod) == {"istio-proxy": 0, "main": 0}, restarts(pod)
        # Ready, and Ready all the time for a minute, with no restarts.
        end = time.monotonic() + STAY_READY_SECONDS
        while time.monotonic() < end:
            pod = the_pod(api, ns, "probed")
            assert wl.pod_ready(pod), pod.status
            assert restarts(pod) == {"istio-proxy": 0, "main": 0}, restarts(pod)
            time.sleep(1)
        # The TCP startup probe failed for the app without its TCP listener all this while.
        stuck = the_pod(api, ns, "no-tcp")
        assert not wl.pod_ready(stuck), stuck.status
        assert restarts(stuck)["main"] >= 1, restarts(stuck)
        assert restarts(stuck)["istio-proxy"] == 0, restarts(stuck)

        # The app says it is unhealthy: NOT_SERVING (gRPC) takes it out of service first...
        name = pod.metadata.name
        unhealthy = f"http://127.0.0.1:{HTTP_PORT}/healthz?healthy=false"
        sick = wl.pod_exec(api, ns, name, ["meshtest", "http", "-X", "POST", unhealthy], "main")
        # meshtest answers the switch with the state it is now in: 503.
        assert '"query":"healthy=false"' in sick.stdout, sick
        unready = wl.retry(
            lambda: the_pod(api, ns, "probed"), lambda p: not wl.pod_ready(p), 10, 0.2
        )
        assert not wl.pod_ready(unready), unready.status
        assert restarts(unready)["main"] == 0, restarts(unready)
        # ...then the HTTP liveness probe (503) restarts it, and the new process is healthy.
        restarted = wl.retry(
            lambda: the_pod(api, ns, "probed"),
            lambda p: restarts(p)["main"] >= 1 and wl.pod_ready(p),
            60,
            0.5,
        )
        assert restarts(restarted) == {"istio-proxy": 0, "main": 1}, restarts(restarted)
        assert wl.pod_ready(restarted), restarted.status
