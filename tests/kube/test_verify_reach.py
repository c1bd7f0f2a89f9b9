"""``meshctl verify`` against a real kube-apiserver with nothing installed: the cluster is
reached (its check passes with the server named), then the install record is missing (exit 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.kube


def test_a_reachable_cluster_passes_the_reach_check_and_the_run_goes_on(kube_cluster):
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "MESHCTL_CONFIG")}
    done = subprocess.run(
        [sys.executable, "-m", "meshctl", "--kubeconfig", str(kube_cluster.kubeconfig),
         "verify", "-n", "meshctl-absent", "-o", "json"],
        capture_output=True, text=True, timeout=120, check=False, env=env,
    )  # fmt: skip
    assert done.returncode == 3, done.stderr
    checks = {
        c["description"]: c
        for category in json.loads(done.stdout)["categories"]
        for c in category["checks"]
    }
    assert checks["can reach the cluster"]["result"] == "success"
    assert str(kube_cluster.kubeconfig) in checks["can reach the cluster"]["message"]
    assert checks["meshctl is installed"]["result"] == "error"
