"""``meshctl install``'s preflight warning against a real kube-apiserver: a ``localhost/`` image
that a node's ``status.images`` does not list is named with that node and the push-and-set fix;
an image the node lists, or one from a registry, is not."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from meshctl import __version__
from tests.harness.kube import KubeCluster

pytestmark = pytest.mark.kube

HELD = "localhost/meshctl:held-by-the-node"


@pytest.fixture
def node_with_images(kube_api: k8s.ApiClient) -> Iterator[str]:
    """A Node object (no kubelet behind it) whose status lists one image, ``HELD``."""
    name = f"image-warning-{os.getpid()}"
    core = k8s.CoreV1Api(kube_api)
    core.create_node({"metadata": {"name": name}})
    try:
        core.patch_node_status(
            name, {"status": {"images": [{"names": [HELD, "pause:3"], "sizeBytes": 1}]}}
        )
        yield name
    finally:
        core.delete_node(name)


def _install(cluster: KubeCluster, namespace: str, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "MESHCTL_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "meshctl", "--kubeconfig", str(cluster.kubeconfig), "install",
         "--profile", "minimal", "-n", namespace, "--dry-run=server", "--force", "-o", "name",
         *args],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip


def test_install_warns_about_a_local_image_a_node_does_not_list(
    kube_cluster, kube_namespace, node_with_images
):
    done = _install(kube_cluster, kube_namespace)
    assert done.returncode == 0, done.stderr
    warning = next(line for line in done.stderr.splitlines() if line.startswith("⚠"))
    assert f"the image localhost/meshctl:{__version__} is a local name" in warning
    assert node_with_images in warning
    assert "Hint: push it to a registry the nodes can pull from: 'meshctl image push" in done.stderr
    assert "--set image=REGISTRY/meshctl:TAG" in done.stderr


def test_install_says_nothing_of_an_image_the_node_holds_or_a_registrys(
    kube_cluster, kube_namespace, node_with_images
):
    held = _install(kube_cluster, kube_namespace, "--set", f"image={HELD}")
    assert held.returncode == 0, held.stderr
    assert node_with_images not in held.stderr  # other nodes of the session may lack it
    pulled = _install(kube_cluster, kube_namespace, "--set", "image=registry.example/m:1")
    assert pulled.returncode == 0, pulled.stderr
    assert "⚠" not in pulled.stderr
