"""The mesh on the real node: ``meshctl controlplane`` as a 2-replica Deployment from our image,
and two pods injected by ``meshctl inject`` with no files of their own: their sidecars get
identities (projected tokens, the CA) and workloads (discovery) from it and carry the client's
requests to the server; an L4 DENY AuthorizationPolicy applied through the CRD refuses them, and
deleting it lets them through again.

The node has no cluster DNS, so the sidecars are pointed at the control plane's ClusterIP
(``MESHCTL_CA_ADDRESS`` when injecting) and check its certificate by its Service name
(``ALT_CA_HOSTNAME``/``ALT_XDS_HOSTNAME`` through ``proxy.istio.io/config`` proxyMetadata).
Capture is the CNI plugin's (``--cni``: the image carries no iptables libraries for an init
container). Traffic stays on the node bridge.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.harness import workloads as wl
from tests.harness.cli import run_meshctl
from tests.harness.controlplane import remove_published_roots
from tests.harness.node import TestNode, report_namespace

pytestmark = pytest.mark.node

INDEX = b"served through the mesh\n"
SERVICE = "meshctl-controlplane"


def custom_objects(api: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api)


@pytest.fixture(scope="module")
def control_plane(kube_node: TestNode) -> Iterator[dict[str, str]]:
    """The CRDs and the control plane's manifest applied; yields its namespace and address."""
    from meshctl_plugins.controlplane import crds, manifest

    from meshctl.core.k8s.install.components import standalone

    image = kube_node.image("meshctl")
    namespace = f"mesh-{os.urandom(3).hex()}"
    objects = manifest.objects(
        standalone(namespace, image), manifest.ControlPlaneValues(replicas=2)
    )
    with kube_node.cluster.api_client() as api:
        k8s.CoreV1Api(api).create_namespace({"metadata": {"name": namespace}})
        try:
            wl.wait_service_account(api, namespace)
            wl.apply(api, crds.objects())
            wl.apply(api, objects, namespace)
            try:
                wl.wait_rollout(api, "Deployment", namespace, SERVICE, timeout=180)
            except TimeoutError as exc:
                pytest.fail(f"{exc}\n{wl.describe_namespace(api, namespace)}")
            ip = k8s.CoreV1Api(api).read_namespaced_service(SERVICE, namespace).spec.cluster_ip
            yield {
                "namespace": namespace,
                "address": f"{ip}:15012",
                "name": f"{SERVICE}.{namespace}.svc",
            }
        finally:
            wl.delete(api, objects)
            wl.delete_namespace_now(api, namespace, wait=False)
            remove_published_roots(api)


def injected(pod: dict[str, Any], plane: dict[str, str], tmp_path: Path) -> dict[str, Any]:
    """``meshctl inject`` of the pod, as a user runs it, pointed at this control plane."""
    metadata = {"ALT_CA_HOSTNAME": plane["name"], "ALT_XDS_HOSTNAME": plane["name"]}
    pod["metadata"].setdefault("annotations", {})["proxy.istio.io/config"] = yaml.safe_dump(
        {"proxyMetadata": metadata}
    )
    source = tmp_path / f"{pod['metadata']['name']}.yaml"
    source.write_text(yaml.safe_dump(pod))
    out = run_meshctl(
        "inject", "-f", str(source), "--cni", env={"MESHCTL_CA_ADDRESS": plane["address"]}
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = yaml.safe_load(out.stdout)
    return result


def test_injected_pods_get_identities_and_workloads_from_the_control_plane_and_obey_a_policy(
    kube_node: TestNode,
    cni_capture: None,
    control_plane: dict[str, str],
    node_namespace: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
) -> None:
    report_namespace(request.node, control_plane["namespace"])
    image = kube_node.image("busybox")
    serve = (
        f"mkdir -p /tmp/www && printf '{INDEX.decode().strip()}\\n' > /tmp/www/index.html"
        " && exec httpd -f -p 8080 -h /tmp/www"
    )
    server = wl.busybox_pod("server", image, ["sh", "-c", serve], serviceAccountName="server")
    server["spec"]["containers"][0]["ports"] = [{"name": "http", "containerPort": 8080}]
    client = wl.busybox_pod("client", image, ["sleep", "3600"], serviceAccountName="client")
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "web"},
        "spec": {"selector": {"app": "server"}, "ports": [{"port": 80, "targetPort": "http"}]},
    }
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        for account in ("server", "client"):
            core.create_namespaced_service_account(node_namespace, {"metadata": {"name": account}})
        wl.apply(api, [service], node_namespace)
        # The leader publishes the mesh root in every namespace; the pods mount it.
        wl.retry(
            lambda: core.list_namespaced_config_map(node_namespace).items,
            lambda maps: any(m.metadata.name == "meshctl-ca-root-cert" for m in maps),
            timeout=60,
        )
        for pod in (server, client):
            core.create_namespaced_pod(node_namespace, injected(pod, control_plane, tmp_path))
        try:
            wl.wait_pod_ready(api, node_namespace, "server", timeout=120)
            wl.wait_pod_ready(api, node_namespace, "client", timeout=120)
        except TimeoutError as exc:
            pytest.fail(f"{exc}\n{wl.describe_namespace(api, node_namespace)}")
        vip = core.read_namespaced_service("web", node_namespace).spec.cluster_ip

        def fetch() -> wl.ExecResult:
            argv = ["wget", "-q", "-O", "-", f"http://{vip}/index.html"]
            return wl.pod_exec(api, node_namespace, "client", argv, container="main")

        got = wl.retry(fetch, lambda r: r.returncode == 0, timeout=30)
        assert got.stdout.encode() == INDEX
        # It went through both sidecars over mTLS: the server's proxy counted it.
        metrics = wl.pod_exec(
            api,
            node_namespace,
            "server",
            ["wget", "-q", "-O", "-", "http://127.0.0.1:15020/metrics"],
            container="main",
        ).stdout
        assert 'connection_security_policy="mutual_tls"' in metrics
        assert f'source_principal="spiffe://cluster.local/ns/{node_namespace}/sa/client"' in metrics
        # An L4 DENY from the client's identity, through the CRD.
        policy = {
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": "deny-client"},
            "spec": {
                "action": "DENY",
                "rules": [
                    {
                        "from": [
                            {
                                "source": {
                                    "principals": [f"cluster.local/ns/{node_namespace}/sa/client"]
                                }
                            }
                        ]
                    }
                ],
            },
        }
        args = ("security.istio.io", "v1", node_namespace, "authorizationpolicies")
        custom_objects(api).create_namespaced_custom_object(*args, policy)
        refused = wl.retry(fetch, lambda r: r.returncode != 0, timeout=30)
        assert refused.stdout == ""
        custom_objects(api).delete_namespaced_custom_object(*args, "deny-client")
        again = wl.retry(fetch, lambda r: r.returncode == 0, timeout=30)
        assert again.stdout.encode() == INDEX
