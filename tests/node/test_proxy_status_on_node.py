"""``meshctl proxy-status`` and ``proxy-config`` on the real node, as a user runs them.

``meshctl install --profile ambient`` (the node proxy, the CNI agent, the control plane and its
injection webhook), an ambient pod and a sidecar-injected pod; then, through the API server only
(port-forward, a TokenRequest token), ``proxy-status`` lists the sidecar and the node proxy as
SYNCED with a certificate expiry, shows the sidecar's detail, and ``proxy-config`` reads real
workloads and certificates from the sidecar and, for the ambient pod, from its node proxy.
"""

from __future__ import annotations

import functools
import json
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from meshctl.core.k8s import ambient
from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.mesh_install import Mesh, installed
from tests.harness.node import TestNode, report_namespace

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"


@pytest.fixture(scope="module")
def ambient_mesh(kube_node: TestNode) -> Iterator[Mesh]:
    netns_dir = nodehost.WORKDIR / "containerd" / "state"
    values = ["--set", f"components.cni.netnsDir={netns_dir}"]
    with installed(Mesh(kube_node, "ambient", values)) as mesh:
        yield mesh


def _json(mesh: Mesh, *args: str) -> Any:
    done = mesh.run(*args, "-o", "json", timeout=120)
    assert "Traceback" not in done.stderr, done.stderr
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_proxy_status_and_proxy_config_read_real_proxies(
    kube_node: TestNode, ambient_mesh: Mesh, node_namespace: str, request, tmp_path
):
    report_namespace(request.node, SYSTEM_NS)
    sidecar_ns = f"{node_namespace[:50]}-sc"
    image = kube_node.image("busybox")
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.patch_namespace(
            node_namespace, {"metadata": {"labels": {ambient.DATAPLANE_MODE: ambient.MODE_AMBIENT}}}
        )
        core.create_namespace(
            {"metadata": {"name": sidecar_ns, "labels": {"istio-injection": "enabled"}}}
        )
        report_namespace(request.node, sidecar_ns)
        try:
            for ns in (node_namespace, sidecar_ns):
                wl.wait_service_account(api, ns)
                core.create_namespaced_service_account(ns, {"metadata": {"name": "app"}})
                pod = wl.busybox_pod("app", image, ["sleep", "3600"], serviceAccountName="app")
                core.create_namespaced_pod(ns, pod)
            for ns in (node_namespace, sidecar_ns):
                wl.wait_pod_ready(api, ns, "app", timeout=180)
            injected = core.read_namespaced_pod("app", sidecar_ns)
            names = [
                c.name for c in [*(injected.spec.init_containers or []), *injected.spec.containers]
            ]
            assert "istio-proxy" in names, names
            wl.retry(
                functools.partial(core.read_namespaced_pod, "app", node_namespace),
                lambda p: (p.metadata.annotations or {}).get(ambient.REDIRECTION) == "enabled",
                timeout=60,
            )
            node_proxy = wl.pods(api, SYSTEM_NS, "app.kubernetes.io/name=meshctl-ztunnel")[0]
            _check_status(
                ambient_mesh, sidecar_ns, node_namespace, node_proxy.metadata.name, tmp_path
            )
            _check_config(ambient_mesh, sidecar_ns, node_namespace)
        finally:
            wl.delete_namespace_now(api, sidecar_ns, wait=False)


def _check_status(mesh: Mesh, sidecar_ns: str, ambient_ns: str, node_proxy: str, tmp_path) -> None:
    sidecar = f"{sidecar_ns}/app"
    zt = f"{SYSTEM_NS}/{node_proxy}"
    deadline = time.monotonic() + 60  # until both streams ACKed and both proxies hold certs
    while True:
        status = _json(mesh, "proxy-status")
        rows = {p["requester"]: p for p in status["proxies"]}
        ready = [
            name
            for name in (sidecar, zt)
            if name in rows and rows[name]["status"] == "SYNCED" and rows[name]["certificates"]
        ]
        if len(ready) == 2:
            break
        assert time.monotonic() < deadline, json.dumps(status, indent=1)[-4000:]
        time.sleep(2)
    assert status["unreachable"] == []
    assert rows[zt]["kind"] == "node proxy"
    assert rows[sidecar]["kind"] == "sidecar"
    assert rows[zt]["node"] == rows[sidecar]["node"] != ""
    assert rows[zt]["controlPlane"].startswith("meshctl-controlplane")
    # The node proxy holds the ambient pod's certificate (signed on its behalf).
    held = {c["identity"] for c in rows[zt]["certificates"]}
    assert f"spiffe://cluster.local/ns/{ambient_ns}/sa/app" in held, held
    table = mesh.run("proxy-status")
    assert table.returncode == 0, table.stderr
    print(table.stdout)  # shown with -s: what a user sees
    line = next(row for row in table.stdout.splitlines() if row.startswith(sidecar))
    assert "SYNCED" in line, table.stdout
    assert "sidecar" in line, table.stdout
    assert table.stdout.splitlines()[0].split()[:2] == ["NAME", "KIND"]
    detail = mesh.run("proxy-status", "app", "-n", sidecar_ns)
    assert detail.returncode == 0, detail.stderr
    print(detail.stdout)
    assert "istio.workload.Address" in detail.stdout, detail.stdout
    assert "SYNCED" in detail.stdout, detail.stdout
    served = mesh.run("proxy-status", "app", "-n", ambient_ns, "-o", "json")
    assert served.returncode == 0, served.stderr
    assert [p["requester"] for p in json.loads(served.stdout)] == [zt], served.stdout
    assert f"served by node proxy {zt}" in served.stderr, served.stderr
    saved = tmp_path / "status.json"
    written = mesh.run("proxy-status", "-o", "json", "-O", str(saved))
    assert written.returncode == 0, written.stderr
    assert written.stdout == ""
    assert sidecar in {p["requester"] for p in json.loads(saved.read_text())["proxies"]}


def _check_config(mesh: Mesh, sidecar_ns: str, ambient_ns: str) -> None:
    """proxy-config: the sidecar's own admin port, and the ambient pod's view of its node
    proxy."""
    workloads = mesh.run("proxy-config", "workloads", "app", "-n", ambient_ns)
    assert workloads.returncode == 0, workloads.stderr
    print(workloads.stdout)
    mine = [r for r in workloads.stdout.splitlines() if r.startswith("app ") and ambient_ns in r]
    assert mine, workloads.stdout
    assert "HBONE" in mine[0], workloads.stdout
    certs = mesh.run("proxy-config", "certs", "app", "-n", ambient_ns)
    assert certs.returncode == 0, certs.stderr
    print(certs.stdout)
    assert f"spiffe://cluster.local/ns/{ambient_ns}/sa/app" in certs.stdout, certs.stdout
    assert "leaf" in certs.stdout, certs.stdout
    assert "Available" in certs.stdout, certs.stdout
    own = _json(mesh, "proxy-config", "certs", "app", "-n", sidecar_ns)
    assert own[0]["identity"] == f"spiffe://cluster.local/ns/{sidecar_ns}/sa/app", own
    assert own[0]["certChain"][0]["serialNumber"]
    listeners = mesh.run("proxy-config", "listeners", "app", "-n", sidecar_ns)
    assert listeners.returncode == 0, listeners.stderr
    print(listeners.stdout)
    assert "inbound" in listeners.stdout, listeners.stdout
    missing = mesh.run("proxy-config", "certs", "no-such-pod", "-n", sidecar_ns)
    assert missing.returncode == 1, missing.stderr
    assert missing.stderr.startswith("Error: "), missing.stderr
    assert "Traceback" not in missing.stderr
