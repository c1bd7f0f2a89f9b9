"""``meshctl analyze`` on the real node, against a mesh installed as a user installs it.

The default profile installed from the meshctl image, a namespace labelled for injection with an
injected pod: ``analyze --all-namespaces`` finds no error and exits 0. Then the mistakes a user
makes: a pod created while the namespace's injection label was off (so the webhook never saw it)
and an AuthorizationPolicy whose selector has a typo. ``analyze`` names the pod with MSH0204 and
its fix and exits 3; the policy is a warning (MSH0101).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.mesh_install import Mesh, installed
from tests.harness.node import TestNode, report_namespace

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"
PROXY = "istio-proxy"


@pytest.fixture(scope="module")
def mesh(kube_node: TestNode) -> Iterator[Mesh]:
    # CNI-mode injection, as test_install_on_node: the agent enters netns where this node pins them.
    netns_dir = nodehost.WORKDIR / "containerd" / "state"
    extra = ["--set", f"components.cni.netnsDir={netns_dir}"]
    with installed(Mesh(kube_node, extra=extra)) as mesh:
        yield mesh


def analyze(mesh: Mesh, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    done = mesh.run("analyze", "-o", "json", *args, timeout=60)
    assert "Traceback" not in done.stderr, done.stderr
    return done.returncode, json.loads(done.stdout), done.stdout + done.stderr


def label_injection(core: k8s.CoreV1Api, namespace: str, value: str | None) -> None:
    core.patch_namespace(namespace, {"metadata": {"labels": {"istio-injection": value}}})


def test_analyze_is_clean_on_a_healthy_mesh_and_names_a_pod_the_webhook_never_saw(
    kube_node: TestNode, mesh: Mesh, node_namespace: str, request
):
    report_namespace(request.node, SYSTEM_NS)
    busybox = kube_node.image("busybox")
    sleeper = ["sleep", "3600"]
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        label_injection(core, node_namespace, "enabled")
        wl.apply(api, [wl.busybox_pod("meshed", busybox, sleeper)], node_namespace)
        pod = wl.wait_pod_phase(api, node_namespace, "meshed", ["Running"], timeout=120)
        assert PROXY in [c.name for c in [*(pod.spec.init_containers or []), *pod.spec.containers]]

        code, findings, printed = analyze(mesh, "--all-namespaces")
        assert code == 0, printed
        assert [f for f in findings if f["level"] == "Error"] == [], printed
        # The mesh's own objects draw no finding at all, not even an Info.
        own = [f for f in findings if SYSTEM_NS in (f["object"]["namespace"], f["object"]["name"])]
        assert own == [], printed

        # The mistakes: a pod created while injection was off, a policy selector with a typo.
        label_injection(core, node_namespace, None)
        wl.apply(api, [wl.busybox_pod("late", busybox, sleeper)], node_namespace)
        label_injection(core, node_namespace, "enabled")
        policy = {
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": "typo"},
            "spec": {"selector": {"matchLabels": {"app": "meshd"}}, "rules": [{}]},
        }
        wl.apply(api, [policy], node_namespace)

    code, findings, printed = analyze(mesh, "-n", node_namespace)
    assert code == 3, printed
    found = {(f["code"], f["object"]["kind"], f["object"]["name"]) for f in findings}
    assert found == {("MSH0204", "Pod", "late"), ("MSH0101", "AuthorizationPolicy", "typo")}, (
        printed
    )
    late = next(f for f in findings if f["code"] == "MSH0204")
    assert f"kubectl delete pod late -n {node_namespace}" in str(late["fix"]), printed
    table = mesh.run("analyze", "-n", node_namespace, timeout=60)
    assert table.returncode == 3, table.stdout + table.stderr
    assert f"Error [MSH0204] (Pod {node_namespace}/late)" in table.stdout, table.stdout
