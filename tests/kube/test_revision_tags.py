"""``meshctl tag set|list|remove`` against a real kube-apiserver: two revisions' injector
configurations as install leaves them (with their CA bundle), a tag pointed at one and moved to
the other, the API server sending a tagged namespace's pods to the tag's revision, and the
refusals (no such revision, a move without --overwrite, removing a tag still in use)."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from meshctl.core.k8s import tags
from meshctl.core.k8s.inject.webhook_config import WebhookTarget, webhook_configuration
from meshctl.core.pki.ca import mint_root
from tests.harness.cli import run_on_cluster
from tests.harness.kube import KubeCluster, create_namespace, delete_namespace

pytestmark = pytest.mark.kube

# A real root (the API server parses the bundle before it calls a webhook).
PEM = mint_root(trust_domain="cluster.local", now=datetime.now(UTC))[0].encode()


def _meshctl(cluster: KubeCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return run_on_cluster(cluster.kubeconfig, *args, timeout=120)


def revision_configuration(revision: str, namespace: str) -> dict[str, object]:
    """What ``meshctl install --revision R`` leaves: its injector's configuration, labelled as the
    control plane's, with the CA bundle its leader patched in."""
    live = webhook_configuration(
        ca_bundle=PEM,
        target=WebhookTarget(service=f"meshctl-controlplane-{revision}", namespace=namespace),
        revision=revision,
    )
    live["metadata"]["labels"].update(  # type: ignore[index]
        {tags.COMPONENT_LABEL: "controlplane", "app.kubernetes.io/managed-by": "meshctl"}
    )
    return live


@pytest.fixture
def revisions(kube_api, kube_namespace) -> Iterator[tuple[str, str]]:
    """Two installed revisions (unique names: the configurations are cluster-scoped)."""
    suffix = kube_namespace.rsplit("-", 1)[-1]
    names = (f"blue-{suffix}", f"green-{suffix}")
    admission = k8s.AdmissionregistrationV1Api(kube_api)
    for name in names:
        admission.create_mutating_webhook_configuration(
            revision_configuration(name, kube_namespace)
        )
    try:
        yield names
    finally:
        for item in admission.list_mutating_webhook_configuration().items:
            labels = item.metadata.labels or {}
            if labels.get("istio.io/rev") in names:
                admission.delete_mutating_webhook_configuration(item.metadata.name)


