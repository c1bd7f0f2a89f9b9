"""``meshctl bug-report`` against a real kube-apiserver (no kubelet): the mesh's objects, events,
install record and Secrets (by name and type only), with every secret redacted from the archive;
pods that are not ready and a proxy that does not answer are findings, not failures."""

from __future__ import annotations

import base64
import datetime
import json
import os
import re
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest
import yaml
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes import client as k8s

from tests.harness.kube import create_namespace, delete_namespace, request_token

pytestmark = pytest.mark.kube

KEY_PATTERNS = (re.compile(rb"-----BEGIN .*PRIVATE KEY-----"), re.compile(rb"eyJ[\w-]+\.eyJ"))


def _meshctl(kubeconfig: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "MESHCTL_CONFIG")}
    return subprocess.run(
        [sys.executable, "-m", "meshctl", "--kubeconfig", str(kubeconfig), *args],
        capture_output=True, text=True, timeout=180, check=False, env=env, cwd=cwd,
    )  # fmt: skip


def _members(path: Path) -> dict[str, bytes]:
    with tarfile.open(path, "r:gz") as tar:
        out = {}
        for info in tar.getmembers():
            handle = tar.extractfile(info)
            assert handle is not None, info.name
            out[info.name.split("/", 1)[1]] = handle.read()
        return out


@pytest.fixture
def mesh(kube_cluster, kube_api, kube_namespace):
    """A mesh namespace as install leaves it (record, CA Secret, a control plane pod that never
    runs here) and a labelled workload namespace with an injected pod."""
    system = f"{kube_namespace}-sys"[:60]
    shop = f"{kube_namespace}-shop"[:60]
    create_namespace(kube_api, system)
    create_namespace(kube_api, shop, labels={"istio-injection": "enabled"})
    core = k8s.CoreV1Api(kube_api)
    key = ec.generate_private_key(ec.SECP256R1())
    key_pem = key.private_bytes(
        ser.Encoding.PEM, ser.PrivateFormat.PKCS8, ser.NoEncryption()
    ).decode()
    token = request_token(kube_cluster, shop, "default", "https://kubernetes.default.svc")
    secret_values = {"ca-key.pem": key_pem, "token": token, "password": "pa55-w0rd-value"}
    core.create_namespaced_secret(
        system,
        {
            "metadata": {"name": "meshctl-ca-secret"},
            "type": "istio.io/ca-root",
            "data": {k: base64.b64encode(v.encode()).decode() for k, v in secret_values.items()},
        },
    )
    core.create_namespaced_config_map(
        system,
        {
            "metadata": {
                "name": "meshctl-install",
                "labels": {"install.meshctl.io/component": "install", "istio.io/rev": "default"},
            },
            "data": {"profile": "default", "revision": "default", "components": "controlplane"},
        },
    )
    # Someone pasted key material into a ConfigMap: the report must not carry it on.
    core.create_namespaced_config_map(
        system,
        {"metadata": {"name": "careless"}, "data": {"notes": f"key:\n{key_pem}\ntoken {token}"}},
    )
    core.create_namespaced_pod(
        system,
        {
            "metadata": {
                "name": "meshctl-controlplane-0",
                "labels": {"app.kubernetes.io/name": "meshctl-controlplane"},
            },
            "spec": {
                "containers": [
                    {
                        "name": "discovery",
                        "image": "x",
                        "env": [{"name": "BOOTSTRAP_TOKEN", "value": "env-token-value"}],
                    }
                ]
            },
        },
    )
    pod = {
        "metadata": {"name": "web-1"},
        "spec": {
            "nodeName": "nowhere",
            "containers": [{"name": "app", "image": "x"}, {"name": "istio-proxy", "image": "x"}],
        },
    }
    core.create_namespaced_pod(shop, pod)
    # As a kubelet would say: running (its admin port is not reachable: there is no kubelet).
    now = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    core.patch_namespaced_pod_status(
        "web-1",
        shop,
        {
            "status": {
                "phase": "Running",
                "conditions": [{"type": "Ready", "status": "True", "lastTransitionTime": now}],
            }
        },
    )
    core.create_namespaced_event(
        shop,
        {
            "metadata": {"name": "web-1.warning"},
            "type": "Warning",
            "reason": "BackOff",
            "message": "Back-off restarting failed container istio-proxy",
            "involvedObject": {"kind": "Pod", "name": "web-1", "namespace": shop},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 3,
        },
    )
    try:
        yield {"system": system, "shop": shop, "secrets": secret_values, "key": key_pem}
    finally:
        delete_namespace(kube_api, shop)
        delete_namespace(kube_api, system)


