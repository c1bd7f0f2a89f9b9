"""``install --dry-run=server|client`` and ``uninstall --dry-run`` against a real kube-apiserver,
as kubectl and istioctl take them: the server's own dry run (admitted, defaulted, nothing
persisted), the client's (no request at all), and a bare ``--dry-run`` meaning client."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.harness.cli import run_on_cluster
from tests.harness.kube import KubeCluster

pytestmark = pytest.mark.kube

MINIMAL = ("--profile", "minimal")  # the control plane only: no DaemonSet, no node parts


def _meshctl(cluster: KubeCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return run_on_cluster(cluster.kubeconfig, *args, timeout=120)


def _deployments(api: k8s.ApiClient, namespace: str) -> list[str]:
    items = k8s.AppsV1Api(api).list_namespaced_deployment(namespace).items
    return [d.metadata.name for d in items]


def test_server_dry_run_returns_what_the_server_would_persist_and_persists_nothing(
    kube_cluster, kube_api, kube_namespace
):
    done = _meshctl(
        kube_cluster, "install", *MINIMAL, "-n", kube_namespace, "--dry-run=server",
        "--force", "-o", "json",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    items = json.loads(done.stdout)["items"]
    deployment = next(i for i in items if i["kind"] == "Deployment")
    # The API server's part: defaults the manifest does not write, a uid and no managedFields.
    assert deployment["spec"]["revisionHistoryLimit"] == 10
    assert deployment["spec"]["template"]["spec"]["schedulerName"] == "default-scheduler"
    assert deployment["metadata"]["uid"]
    assert "managedFields" not in deployment["metadata"]
    webhook = next(i for i in items if i["kind"] == "MutatingWebhookConfiguration")
    assert webhook["webhooks"][0]["timeoutSeconds"]
    # Nothing was kept.
    assert _deployments(kube_api, kube_namespace) == []
    with pytest.raises(ApiException) as absent:
        k8s.AdmissionregistrationV1Api(kube_api).read_mutating_webhook_configuration(
            webhook["metadata"]["name"]
        )
    assert absent.value.status == 404


def test_server_dry_run_names_what_the_server_cannot_check_yet(kube_cluster, kube_api):
    fresh = f"meshctl-dry-{os.getpid()}"
    done = _meshctl(
        kube_cluster, "install", *MINIMAL, "-n", fresh, "--dry-run", "server", "--force",
        "-o", "name",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"namespace {fresh} is created with it" in done.stderr
    assert f"namespace/{fresh}" in done.stdout.splitlines()
    with pytest.raises(ApiException) as absent:
        k8s.CoreV1Api(kube_api).read_namespace(fresh)
    assert absent.value.status == 404


def test_client_dry_run_and_a_bare_dry_run_print_the_manifest_without_a_cluster(tmp_path):
    dead = tmp_path / "kubeconfig"
    dead.write_text("{}")  # never read: a client dry run makes no request
    outputs = []
    for spelling in (("--dry-run",), ("--dry-run=client",), ("--dry-run", "client")):
        done = subprocess.run(
            [sys.executable, "-m", "meshctl", "--kubeconfig", str(dead), "install", *MINIMAL,
             *spelling, "-o", "name"],
            capture_output=True, text=True, timeout=120, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        outputs.append(done.stdout)
    assert outputs[0] == outputs[1] == outputs[2]
    assert "deployment.apps/meshctl-controlplane" in outputs[0].splitlines()


@pytest.mark.parametrize(("mode", "words"), [("server", "server dry run"), ("client", "dry run")])
def test_uninstall_dry_run_lists_what_it_would_delete_and_deletes_nothing(
    kube_cluster, kube_api, kube_namespace, mode, words
):
    # What an install leaves, by its labels (no full install: nothing runs pods here).
    labels = {
        "app.kubernetes.io/managed-by": "meshctl",
        "install.meshctl.io/component": "controlplane",
        "istio.io/rev": "default",
    }
    core = k8s.CoreV1Api(kube_api)
    account = k8s.V1ServiceAccount(
        metadata=k8s.V1ObjectMeta(name="meshctl-controlplane", labels=labels)
    )
    core.create_namespaced_service_account(kube_namespace, account)
    done = _meshctl(kube_cluster, "uninstall", "-n", kube_namespace, f"--dry-run={mode}")
    assert done.returncode == 0, done.stderr
    assert f"serviceaccount/meshctl-controlplane -n {kube_namespace} deleted ({words})" in (
        done.stdout.splitlines()
    )
    assert core.read_namespaced_service_account("meshctl-controlplane", kube_namespace)


def test_an_object_for_a_namespace_nobody_creates_stops_the_install_before_anything_is_applied(
    kube_cluster, kube_api
):
    """The istiod alias goes into the namespace Istio's charts use; install creates only its
    own namespace, so a missing one is named, with the command that creates it."""
    fresh, elsewhere = f"meshctl-ns-{os.getpid()}", f"istio-{os.getpid()}"
    done = _meshctl(
        kube_cluster, "install", *MINIMAL, "-n", fresh, "--dry-run=server", "--set",
        f"components.controlplane.istiodServiceNamespace={elsewhere}",
    )  # fmt: skip
    assert done.returncode == 1, done.stderr
    assert (
        f"namespace {elsewhere}, which does not exist (install creates only its own" in done.stderr
    )
    assert f"Hint: create it first: kubectl create namespace {elsewhere}" in done.stderr
    with pytest.raises(ApiException) as absent:
        k8s.CoreV1Api(kube_api).read_namespace(fresh)
    assert absent.value.status == 404