def test_set_list_move_and_remove_a_tag(  # noqa: PLR0915 (one user flow)
    kube_cluster, kube_api, kube_namespace, revisions, tmp_path
):
    blue, green = revisions
    tag = f"prod-{blue.rsplit('-', 1)[-1]}"
    app_ns = f"{kube_namespace}-app"[:60]
    create_namespace(kube_api, app_ns, labels={"istio.io/rev": tag})
    admission = k8s.AdmissionregistrationV1Api(kube_api)
    try:
        # --dry-run prints the object set would apply, and applies nothing.
        dry = _meshctl(kube_cluster, "tag", "set", tag, "--revision", blue, "--dry-run")
        assert dry.returncode == 0, dry.stderr
        printed = yaml.safe_load(dry.stdout)
        assert printed["metadata"]["name"] == f"meshctl-revision-tag-{tag}"
        assert printed["metadata"]["labels"]["istio.io/rev"] == blue
        with pytest.raises(ApiException) as absent:
            admission.read_mutating_webhook_configuration(f"meshctl-revision-tag-{tag}")
        assert absent.value.status == 404

        done = _meshctl(kube_cluster, "tag", "set", tag, "--revision", blue, "-o", "json")
        assert done.returncode == 0, done.stderr
        live = admission.read_mutating_webhook_configuration(f"meshctl-revision-tag-{tag}")
        assert live.metadata.labels["istio.io/tag"] == tag
        assert {w.client_config.service.name for w in live.webhooks} == {
            f"meshctl-controlplane-{blue}"
        }
        assert all(w.client_config.ca_bundle for w in live.webhooks)  # copied from blue's

        listed = _meshctl(kube_cluster, "tag", "list", "-o", "json")
        assert listed.returncode == 0, listed.stderr
        rows = [r for r in json.loads(listed.stdout) if r["tag"] == tag]
        assert rows == [{"tag": tag, "revision": blue, "namespaces": [app_ns]}]
        table = _meshctl(kube_cluster, "tag", "list")
        assert table.returncode == 0, table.stderr
        assert table.stdout.splitlines()[0].split() == ["TAG", "REVISION", "NAMESPACES"]
        saved = tmp_path / "tags.txt"
        into_file = _meshctl(kube_cluster, "tag", "list", "-O", str(saved))
        assert (into_file.returncode, into_file.stdout) == (0, "")
        assert saved.read_text() == table.stdout

        # The API server sends the tagged namespace's pods to blue's injector (absent here:
        # failurePolicy Fail names the service it called).
        pod = {"metadata": {"name": "p"}, "spec": {"containers": [{"name": "a", "image": "a"}]}}
        with pytest.raises(ApiException) as refused:
            k8s.CoreV1Api(kube_api).create_namespaced_pod(app_ns, pod, dry_run="All")
        assert f"meshctl-controlplane-{blue}" in refused.value.body, refused.value.body
        assert f"{tag}.rev.namespace.sidecar-injector.meshctl.io" in refused.value.body

        # The revision a tag points at is not uninstalled (the tag's pods would be refused).
        kept = _meshctl(kube_cluster, "uninstall", "-y", "--revision", blue, "-n", kube_namespace)
        assert kept.returncode == 1, kept.stderr
        assert f"revision '{blue}' is still the target of tag(s) {tag}" in kept.stderr
        assert "meshctl tag set" in kept.stderr
        assert admission.read_mutating_webhook_configuration(f"meshctl-sidecar-injector-{blue}")

        moved = _meshctl(kube_cluster, "tag", "set", tag, "--revision", green)
        assert moved.returncode == 1, moved.stderr
        assert f"already points at revision '{blue}'" in moved.stderr
        assert "--overwrite" in moved.stderr
        moved = _meshctl(kube_cluster, "tag", "set", tag, "-r", green, "--overwrite", "-o", "table")
        assert moved.returncode == 0, moved.stderr
        assert f"moved from revision '{blue}' to '{green}'" in moved.stderr
        assert moved.stdout.split() == ["TAG", "REVISION", "NAMESPACES", tag, green, app_ns]
        live = admission.read_mutating_webhook_configuration(f"meshctl-revision-tag-{tag}")
        assert {w.client_config.service.name for w in live.webhooks} == {
            f"meshctl-controlplane-{green}"
        }
        with pytest.raises(ApiException) as refused:
            k8s.CoreV1Api(kube_api).create_namespaced_pod(app_ns, pod, dry_run="All")
        assert f"meshctl-controlplane-{green}" in refused.value.body, refused.value.body

        # Removing a tag in use is refused; --dry-run=server removes nothing; --force removes.
        kept = _meshctl(kube_cluster, "tag", "remove", tag)
        assert kept.returncode == 1, kept.stderr
        assert f"still used by namespace(s) {app_ns}" in kept.stderr
        assert "Traceback" not in kept.stderr
        dry = _meshctl(kube_cluster, "tag", "remove", tag, "--force", "--dry-run=server")
        assert dry.returncode == 0, dry.stderr
        assert admission.read_mutating_webhook_configuration(f"meshctl-revision-tag-{tag}")
        gone = _meshctl(kube_cluster, "tag", "remove", tag, "--force")
        assert gone.returncode == 0, gone.stderr
        assert gone.stdout.strip() == (
            f"mutatingwebhookconfiguration.admissionregistration.k8s.io/meshctl-revision-tag-{tag}"
        )
        with pytest.raises(ApiException) as absent:
            admission.read_mutating_webhook_configuration(f"meshctl-revision-tag-{tag}")
        assert absent.value.status == 404
    finally:
        delete_namespace(kube_api, app_ns)
        try:
            admission.delete_mutating_webhook_configuration(f"meshctl-revision-tag-{tag}")
        except ApiException as exc:
            if exc.status != 404:
                raise


def test_a_tag_never_points_at_a_revision_that_is_not_installed(kube_cluster, revisions):
    blue, _ = revisions
    done = _meshctl(kube_cluster, "tag", "set", "prod-x", "--revision", "nosuch")
    assert done.returncode == 1
    assert "revision 'nosuch' is not installed" in done.stderr
    assert blue in done.stderr  # the installed ones are named
    assert "Hint: install it first" in done.stderr
    named = _meshctl(kube_cluster, "tag", "set", blue, "--revision", blue)
    assert named.returncode == 1
    assert "has the name of an installed revision" in named.stderr
    bad = _meshctl(kube_cluster, "tag", "set", "Prod", "--revision", blue)
    assert bad.returncode == 2
    assert "invalid tag 'Prod'" in bad.stderr
    missing = _meshctl(kube_cluster, "tag", "remove", "nosuch")
    assert missing.returncode == 1
    assert "tag 'nosuch' not found" in missing.stderr
