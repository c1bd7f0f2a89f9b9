"""``meshctl cni install`` as the DaemonSet runs it: readiness, repair, token rotation, SIGTERM."""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.harness.cli import run_meshctl
from tests.harness.cni import exec_plugin, fake_node, network_config
from tests.harness.kube import free_port
from tests.harness.wait import eventually


def readyz(port: int) -> tuple[int, str]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/readyz")
        response = conn.getresponse()
        return response.status, response.read().decode()
    except OSError:
        return 0, ""
    finally:
        conn.close()


@pytest.fixture
def node(tmp_path: Path) -> Path:
    return fake_node(tmp_path)


@contextlib.contextmanager
def running(node: Path) -> Iterator[tuple[subprocess.Popen[str], int]]:
    port = free_port()
    argv = [
        sys.executable, "-m", "meshctl", "--log-level", "info", "cni", "install",
        "--cni-bin-dir", str(node / "bin"), "--cni-conf-dir", str(node / "net.d"),
        "--run-dir", str(node / "run"), "--service-account-dir", str(node / "sa"),
        "--kube-server", "https://127.0.0.1:6443",
        "--readiness-address", f"127.0.0.1:{port}", "--poll-interval", "0.2",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True)
    try:
        eventually("ready", lambda: readyz(port)[0] == 200 or proc.poll() is not None, 30)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)


def ours(node: Path) -> bool:
    try:
        plugins = json.loads((node / "net.d" / "dbnet.conflist").read_text())["plugins"]
    except (OSError, ValueError):
        return False
    return plugins[-1]["type"] == "meshctl-cni"


def test_overwritten_config_gets_our_entry_back_and_sigterm_restores_it(node: Path):
    original = (node / "net.d" / "dbnet.conflist").read_bytes()
    with running(node) as (proc, port):
        assert ours(node)
        # Another agent (the primary CNI) rewrites its config without us.
        (node / "net.d" / "dbnet.conflist").write_bytes(original)
        took = eventually("entry repaired", lambda: ours(node), timeout=5)
        assert took < 3
        eventually("ready again", lambda: readyz(port)[0] == 200)
        # The binary removed behind our back comes back too.
        (node / "bin" / "meshctl-cni").unlink()
        eventually("binary repaired", (node / "bin" / "meshctl-cni").exists)
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        stderr = proc.stderr.read() if proc.stderr else ""
    assert (node / "net.d" / "dbnet.conflist").read_bytes() == original
    assert not {"meshctl-cni-kubeconfig", "conf-backup.json", "log.sock"} & {
        p.name for p in (node / "run").iterdir()
    }
    assert not (node / "bin" / "meshctl-cni").exists()
    assert "repaired" in stderr
    assert "token-1" not in stderr, "the token is never logged"


def test_rotated_token_refreshes_the_plugin_kubeconfig(node: Path):
    with running(node):
        kubeconfig = node / "run" / "meshctl-cni-kubeconfig"
        assert json.loads(kubeconfig.read_text())["users"][0]["user"]["token"] == "token-1"
        assert kubeconfig.stat().st_mode & 0o777 == 0o600
        (node / "sa" / "token").write_text("token-2\n")

        def rotated() -> bool:
            return json.loads(kubeconfig.read_text())["users"][0]["user"]["token"] == "token-2"

        eventually("kubeconfig refreshed", rotated)


def test_readiness_is_503_until_a_primary_cni_config_appears(node: Path):
    seed = (node / "net.d" / "dbnet.conflist").read_bytes()
    (node / "net.d" / "dbnet.conflist").unlink()
    port = free_port()
    argv = [
        sys.executable, "-m", "meshctl", "cni", "install",
        "--cni-bin-dir", str(node / "bin"), "--cni-conf-dir", str(node / "net.d"),
        "--run-dir", str(node / "run"), "--service-account-dir", str(node / "sa"),
        "--kube-server", "https://127.0.0.1:6443",
        "--readiness-address", f"127.0.0.1:{port}", "--poll-interval", "0.2",
    ]  # fmt: skip
    proc = subprocess.Popen(argv, stderr=subprocess.DEVNULL)
    try:
        eventually("readiness answers", lambda: readyz(port)[0] != 0, 30)
        status, reason = readyz(port)
        assert status == 503
        assert "no valid CNI network config" in reason
        (node / "net.d" / "dbnet.conflist").write_bytes(seed)  # the primary CNI starts
        eventually("ready once merged", lambda: readyz(port)[0] == 200)
        assert ours(node)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(20)
    assert (node / "net.d" / "dbnet.conflist").read_bytes() == seed


