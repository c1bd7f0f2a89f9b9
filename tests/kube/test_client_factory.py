"""The Kubernetes client factory against the real API server: kubeconfig, context, in-cluster."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from meshctl.errors import ConfigError, KubeError
from meshctl.kube.client import KubeSettings, connect
from meshctl.kube.version import server_version
from tests.harness.kube import SA_ISSUER, KubeCluster, request_token

pytestmark = pytest.mark.kube


def test_version_server_reports_the_api_server_version(kube_cluster: KubeCluster):
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            "from meshctl.entry import run; run()",
            "version",
            "-o",
            "json",
            "--server",
            "--kubeconfig",
            str(kube_cluster.kubeconfig),
        ],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, "KUBECONFIG": ""},
    )
    assert result.returncode == 0, result.stderr
    server = json.loads(result.stdout)["server"]
    assert server["gitVersion"].startswith("v1.")
    assert server["platform"] == "linux/amd64"


def test_context_selects_the_cluster(kube_cluster: KubeCluster, tmp_path: Path):
    config = yaml.safe_load(Path(kube_cluster.kubeconfig).read_text())
    good = config["contexts"][0]
    # A second context pointing at a closed loopback port: only --context picks the live one.
    config["clusters"].append({"name": "dead", "cluster": {"server": "https://127.0.0.1:9"}})
    config["contexts"].append({"name": "dead", "context": {**good["context"], "cluster": "dead"}})
    config["current-context"] = "dead"
    path = tmp_path / "kubeconfig"
    path.write_text(yaml.safe_dump(config))
    with pytest.raises(KubeError, match="unreachable"):
        server_version(connect(KubeSettings(kubeconfig=str(path), request_timeout=5)))
    live = connect(KubeSettings(kubeconfig=str(path), context=good["name"]))
    assert server_version(live)["gitVersion"].startswith("v1.")
    with pytest.raises(ConfigError, match="context"):
        connect(KubeSettings(kubeconfig=str(path), context="no-such-context"))


def test_in_cluster_config_uses_the_mounted_token(
    kube_cluster: KubeCluster, kube_namespace: str, tmp_path: Path, monkeypatch
):
    # The API server accepts its issuer as audience by default (--api-audiences unset).
    token = request_token(kube_cluster, kube_namespace, "default", audience=SA_ISSUER)
    mount = tmp_path / "serviceaccount"
    mount.mkdir()
    (mount / "token").write_text(token)
    (mount / "ca.crt").write_bytes(kube_cluster.ca_pem)
    monkeypatch.setattr(
        "kubernetes.config.incluster_config.SERVICE_TOKEN_FILENAME", str(mount / "token")
    )
    monkeypatch.setattr(
        "kubernetes.config.incluster_config.SERVICE_CERT_FILENAME", str(mount / "ca.crt")
    )
    env = {
        "KUBERNETES_SERVICE_HOST": "127.0.0.1",
        "KUBERNETES_SERVICE_PORT": str(kube_cluster.port),
    }
    monkeypatch.setenv("KUBERNETES_SERVICE_HOST", env["KUBERNETES_SERVICE_HOST"])
    monkeypatch.setenv("KUBERNETES_SERVICE_PORT", env["KUBERNETES_SERVICE_PORT"])
    kube = connect(KubeSettings(), env=env)
    assert kube.source == "in-cluster"
    assert server_version(kube)["gitVersion"].startswith("v1.")
