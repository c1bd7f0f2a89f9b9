"""``meshctl install --profile ambient`` on the real node, from the meshctl image.

The ambient profile as a user installs it: the control plane, the CNI plugin with the node agent
and the node proxy DaemonSet, all Ready; ``verify`` all ✔ including the node proxy's check; two
pods of a namespace labelled ``istio.io/dataplane-mode=ambient`` enrolled by the agent and
talking with mutual TLS through the installed node proxy; ``uninstall --purge`` leaves nothing of
ours and the node's CNI config without our entry. The tests run in order on one install.
"""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest

from meshctl.core.k8s.cni.spec import PLUGIN_TYPE
from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.ambient_pods import NODE_PROXY_SELECTOR, talk_mtls_through_node_proxy
from tests.harness.mesh_install import Mesh, failing, installed, ours
from tests.harness.node import CNI_CONF_DIR, CONFLIST_NAME, TestNode, report_namespace

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"
NODE_PROXY_CHECK = "meshctl-ztunnel: node proxy is ready on every node"


@pytest.fixture(scope="module")
def ambient_mesh(kube_node: TestNode) -> Iterator[Mesh]:
    # This node's containerd pins pod netns under its own state directory, not /var/run/netns.
    netns_dir = nodehost.WORKDIR / "containerd" / "state"
    values = ["--set", f"components.cni.netnsDir={netns_dir}"]
    with installed(Mesh(kube_node, "ambient", values)) as mesh:
        yield mesh


def test_ambient_install_is_ready_and_verify_is_all_green(kube_node: TestNode, ambient_mesh: Mesh):
    with kube_node.cluster.api_client() as api:
        running = wl.pods(api, SYSTEM_NS)
        proxies = wl.pods(api, SYSTEM_NS, NODE_PROXY_SELECTOR)
    assert proxies, "the ambient profile installed no node proxy"
    for pod in running:
        assert pod.status.phase == "Running", pod.metadata.name
        assert wl.pod_ready(pod), pod.metadata.name
    assert {c.image for p in running for c in p.spec.containers} == {ambient_mesh.image}
    code, checks, printed = ambient_mesh.verify()
    assert code == 0, printed
    assert not failing(checks), printed
    assert checks[NODE_PROXY_CHECK]["result"] == "success", printed


def test_ambient_pods_talk_mtls_through_the_installed_node_proxy(
    kube_node: TestNode, ambient_mesh: Mesh, node_namespace: str, request
):
    report_namespace(request.node, SYSTEM_NS)
    with kube_node.cluster.api_client() as api:
        talk_mtls_through_node_proxy(api, node_namespace, kube_node.image("busybox"), SYSTEM_NS)


def test_ambient_uninstall_purge_leaves_nothing(kube_node: TestNode, ambient_mesh: Mesh):
    removed = ambient_mesh.run("uninstall", "-y", "--purge", timeout=300)
    assert removed.returncode == 0, removed.stderr
    assert ours(kube_node) == []
    plugins = json.loads((CNI_CONF_DIR / CONFLIST_NAME).read_text())["plugins"]
    assert all(p.get("type") != PLUGIN_TYPE for p in plugins), plugins
