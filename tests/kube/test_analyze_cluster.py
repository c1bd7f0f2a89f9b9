"""``meshctl analyze`` against a real kube-apiserver: the live mode reads what the checks need
(namespace labels, pods, AuthorizationPolicies through their CRD) in every namespace, and files
given with ``-f`` are layered over the live objects as if applied (a file's object replaces the
live one, a new one is added and named by file:line). There is no kubelet: pods stay Pending,
which is what a pod created before the webhook looks like to the API."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from tests.harness.controlplane import install_crds
from tests.harness.kube import KubeCluster

pytestmark = pytest.mark.kube


def analyze(cluster: KubeCluster, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    return analyze_with(cluster.kubeconfig, *args)


def about(findings: list[dict[str, Any]], namespace: str) -> set[tuple[str, str, str]]:
    """(code, kind, name) of the findings whose object lives in or is ``namespace``."""
    return {
        (f["code"], f["object"]["kind"], f["object"]["name"])
        for f in findings
        if namespace in (f["object"]["namespace"], f["object"]["name"])
    }


def test_live_objects_are_analyzed_and_files_layer_over_them(
    kube_cluster: KubeCluster, kube_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path
):
    install_crds(kube_cluster)
    ns = kube_namespace
    core = k8s.CoreV1Api(kube_api)
    core.patch_namespace(ns, {"metadata": {"labels": {"istio-injection": "enabled"}}})
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "early", "labels": {"app": "web"}},
            "spec": {"containers": [{"name": "web", "image": "web:1"}]},
        },
    )
    k8s.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        "security.istio.io", "v1", ns, "authorizationpolicies",
        {
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": "typo"},
            "spec": {"selector": {"matchLabels": {"app": "wbe"}}},
        },
    )  # fmt: skip

    code, findings, printed = analyze(kube_cluster, "-n", ns)
    assert code == 3, printed
    assert about(findings, ns) == {
        ("MSH0201", "Namespace", ns),
        ("MSH0204", "Pod", "early"),
        ("MSH0101", "AuthorizationPolicy", "typo"),
    }, printed
    assert all("source" not in f["object"] for f in findings), printed

    # The files as if applied: the namespace without its label (so nothing asks for injection
    # any more), a policy fixed in place, and a new policy with its own typo. Only Warnings and
    # Infos remain: exit 0.
    layer = tmp_path / "fix.yaml"
    layer.write_text(
        f"apiVersion: v1\nkind: Namespace\nmetadata: {{name: {ns}}}\n"
        "---\n"
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n"
        "metadata: {name: typo}\nspec: {selector: {matchLabels: {app: web}}}\n"
        "---\n"
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n"
        "metadata: {name: new}\nspec: {selector: {matchLabels: {app: api}}}\n"
    )
    code, findings, printed = analyze(kube_cluster, "-n", ns, "-f", str(layer))
    assert code == 0, printed
    # ... and the live pod now sits in a namespace that says nothing about the mesh (Info).
    assert about(findings, ns) == {
        ("MSH0101", "AuthorizationPolicy", "new"),
        ("MSH0206", "Namespace", ns),
    }, printed
    (new,) = [f for f in findings if f["object"]["name"] == "new"]
    assert (new["object"]["source"], new["object"]["line"]) == (str(layer), 10)
    assert new["object"]["namespace"] == ns  # -n is where an object without one goes

    # The same files alone know nothing of the live pod: the policy fixed in place selects nothing.
    code, findings, printed = analyze(kube_cluster, "--use-kube=false", "-n", ns, "-f", str(layer))
    assert code == 0, printed
    assert about(findings, ns) == {
        ("MSH0101", "AuthorizationPolicy", "typo"),
        ("MSH0101", "AuthorizationPolicy", "new"),
    }, printed


def test_without_n_a_live_run_analyzes_the_kubeconfig_contexts_namespace(
    kube_cluster: KubeCluster, kube_api: k8s.ApiClient, kube_namespace: str, tmp_path: Path
):
    """kubectl's rule: a context's ``namespace`` is where a command without -n looks, and where
    a file's object without a namespace lands."""
    install_crds(kube_cluster)
    ns = kube_namespace
    k8s.CustomObjectsApi(kube_api).create_namespaced_custom_object(
        "security.istio.io", "v1", ns, "authorizationpolicies",
        {
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": "typo"},
            "spec": {"selector": {"matchLabels": {"app": "nothing-here"}}},
        },
    )  # fmt: skip
    config = yaml.safe_load(kube_cluster.kubeconfig.read_text())
    for entry in config["contexts"]:
        entry["context"]["namespace"] = ns
    scoped = tmp_path / "scoped.kubeconfig"
    scoped.write_text(yaml.safe_dump(config))
    layer = tmp_path / "policy.yaml"
    layer.write_text(
        "apiVersion: security.istio.io/v1\nkind: AuthorizationPolicy\n"
        "metadata: {name: from-file}\nspec: {selector: {matchLabels: {app: none}}}\n"
    )

    _code, findings, printed = analyze_with(scoped, "-f", str(layer))
    assert ("MSH0101", "AuthorizationPolicy", "typo") in about(findings, ns), printed
    (from_file,) = [f for f in findings if f["object"]["name"] == "from-file"]
    assert from_file["object"]["namespace"] == ns, printed
    # With the admin kubeconfig (no namespace in its context) the same run looks at default.
    _code, findings, printed = analyze(kube_cluster)
    assert not about(findings, ns), printed


def analyze_with(kubeconfig: Path, *args: str) -> tuple[int, list[dict[str, Any]], str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "MESHCTL_CONFIG")}
    done = subprocess.run(
        [sys.executable, "-m", "meshctl", "--kubeconfig", str(kubeconfig), "analyze",
         "-o", "json", *args],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert "Traceback" not in done.stderr, done.stderr
    findings = json.loads(done.stdout) if done.stdout else []
    return done.returncode, findings, done.stdout + done.stderr
