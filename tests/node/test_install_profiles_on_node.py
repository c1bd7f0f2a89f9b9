"""The other install profiles on the real node: ``minimal`` and ``demo``, from the meshctl image.

``minimal`` is the control plane alone (its injection webhook, no CNI agent); ``demo`` is the
default profile plus the ingress gateway: its Deployment Ready and its Service with the ports
Istio's demo gateway has (80→8080 http2, 443→8443 https, 31400 tcp, 15443 tls). Each installs,
``verify`` is all ✔, and ``uninstall --purge`` leaves nothing of ours.
"""

from __future__ import annotations

import pytest
from kubernetes import client as k8s

from tests.harness import workloads as wl
from tests.harness.mesh_install import Mesh, failing, ours, remove_crds_other_tests_applied
from tests.harness.node import TestNode

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"
GATEWAY_PORTS = {
    ("http2", 80, 8080),
    ("https", 443, 8443),
    ("tcp", 31400, 31400),
    ("tls", 15443, 15443),
}
COMPONENT = "install.meshctl.io/component"


@pytest.mark.parametrize("profile", ["minimal", "demo"])
def test_profile_installs_ready_verifies_and_purges(kube_node: TestNode, profile: str):
    remove_crds_other_tests_applied(kube_node)
    mesh = Mesh(kube_node, profile)
    try:
        installed = mesh.install()
        with kube_node.cluster.api_client() as api:
            if installed.returncode != 0:
                described = wl.describe_namespace(api, SYSTEM_NS)
                pytest.fail(f"install: {installed.returncode}\n{installed.stderr}\n{described}")
            running = wl.pods(api, SYSTEM_NS)
            core = k8s.CoreV1Api(api)
            services = {s.metadata.name: s for s in core.list_namespaced_service(SYSTEM_NS).items}
            hooks = k8s.AdmissionregistrationV1Api(api).list_mutating_webhook_configuration()
        for pod in running:
            assert wl.pod_ready(pod), pod.metadata.name
        components = {(p.metadata.labels or {}).get("app.kubernetes.io/name") for p in running}
        hooked = [h.metadata.name for h in hooks.items if h.metadata.name.startswith("meshctl-")]
        if profile == "minimal":
            # The control plane alone, its injection webhook included (as istiod's in Istio's
            # minimal profile); no CNI agent, no gateway.
            assert components == {"meshctl-controlplane"}, components
            assert hooked, "the control plane serves injection in every profile"
        else:
            assert "meshctl-ingressgateway" in components, components
            assert "meshctl-cni-node" in components, components
            gateway = services["meshctl-ingressgateway"]
            ports = {(p.name, p.port, int(p.target_port)) for p in gateway.spec.ports}
            assert ports >= GATEWAY_PORTS, ports
        code, checks, printed = mesh.verify()
        assert code == 0, printed
        assert not failing(checks), printed
    finally:
        removed = mesh.run("uninstall", "-y", "--purge", timeout=300)
    assert removed.returncode == 0, removed.stderr
    assert ours(kube_node) == []
