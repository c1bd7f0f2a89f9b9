"""``meshctl stat`` and ``top`` against a real kube-apiserver (no kubelet, no controllers): the
pods and Deployments are read from the API, MESHED counts the pods with a proxy, and a proxy the
API server cannot reach through ``pods/proxy`` is its row's reason, not a failure; ``-O`` holds
what stdout would. A NAME that does not exist is ``Error:`` and exit 1."""

from __future__ import annotations

import json
import subprocess

import pytest
from kubernetes import client as k8s

from tests.harness.cli import run_on_cluster

pytestmark = pytest.mark.kube

UNROUTABLE = "192.0.2.10"  # TEST-NET-1 (RFC 5737): nothing answers there


def _meshctl(cluster, *args: str) -> subprocess.CompletedProcess[str]:
    return run_on_cluster(cluster.kubeconfig, "--request-timeout", "2s", *args)


def _pod(api: k8s.ApiClient, namespace: str, name: str, *, sidecar: bool) -> None:
    core = k8s.CoreV1Api(api)
    init = [{"name": "istio-proxy", "image": "meshctl"}] if sidecar else []
    core.create_namespaced_pod(
        namespace,
        {
            "metadata": {"name": name, "labels": {"app": "web"}},
            "spec": {"initContainers": init, "containers": [{"name": "main", "image": "app"}]},
        },
    )
    status = {"status": {"phase": "Running", "podIP": UNROUTABLE, "podIPs": [{"ip": UNROUTABLE}]}}
    core.patch_namespaced_pod_status(name, namespace, status)


def test_rows_come_from_the_api_and_an_unreachable_proxy_is_a_reason(
    kube_cluster, kube_api, kube_namespace
):
    _pod(kube_api, kube_namespace, "web-1", sidecar=True)
    _pod(kube_api, kube_namespace, "plain", sidecar=False)
    k8s.AppsV1Api(kube_api).create_namespaced_deployment(
        kube_namespace,
        {
            "metadata": {"name": "web"},
            "spec": {
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    "metadata": {"labels": {"app": "web"}},
                    "spec": {"containers": [{"name": "main", "image": "app"}]},
                },
            },
        },
    )
    done = _meshctl(kube_cluster, "stat", "pod", "-n", kube_namespace, "-o", "json",
                    "--window", "1s")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert done.stderr.startswith("scraped 1 proxies; again in 1s\n"), done.stderr
    rows = {r["name"]: r for r in json.loads(done.stdout)}
    assert rows["web-1"]["meshed"] == "1/1"
    assert rows["web-1"]["reason"].startswith("pod web-1: "), rows["web-1"]
    assert rows["plain"]["meshed"] == "0/1"
    assert rows["plain"]["reason"] is None
    assert rows["plain"]["connections"] == 0

    deploys = _meshctl(kube_cluster, "stat", "deploy", "-n", kube_namespace, "-o", "json",
                       "--window", "1s")  # fmt: skip
    assert deploys.returncode == 0, deploys.stderr
    [web] = json.loads(deploys.stdout)
    assert (web["name"], web["meshed"]) == ("web", "0/0")  # no controller made its pods


def test_output_file_holds_what_stdout_would(kube_cluster, kube_api, kube_namespace, tmp_path):
    _pod(kube_api, kube_namespace, "web-1", sidecar=True)
    for command in (("stat", "pod", "--window", "1s"), ("top", "--once", "--interval", "1s")):
        shown = _meshctl(kube_cluster, *command, "-n", kube_namespace, "-o", "name")
        target = tmp_path / f"{command[0]}.txt"
        written = _meshctl(
            kube_cluster, *command, "-n", kube_namespace, "-o", "name", "-O", str(target)
        )
        assert (shown.returncode, written.returncode) == (0, 0), shown.stderr + written.stderr
        assert shown.stdout == f"{kube_namespace}/web-1\n"
        assert written.stdout == ""
        assert target.read_text() == shown.stdout


def test_a_name_that_does_not_exist_is_an_error_line_and_exit_1(kube_cluster, kube_namespace):
    done = _meshctl(kube_cluster, "stat", "deploy", "nope", "-n", kube_namespace)
    assert done.returncode == 1
    assert (
        done.stderr.splitlines()[0]
        == f"Error: deployment nope not found in namespace {kube_namespace}"
    )
    assert done.stderr.splitlines()[1].startswith("Hint: ")