def test_the_report_holds_the_mesh_and_no_secret(kube_cluster, mesh, tmp_path):
    target = tmp_path / "report.tar.gz"
    done = _meshctl(
        kube_cluster.kubeconfig,
        "bug-report", "--mesh-namespace", mesh["system"], "-n", mesh["shop"],
        "-O", str(target), "-o", "json", "--proxy-timeout", "5s",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    summary = json.loads(done.stdout)
    assert summary["archive"] == str(target)
    assert summary["archiveBytes"] == target.stat().st_size
    members = _members(target)
    with tarfile.open(target, "r:gz") as tar:
        assert tar.getnames()[0] == "report/SUMMARY.md"
    system, shop = mesh["system"], mesh["shop"]
    for name in (
        "meshctl/version.json",
        "cluster/version.json",
        "cluster/nodes.yaml",
        "install/meshctl-install.yaml",
        f"objects/{system}/Pod.yaml",
        f"objects/{system}/ConfigMap.yaml",
        f"objects/{system}/Secret.yaml",
        f"objects/{shop}/Pod.yaml",
        f"objects/{shop}/Service.yaml",
        f"events/{shop}.yaml",
        "objects/_cluster/MutatingWebhookConfiguration.yaml",
    ):
        assert name in members, sorted(members)
    # Secrets: by name and type, no data at all.
    secrets = members[f"objects/{system}/Secret.yaml"].decode()
    assert "name: meshctl-ca-secret" in secrets
    assert "type: istio.io/ca-root" in secrets
    assert not re.search(r"(?m)^\s*(data|stringData):", secrets), secrets
    assert b"components: controlplane" in members["install/meshctl-install.yaml"]
    # Findings: the pod that never ran, the proxy that did not answer, the Warning event.
    assert {p["pod"] for p in summary["podsNotReady"]} == {f"{system}/meshctl-controlplane-0"}
    assert [p["pod"] for p in summary["proxiesNotAnswering"]] == [f"{shop}/web-1"]
    assert summary["warningEvents"]["count"] == 1
    assert "BackOff" in summary["warningEvents"]["examples"][0]
    assert any("log of" in line for line in summary["notCollected"])  # no kubelet to ask
    text = members["SUMMARY.md"].decode()
    assert f"{shop}/web-1 (sidecar)" in text
    # No key material, token or secret value anywhere in the archive.
    body = "".join(mesh["key"].strip().splitlines()[1:-1])
    forbidden = [
        body[:40].encode(),
        *(v.encode() for v in mesh["secrets"].values()),
        *(base64.b64encode(v.encode()) for v in mesh["secrets"].values()),
        b"env-token-value",
    ]
    for name, data in members.items():
        for pattern in KEY_PATTERNS:
            assert not pattern.search(data), f"{name}: {pattern.pattern!r}"
        for value in forbidden:
            assert value not in data, f"{name} holds {value[:12]!r}..."


def test_a_namespace_that_does_not_exist_is_one_error_and_no_archive(kube_cluster, tmp_path):
    done = _meshctl(
        kube_cluster.kubeconfig, "bug-report", "-n", "no-such-namespace-x", cwd=tmp_path
    )
    assert done.returncode == 1, done.stderr
    assert done.stderr.startswith("Error: namespace no-such-namespace-x does not exist")
    assert "Traceback" not in done.stderr
    assert list(tmp_path.iterdir()) == []


def test_without_o_file_the_archive_lands_here_with_a_timestamp(kube_cluster, mesh, tmp_path):
    done = _meshctl(
        kube_cluster.kubeconfig,
        "bug-report", "--mesh-namespace", mesh["system"], "-n", mesh["shop"], "-o", "name",
        "--proxy-timeout", "2s",
        cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    (made,) = tmp_path.iterdir()
    assert re.fullmatch(r"meshctl-bug-report-\d{8}-\d{6}\.tar\.gz", made.name)
    assert done.stdout.strip() == made.name


def test_table_prints_the_summary_with_the_archive_and_yaml_the_findings(
    kube_cluster, mesh, tmp_path
):
    common = ["bug-report", "--mesh-namespace", mesh["system"], "-n", mesh["shop"]]
    common += ["--proxy-timeout", "2s"]
    table = _meshctl(
        kube_cluster.kubeconfig, *common, "-O", str(tmp_path / "a.tar.gz"), cwd=tmp_path
    )
    assert table.returncode == 0, table.stderr
    assert table.stdout.startswith("# meshctl bug report\n")
    assert f"Archive: {tmp_path / 'a.tar.gz'}" in table.stdout
    assert "### Warning events: 1" in table.stdout
    assert table.stdout == _members(tmp_path / "a.tar.gz")["SUMMARY.md"].decode()
    data = _meshctl(
        kube_cluster.kubeconfig, *common, "-O", str(tmp_path / "b.tar.gz"), "-o", "yaml",
        cwd=tmp_path,
    )  # fmt: skip
    assert data.returncode == 0, data.stderr
    found = yaml.safe_load(data.stdout)
    assert found["archive"] == str(tmp_path / "b.tar.gz")
    assert found["warningEvents"]["count"] == 1
