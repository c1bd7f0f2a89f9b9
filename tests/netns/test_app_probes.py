"""An injected pod's probes through the proxy, in real namespaces with capture active.

The pod spec goes through the injector; the app serves HTTP on a named port, a bare TCP port and
gRPC health; the proxy runs with the env the injector wrote (``ISTIO_KUBE_APP_PROBERS``,
``INSTANCE_IP``) behind the init container's own capture rules; the "kubelet" asks from the node
namespace (outside the pod) at the paths the rewritten probes name. Healthy: 200. App stopped:
503 within each probe's timeout. A path the injector did not write: 404. Prometheus, sent to
:15020 by the rewritten annotations, gets the proxy's metrics and the app's.
"""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

from meshctl.core.k8s.inject.pipeline import inject_pod
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.core.pki.identity import SpiffeId
from tests.harness.netns import Pod, node_with_pods
from tests.netns.ztunnel_harness import (
    Ca,
    Sidecar,
    capture,
    http_get,
    workload,
    write_local_config,
)

pytestmark = pytest.mark.netns

HTTP_PORT, TCP_PORT, GRPC_PORT = 8080, 6379, 50051
POD = {
    "metadata": {
        "name": "shop",
        "namespace": "prod",
        "labels": {"app": "shop"},
        "annotations": {"prometheus.io/port": str(HTTP_PORT), "prometheus.io/path": "/metrics"},
    },
    "spec": {
        "containers": [
            {
                "name": "app",
                "image": "registry.example/app:1",
                "ports": [{"name": "http", "containerPort": HTTP_PORT}],
                "readinessProbe": {
                    "httpGet": {"path": "/healthz", "port": "http"},
                    "timeoutSeconds": 2,
                },
                "livenessProbe": {"tcpSocket": {"port": TCP_PORT}, "timeoutSeconds": 1},
                "startupProbe": {"grpc": {"port": GRPC_PORT}, "timeoutSeconds": 2},
            }
        ]
    },
}


def injected() -> dict:
    return inject_pod(POD, InjectSettings(image="x"), workload_name="shop", namespace="prod").pod


def proxy_of(pod: dict) -> dict:
    return next(c for c in pod["spec"]["initContainers"] if c["name"] == "istio-proxy")


def kubelet_paths(pod: dict) -> dict[str, tuple[str, float]]:
    """probe field -> (path the kubelet asks for on :15020, the probe's timeout)."""
    app = pod["spec"]["containers"][0]
    out = {}
    for field in ("readinessProbe", "livenessProbe", "startupProbe"):
        probe = app[field]
        assert set(probe) == {"httpGet", "timeoutSeconds"}, probe
        assert probe["httpGet"]["port"] == 15020
        out[field] = (probe["httpGet"]["path"], float(probe["timeoutSeconds"]))
    return out


def start_app(pod: Pod) -> subprocess.Popen[bytes]:
    argv = [sys.executable, "-m", "tests.netns.probe_app"]
    app = pod.ns.popen(
        [*argv, str(HTTP_PORT), str(TCP_PORT), str(GRPC_PORT)],
        stdout=subprocess.PIPE,
        cwd=Path(__file__).resolve().parents[2],
    )
    assert app.stdout is not None
    assert app.stdout.readline().strip() == b"ready"
    return app


def test_the_kubelet_probes_an_injected_pod_through_its_proxy(tmp_path: Path):
    pod_spec = injected()
    proxy = proxy_of(pod_spec)
    env = {e["name"]: e["value"] for e in proxy["env"] if "value" in e}
    init = pod_spec["spec"]["initContainers"][0]
    assert init["name"] == "istio-init"
    paths = kubelet_paths(pod_spec)
    with node_with_pods(1) as node:
        pod = node.pods[0]
        ca = Ca.create(tmp_path)
        certs = ca.issue("shop", SpiffeId("cluster.local", "prod", "shop"))
        config = write_local_config(
            tmp_path / "local.yaml", workloads=[workload("shop", "prod", pod.ip)]
        )
        # The init container's own arguments: what the injected pod would run.
        capture(pod.ns, *init["args"][2:])
        rules = pod.ns.run(["iptables-save", "-t", "nat"]).stdout
        assert "-j MESH_INBOUND" in rules
        assert "--dports 15090,15021,15020 -j RETURN" in rules  # the kubelet reaches :15020
        app = start_app(pod)
        car = Sidecar(
            pod.ns,
            "prod/shop/shop",
            certs,
            config,
            log_path=tmp_path / "sidecar.log",
            env={
                "ISTIO_KUBE_APP_PROBERS": env["ISTIO_KUBE_APP_PROBERS"],
                "ISTIO_PROMETHEUS_ANNOTATIONS": env["ISTIO_PROMETHEUS_ANNOTATIONS"],
                "INSTANCE_IP": pod.ip,
            },
        )
        try:
            car.start()
            for field, (path, _) in paths.items():
                status, body = http_get(node.ns, 15020, path, host=pod.ip)
                assert status == 200, (field, body, car.log_text())
            assert http_get(node.ns, 15020, "/app-health/other/readyz", host=pod.ip)[0] == 404
            annotations = pod_spec["metadata"]["annotations"]
            assert annotations["prometheus.io/port"] == "15020"
            status, merged = http_get(
                node.ns, 15020, annotations["prometheus.io/path"], host=pod.ip
            )
            assert status == 200
            assert "istio_build" in merged
            assert merged.endswith("app_orders_total 7\n")
            app.kill()
            app.wait()
            for field, (path, timeout) in paths.items():
                started = time.monotonic()
                status, body = http_get(node.ns, 15020, path, host=pod.ip)
                elapsed = time.monotonic() - started
                assert status == 503, (field, body)
                assert elapsed < timeout, (field, elapsed)
        finally:
            app.kill()
            app.wait()
            car.stop()
