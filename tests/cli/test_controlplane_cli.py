"""``meshctl controlplane``: help, settings refused with one line, ports in use, manifests."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from tests.harness.cli import run_meshctl
from tests.harness.golden import assert_golden

GOLDENS = Path(__file__).resolve().parents[1] / "testdata" / "controlplane"

# A kubeconfig whose server nothing serves: enough for start-up to reach the port binding.
KUBECONFIG = {
    "apiVersion": "v1",
    "kind": "Config",
    "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:1"}}],
    "users": [{"name": "u", "user": {"token": "x"}}],
    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
    "current-context": "c",
}
CLEAN_ENV = {"MESHCTL_CONFIG": "", "KUBECONFIG": "", "POD_NAMESPACE": "", "REVISION": ""}


@pytest.mark.parametrize("args", [[], ["run"], ["manifest"]])
def test_help_of_every_command_loads(args: list[str]) -> None:
    result = run_meshctl("controlplane", *args, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage:" in result.stdout


@pytest.mark.parametrize(
    ("args", "env", "error"),
    [
        (["--grpc-address", "nonsense"], {}, "'--grpc-address': 'nonsense' is not HOST:PORT"),
        (["--grpc-address", "example.org:15012"], {}, "is not an IP address"),
        (["--grpc-address", "127.0.0.1:70000"], {}, "port 70000 is out of range (0-65535"),
        ([], {"MESHCTL_GRPC_ADDRESS": ":70000"}, "env MESHCTL_GRPC_ADDRESS: invalid value"),
        (["--trust-domain", "Bad_Domain"], {}, "trust domain"),
        (["--namespace", "Not-A-Label"], {}, "is not a DNS-1123 label"),
        (["--trusted-node-accounts", "ztunnel"], {}, "is not NAMESPACE/SERVICE_ACCOUNT"),
        (["--max-workload-cert-ttl", "1h"], {}, "exceeds the maximum 1h"),
        (["--max-workload-cert-ttl", "soon"], {}, "'soon' is not a duration"),
        (["--self-signed-ca-key", "dsa"], {}, "'dsa' is not one of ec-p256, rsa-2048"),
        (["--serving-names", "a b"], {}, "neither a DNS name nor an IP"),
        ([], {"MESHCTL_LEASE_DURATION": "1s"}, "lease duration > renew deadline"),
    ],
)
def test_unusable_settings_are_one_line_errors_with_exit_2(
    tmp_path: Path, args: list[str], env: dict[str, str], error: str
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(KUBECONFIG))
    result = run_meshctl(
        "--kubeconfig", str(kubeconfig), "controlplane", "run", *args, env={**CLEAN_ENV, **env}
    )
    assert result.returncode == 2, result.stderr
    assert error in result.stderr
    assert result.stderr.startswith("Error: ")
    assert "Traceback" not in result.stderr


def test_a_port_in_use_is_named_and_exits_1(tmp_path: Path) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(KUBECONFIG))
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        result = run_meshctl(
            *("--kubeconfig", str(kubeconfig), "controlplane", "run"),
            *("--readiness-address", f"127.0.0.1:{port}"),
            *("--monitoring-address", "127.0.0.1:0"),
            env=CLEAN_ENV,
            timeout=30,
        )
    assert result.returncode == 1
    assert f"Error: cannot listen on 127.0.0.1:{port}: the port is already in use" in result.stderr
    assert "Traceback" not in result.stderr


def test_an_address_not_of_this_host_is_told_about_the_address_not_the_port(
    tmp_path: Path,
) -> None:
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(json.dumps(KUBECONFIG))
    result = run_meshctl(
        *("--kubeconfig", str(kubeconfig), "controlplane", "run"),
        *("--readiness-address", "192.0.2.1:0"),  # TEST-NET-1: never an address of this host
        env=CLEAN_ENV,
        timeout=30,
    )
    assert result.returncode == 2, result.stderr  # the address given is wrong: usage
    assert "Error: cannot listen on 192.0.2.1:0: 192.0.2.1 is not an address of this host" in (
        result.stderr
    )
    assert "Hint: give one of this host's addresses" in result.stderr
    assert "free port" not in result.stderr


@pytest.mark.parametrize(
    ("name", "args"),
    [
        ("default.yaml", []),
        ("revision.yaml", ["--revision", "canary", "--namespace", "mesh", "--replicas", "3"]),
    ],
)
def test_manifest_golden(name: str, args: list[str]) -> None:
    result = run_meshctl(
        "controlplane", "manifest", "--image", "registry.example/meshctl:1", *args, env=CLEAN_ENV
    )
    assert result.returncode == 0, result.stderr
    assert_golden(GOLDENS / name, result.stdout)
    kinds = [doc["kind"] for doc in yaml.safe_load_all(result.stdout)]
    assert kinds == [
        "Namespace",  # first, as 'cni manifest' does: the output applies on a fresh cluster
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "Role",
        "RoleBinding",
        "Service",
        "Deployment",
        "PodDisruptionBudget",
        "MutatingWebhookConfiguration",
    ]


def test_manifest_json_is_a_list_and_table_and_name_list_the_objects() -> None:
    result = run_meshctl("controlplane", "manifest", "-o", "json", env=CLEAN_ENV)
    assert result.returncode == 0
    listed = json.loads(result.stdout)
    assert listed["kind"] == "List"
    names = run_meshctl("controlplane", "manifest", "-o", "name", env=CLEAN_ENV)
    assert names.returncode == 0, names.stderr
    expected = []
    for item in listed["items"]:
        group = item["apiVersion"].rpartition("/")[0]
        kind = item["kind"].lower() + (f".{group}" if group else "")
        expected.append(f"{kind}/{item['metadata']['name']}")
    assert names.stdout.splitlines() == expected
    table = run_meshctl("controlplane", "manifest", "-o", "table", env=CLEAN_ENV)
    assert table.returncode == 0, table.stderr
    assert table.stdout.splitlines()[0].split()[:2] == ["KIND", "NAME"]
    assert len(table.stdout.splitlines()) == len(expected) + 1
