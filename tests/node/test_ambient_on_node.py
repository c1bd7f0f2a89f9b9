"""Ambient mode on the real node: the manifests as a user applies them, from our image.

``meshctl controlplane manifest`` (the CA and discovery), ``meshctl cni manifest --ambient`` (the
plugin and the node agent) and ``meshctl ztunnel manifest`` (the node proxy) run as pods of the
node; containerd calls the plugin for every new sandbox, the agent captures the pods of a
namespace labelled ``istio.io/dataplane-mode=ambient`` and hands them to the node proxy, which
gets each pod's certificate from the CA by impersonation and the workloads from discovery. Two
such pods talk through it with mutual TLS and each one's identity.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s
from meshctl_plugins.controlplane import crds

from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.ambient_pods import talk_mtls_through_node_proxy
from tests.harness.cli import run_meshctl
from tests.harness.node import TestNode, report_namespace

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"


def manifest(*args: str) -> list[dict[str, Any]]:
    printed = run_meshctl(*args, "-o", "json")
    assert printed.returncode == 0, printed.stderr
    items: list[dict[str, Any]] = json.loads(printed.stdout)["items"]
    return items


@pytest.fixture(scope="module")
def ambient_stack(kube_node: TestNode) -> Iterator[dict[str, Any]]:
    """Control plane, node agent and node proxy rolled out from the meshctl image."""
    image = kube_node.image("meshctl")
    netns_dir = str(nodehost.WORKDIR / "containerd" / "state")  # where this node pins netns
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": SYSTEM_NS}})
        applied: list[dict[str, Any]] = []
        try:
            wl.wait_service_account(api, SYSTEM_NS)
            # Discovery is not ready until the AuthorizationPolicy CRD lists (install applies
            # it; it stays for the session: later node tests read it too).
            wl.apply(api, crds.objects())
            plane = manifest("controlplane", "manifest", "--image", image, "--replicas", "1")
            applied += plane
            wl.apply(api, plane)
            wl.wait_rollout(api, "Deployment", SYSTEM_NS, "meshctl-controlplane", timeout=180)
            # No cluster DNS on this node: the proxy reaches the control plane by its ClusterIP
            # (and checks its certificate by the Service name, which the manifest sets).
            service = core.read_namespaced_service("meshctl-controlplane", SYSTEM_NS)
            address = f"{service.spec.cluster_ip}:15012"
            agent = manifest(
                "cni", "manifest", "--ambient", "--image", image, "--netns-dir", netns_dir
            )
            applied += agent
            wl.apply(api, agent)
            wl.wait_rollout(api, "DaemonSet", SYSTEM_NS, "meshctl-cni-node", timeout=180)
            proxy = manifest(
                "ztunnel", "manifest", "--image", image,
                "--ca-address", address, "--xds-address", address,
            )  # fmt: skip
            applied += proxy
            wl.apply(api, proxy)
            wl.wait_rollout(api, "DaemonSet", SYSTEM_NS, "meshctl-ztunnel", timeout=180)
            yield {"api": api}
        except TimeoutError as exc:
            pytest.fail(f"{exc}\n{wl.describe_namespace(api, SYSTEM_NS)}")
        finally:
            wl.delete(api, list(reversed(applied)))
            wl.delete_namespace_now(api, SYSTEM_NS)


def test_two_ambient_pods_talk_mtls_through_the_node_proxy(
    kube_node: TestNode, ambient_stack, node_namespace: str, request
):
    report_namespace(request.node, SYSTEM_NS)
    talk_mtls_through_node_proxy(
        ambient_stack["api"], node_namespace, kube_node.image("busybox"), SYSTEM_NS
    )
