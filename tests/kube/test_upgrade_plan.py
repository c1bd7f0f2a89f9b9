"""``meshctl upgrade --dry-run`` against a real kube-apiserver: the plan of an install that is up
to date is all unchanged (the server's defaults are not changes), a changed value is named field
by field, and a revision that is not installed is one error line."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.harness.cli import run_on_cluster
from tests.harness.kube import KubeCluster

pytestmark = pytest.mark.kube


def _meshctl(cluster: KubeCluster, *args: str) -> subprocess.CompletedProcess[str]:
    return run_on_cluster(cluster.kubeconfig, *args, timeout=180)


def test_upgrade_plans_nothing_for_an_up_to_date_install_and_names_a_changed_value(
    kube_cluster, kube_namespace
):
    revision = f"up-{kube_namespace.rsplit('-', 1)[-1]}"
    where = ("-n", kube_namespace, "--revision", revision)
    # Everything applied; no kubelet here, so the wait for readiness times out (exit 1).
    install = _meshctl(
        kube_cluster, "install", "-y", "--profile", "minimal", *where,
        "--set", "image=reg.example/meshctl:1", "--readiness-timeout", "1s", "--force",
    )  # fmt: skip
    assert "objects)" in install.stderr, install.stderr
    plan = _meshctl(kube_cluster, "upgrade", *where, "--dry-run", "-o", "json")
    assert plan.returncode == 0, plan.stderr
    rows = json.loads(plan.stdout)
    assert rows, plan.stdout
    assert {r["action"] for r in rows} == {"unchanged"}, plan.stdout
    assert "0 to create, 0 to change" in plan.stderr
    changed = _meshctl(
        kube_cluster, "upgrade", *where, "--dry-run", "--set", "image=reg.example/meshctl:2",
    )  # fmt: skip
    assert changed.returncode == 0, changed.stderr
    assert "change" in changed.stdout
    assert "containers[discovery].image is 'reg.example/meshctl:1'" in changed.stdout
    assert "reg.example/meshctl:2" in changed.stdout
    # --dry-run changed nothing: the plan is still all unchanged.
    again = _meshctl(kube_cluster, "upgrade", *where, "--dry-run=server", "-o", "json")
    assert again.returncode == 0, again.stderr
    assert {r["action"] for r in json.loads(again.stdout)} == {"unchanged"}


def test_upgrade_of_a_revision_that_is_not_installed_is_one_error(kube_cluster, kube_namespace):
    done = _meshctl(kube_cluster, "upgrade", "-n", kube_namespace, "--revision", "nosuch")
    assert done.returncode == 1
    assert done.stderr.startswith("Error: revision 'nosuch' is not installed"), done.stderr
    assert "Hint: install it" in done.stderr
    assert "Traceback" not in done.stderr
