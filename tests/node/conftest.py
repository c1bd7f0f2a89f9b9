"""Fixtures the node tests of injected pods share."""

from __future__ import annotations

import json
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.cli import run_meshctl
from tests.harness.node import TestNode

CNI_NS = "meshctl-system"


@pytest.fixture(scope="module")
def cni_capture(kube_node: TestNode) -> Iterator[None]:
    """``meshctl cni manifest`` rolled out, so injected pods (``--cni``) are captured by the
    plugin containerd calls: the meshctl image carries no iptables libraries for an init
    container. Removed, with its namespace, after the module. The agent enters each pod's netns
    by its path: this node's containerd pins them under its state dir (``--netns-dir``)."""
    kube_node.image("meshctl")
    netns_dir = str(nodehost.WORKDIR / "containerd" / "state")
    printed = run_meshctl("cni", "manifest", "--netns-dir", netns_dir, "-o", "json")
    assert printed.returncode == 0, printed.stderr
    objects = json.loads(printed.stdout)["items"]
    with kube_node.cluster.api_client() as api:
        k8s.CoreV1Api(api).create_namespace({"metadata": {"name": CNI_NS}})
        try:
            wl.wait_service_account(api, CNI_NS)
            wl.apply(api, objects)
            try:
                wl.wait_rollout(api, "DaemonSet", CNI_NS, "meshctl-cni-node", timeout=180)
            except TimeoutError as exc:
                pytest.fail(f"{exc}\n{wl.describe_namespace(api, CNI_NS)}")
            yield
        finally:
            wl.delete(api, objects)
            wl.delete_namespace_now(api, CNI_NS)
