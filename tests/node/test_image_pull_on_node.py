"""The meshctl image from a registry on the real node: ``meshctl image push`` to Debian's
docker-registry on loopback, the node's containerd configured to pull from it (hosts.toml), and
``meshctl install --set image=<registry>/meshctl:<version>`` runs the control plane from the pulled
image, not an imported tarball (the pushed image is the imported one with one more label, so the
node holds its layers but must pull its manifest and config). ``verify --pre`` warns about a
``localhost/`` image the node does not hold, and not about the one it imported."""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest
from kubernetes import client as k8s

from meshctl import __version__
from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.cli import run_meshctl
from tests.harness.mesh_install import SYSTEM_NS, Mesh, installed
from tests.harness.node import TestNode, registry_hosts_dir
from tests.harness.registry import Registry, node_pulls_from, relabelled, start_registry

pytestmark = pytest.mark.node

WARNING = "the nodes can get the meshctl image"


@pytest.fixture(scope="module")
def registry(kube_node: TestNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Registry]:
    kube_node.image("meshctl")  # the node runs (and imported the localhost/ image)
    hosts = registry_hosts_dir(nodehost.WORKDIR)
    with (
        start_registry(tmp_path_factory.mktemp("registry")) as started,
        node_pulls_from(started, hosts),
    ):
        yield started


def _pushed(kube_node: TestNode, registry: Registry, work: Path) -> tuple[str, str]:
    """The node's meshctl image with one more label, pushed: its layers are on the node already
    (imported), its config and manifest are not, so the node has to pull those."""
    reference = f"{registry.host}/meshctl:{__version__}"
    archive = work / "meshctl-relabelled.tar"
    digest = relabelled(kube_node.archives["meshctl"], archive, "io.meshctl.test.pulled")
    done = run_meshctl(
        "image", "push", reference, "--from", str(archive), "--insecure", "-o", "json"
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["digest"] == digest
    return reference, digest


def test_install_runs_the_control_plane_from_the_image_pushed_to_a_registry(
    kube_node: TestNode, registry: Registry, tmp_path: Path
):
    reference, digest = _pushed(kube_node, registry, tmp_path)
    mesh = Mesh(
        kube_node,
        "minimal",
        image=reference,
        pull_policy="Always",  # every container start asks the registry
    )
    with installed(mesh), kube_node.cluster.api_client() as api:
        running = wl.pods(api, SYSTEM_NS)
        assert running, "no pods in meshctl-system"
        for pod in running:
            assert wl.pod_ready(pod), pod.metadata.name
            for status in pod.status.container_statuses or []:
                assert status.image == reference, status
                assert status.image_id.endswith(f"@{digest}"), status.image_id
        events = k8s.CoreV1Api(api).list_namespaced_event(SYSTEM_NS).items
        pulled = [e.message for e in events if e.reason == "Pulled"]
        assert any(f'Successfully pulled image "{reference}"' in m for m in pulled), pulled
    # The node's runtime (not only our push) fetched the manifest and the new config.
    by_containerd = [
        line for line in registry.log.read_text().splitlines()
        if line.startswith("127.0.0.1 - - ") and '"containerd/' in line
    ]  # fmt: skip
    assert any(f'"GET /v2/meshctl/manifests/{digest}' in line for line in by_containerd), (
        by_containerd
    )
    assert any('"GET /v2/meshctl/blobs/sha256:' in line for line in by_containerd), by_containerd


def _pre_check(kube_node: TestNode, image: str) -> dict[str, object]:
    done = run_meshctl(
        "--kubeconfig", str(kube_node.cluster.kubeconfig), "verify", "--pre", "--profile",
        "minimal", "--set", f"image={image}", "-o", "json", timeout=120,
    )  # fmt: skip
    report = json.loads(done.stdout)
    checks = [
        c for cat in report["categories"] for c in cat["checks"] if c["description"] == WARNING
    ]
    assert len(checks) == 1, done.stdout
    return checks[0]


def test_verify_pre_warns_about_a_local_image_the_node_lacks_and_not_the_imported_one(
    kube_node: TestNode,
):
    imported = _pre_check(kube_node, kube_node.image("meshctl"))
    assert imported["result"] == "success", imported
    missing = _pre_check(kube_node, "localhost/meshctl:0.0.0-nowhere")
    assert missing["result"] == "warning", missing
    assert "meshctl-test-node" in str(missing["error"])
    assert "meshctl image push" in str(missing["hint"])