def test_uninstall_command_restores_what_a_killed_installer_left(node: Path):
    original = (node / "net.d" / "dbnet.conflist").read_bytes()
    with running(node) as (proc, _):
        proc.kill()  # SIGKILL: no cleanup ran
        proc.wait(10)
    assert ours(node)
    result = run_meshctl(
        "cni", "uninstall", "--cni-bin-dir", str(node / "bin"),
        "--cni-conf-dir", str(node / "net.d"), "--run-dir", str(node / "run"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert (node / "net.d" / "dbnet.conflist").read_bytes() == original
    assert not (node / "bin" / "meshctl-cni").exists()


def test_manifest_is_a_daemonset_with_host_mounts_and_node_critical_priority():
    result = run_meshctl("cni", "manifest", "-o", "json", "--image", "registry.example/m:1")
    assert result.returncode == 0, result.stderr
    items = json.loads(result.stdout)["items"]
    assert [i["kind"] for i in items] == [
        "Namespace",
        "ServiceAccount",
        "ClusterRole",
        "ClusterRoleBinding",
        "DaemonSet",
    ]
    assert items[0]["metadata"]["name"] == "meshctl-system"
    spec = items[4]["spec"]["template"]["spec"]
    assert spec["priorityClassName"] == "system-node-critical"
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    # The agent serves the plugin's requests: it enters the pods' netns where the runtime
    # pins them (HostToContainer: namespaces pinned after it started).
    assert paths == {"/opt/cni/bin", "/etc/cni/net.d", "/var/run/meshctl-cni", "/var/run/netns"}
    container = spec["containers"][0]
    # A read-only root, but the one-file binary needs a writable /tmp to unpack itself.
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert {"name": "tmp", "mountPath": "/tmp"} in container["volumeMounts"]
    assert {"name": "tmp", "emptyDir": {}} in spec["volumes"]
    assert container["image"] == "registry.example/m:1"
    assert container["args"][-2:] == ["cni", "install"]
    netns = next(m for m in container["volumeMounts"] if m["mountPath"] == "/var/run/netns")
    assert netns["mountPropagation"] == "HostToContainer"
    # setns into a pod (SYS_ADMIN), its rules (NET_ADMIN), libiptc's raw socket (NET_RAW).
    assert container["securityContext"]["capabilities"] == {
        "drop": ["ALL"],
        "add": ["NET_ADMIN", "NET_RAW", "SYS_ADMIN"],
    }
    assert "hostNetwork" not in spec or spec["hostNetwork"] is False
    assert items[2]["rules"] == [{"apiGroups": [""], "resources": ["pods"], "verbs": ["get"]}]


def test_ambient_manifest_adds_the_node_agents_mounts_capabilities_and_rbac():
    result = run_meshctl("cni", "manifest", "--ambient", "-o", "json")
    assert result.returncode == 0, result.stderr
    items = {i["kind"]: i for i in json.loads(result.stdout)["items"]}
    spec = items["DaemonSet"]["spec"]["template"]["spec"]
    assert spec["hostNetwork"] is True
    paths = {v["hostPath"]["path"] for v in spec["volumes"] if "hostPath" in v}
    assert {"/var/run/netns", "/var/run/ztunnel", "/run/xtables.lock"} <= paths
    assert spec["terminationGracePeriodSeconds"] == 30  # the release on uninstall needs time
    container = spec["containers"][0]
    mounts = {m["mountPath"] for m in container["volumeMounts"]}
    assert "/run/xtables.lock" in mounts  # the node's lock, under a read-only root
    env = {e["name"]: e for e in container["env"]}
    assert env["AMBIENT_ENABLED"]["value"] == "true"
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    assert env["POD_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.name"
    assert env["POD_NAMESPACE"]["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.namespace"
    assert env["MESHCTL_CNI_NETNS_DIR"]["value"] == "/var/run/netns"
    assert set(container["securityContext"]["capabilities"]["add"]) == {
        "NET_ADMIN",
        "NET_RAW",
        "SYS_ADMIN",
    }
    rules = {r["resources"][0]: set(r["verbs"]) for r in items["ClusterRole"]["rules"]}
    assert rules == {
        "pods": {"get", "list", "watch", "patch"},
        "namespaces": {"get", "list", "watch"},
        "events": {"create", "patch"},
        "daemonsets": {"get"},  # its own, on exit: uninstall or upgrade?
    }


def test_ambient_agent_without_a_node_name_is_a_usage_error(tmp_path: Path):
    result = run_meshctl(
        "cni", "install", "--ambient", "--kube-server", "https://127.0.0.1:1",
        "--cni-bin-dir", str(tmp_path / "bin"), "--cni-conf-dir", str(tmp_path / "net.d"),
        "--run-dir", str(tmp_path / "run"),
        env={"NODE_NAME": ""},
    )  # fmt: skip
    assert result.returncode == 2
    assert "Error: ambient mode needs this node's name" in result.stderr
    assert "--node-name" in result.stderr


def test_the_plugins_log_reaches_the_node_agents_log(node: Path, tmp_path: Path):
    # The runtime execs the plugin the installer put in the bin dir; the plugin logs to its file
    # and to the agent's socket in the run dir, and the agent (the DaemonSet's container, whose
    # stderr is what `kubectl logs` shows) writes the record into its own log.
    sandbox = tmp_path / "netns"
    sandbox.touch()  # only its existence is checked for a pod in an excluded namespace
    conf = network_config(run_dir=str(node / "run"), log_level="info")
    with running(node) as (proc, _):
        run = exec_plugin(
            node / "bin" / "meshctl-cni",
            "ADD",
            conf,
            netns=str(sandbox),
            pod=("kube-system", "dns"),
        )
        assert run.returncode == 0, run.stderr
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0
        stderr = proc.stderr.read() if proc.stderr else ""
    line = "kube-system/dns: namespace excluded"
    assert line in (node / "run" / "meshctl-cni.log").read_text()
    assert line in stderr


def test_ambient_agent_without_an_api_server_reads_its_pods_from_the_local_inventory(
    node: Path, tmp_path: Path
):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text(
        "apiVersion: v1\nkind: List\nitems:\n"
        "- {kind: Namespace, metadata: {name: shop, labels: {istio.io/dataplane-mode: ambient}}}\n"
        "- {kind: Pod, metadata: {name: cart, namespace: shop}, spec: {nodeName: laptop}}\n"
        "- {kind: Pod, metadata: {name: far, namespace: shop}, spec: {nodeName: other}}\n"
    )
    port = free_port()
    argv = [
        sys.executable, "-m", "meshctl", "cni", "install", "--ambient",
        "--local-inventory", str(inventory), "--node-name", "laptop",
        "--cni-bin-dir", str(node / "bin"), "--cni-conf-dir", str(node / "net.d"),
        "--run-dir", str(node / "run"), "--ztunnel-socket", str(tmp_path / "zds.sock"),
        "--readiness-address", f"127.0.0.1:{port}", "--poll-interval", "0.2",
    ]  # fmt: skip
    env = {k: v for k, v in os.environ.items() if k != "KUBERNETES_SERVICE_HOST"}
    proc = subprocess.Popen(argv, stderr=subprocess.PIPE, text=True, env=env)
    try:
        eventually("ready", lambda: readyz(port)[0] == 200 or proc.poll() is not None, 30)
        assert proc.poll() is None, proc.stderr.read() if proc.stderr else ""
        entry = json.loads((node / "net.d" / "dbnet.conflist").read_text())["plugins"][-1]
        assert entry["local_inventory"] == str(inventory)
        assert "kubeconfig" not in entry
        assert not (node / "run" / "meshctl-cni-kubeconfig").exists()
        pods = status(port)["pods"]
        assert [(p["namespace"], p["name"], p["captured"]) for p in pods] == [
            ("shop", "cart", False)  # this node's only; no sandbox yet
        ]
        # A DEL, through the installed plugin, for a pod the agent knows only from its inventory
        # (no ADD reported it): not released by the ambient agent, so the request's own
        # clean-up runs (its netns is gone already: nothing to remove).
        conf = {**entry, "cniVersion": "1.0.0", "name": "dbnet"}
        deleted = exec_plugin(
            node / "bin" / "meshctl-cni", "DEL", conf, netns="/x", pod=("shop", "cart")
        )
        assert (deleted.returncode, deleted.stdout) == (0, ""), deleted.stderr
        log = (node / "run" / "meshctl-cni.log").read_text()
        assert "DEL shop/cart: netns already gone, nothing to remove" in log
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(20) == 0


def test_an_unusable_local_inventory_stops_the_agent_with_its_path(node: Path, tmp_path: Path):
    inventory = tmp_path / "inventory.yaml"
    inventory.write_text("kind: Deployment\nmetadata: {name: x}\n")
    result = run_meshctl(
        "cni", "install", "--ambient", "--local-inventory", str(inventory), "--node-name", "n",
        "--cni-bin-dir", str(node / "bin"), "--cni-conf-dir", str(node / "net.d"),
        "--run-dir", str(node / "run"),
    )  # fmt: skip
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith(
        f"Error: {inventory}: item 1: kind 'Deployment' is not a v1 Namespace or Pod"
    )
    assert "Traceback" not in result.stderr
    assert ours(node) is False  # nothing installed


def status(port: int) -> dict[str, Any]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/status")
        data: dict[str, Any] = json.loads(conn.getresponse().read())
        return data
    finally:
        conn.close()


def test_debug_conflist_serves_the_nodes_cni_config_as_the_agent_reads_it(node: Path):
    with running(node) as (_, port):
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
        try:
            conn.request("GET", "/debug/conflist")
            response = conn.getresponse()
            report = json.loads(response.read())
        finally:
            conn.close()
    assert response.status == 200
    assert report["confDir"] == str(node / "net.d")
    assert report["active"] == "dbnet.conflist"
    served = json.loads(report["files"]["dbnet.conflist"])
    assert served["plugins"][-1]["type"] == "meshctl-cni"
