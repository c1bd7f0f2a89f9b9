"""The real chain: installer -> node config -> runtime runs bridge + host-local + meshctl-cni.

A CNI-mode-injected Pod is created through the API; ``meshctl cni install`` (a subprocess, with
a service-account token under the plugin's own RBAC from ``meshctl cni manifest``) installs the
plugin into a temp bin dir and merges it into the node's conflist in a temp conf dir; the kubelet
stand-in reads that conflist and runs the chain for the pod inside a node netns.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from meshctl.core.k8s.inject.interception import capture_args
from meshctl.core.k8s.inject.pipeline import inject_pod
from meshctl.core.k8s.inject.settings import InjectSettings
from tests.harness.cli import run_meshctl
from tests.harness.cni import mesh_rules
from tests.harness.kube import (
    SA_ISSUER,
    CniError,
    KubeCluster,
    Kubelet,
    create_namespace,
    delete_namespace,
    free_port,
    request_token,
)
from tests.kube.ambient_support import agent_rbac
from tests.netns.capture_support import listen, request, serving

pytestmark = [pytest.mark.kube, pytest.mark.netns]

SA_NAME = "meshctl-cni-node"


def plugin_rbac(api: k8s.ApiClient, namespace: str) -> contextlib.AbstractContextManager[None]:
    """The manifest's ClusterRole/Binding for the installer's SA (sidecar mode's)."""
    return agent_rbac(api, namespace, ambient=False)


@contextlib.contextmanager
def installer(
    cluster: KubeCluster, node: Path, sa_dir: Path, excluded: str
) -> Iterator[tuple[subprocess.Popen[bytes], int]]:
    port = free_port()
    argv = [
        sys.executable, "-m", "meshctl", "--log-level", "info", "cni", "install",
        "--cni-bin-dir", str(node / "bin"), "--cni-conf-dir", str(node / "net.d"),
        "--run-dir", str(node / "run"), "--service-account-dir", str(sa_dir),
        "--kube-server", cluster.server, "--exclude-namespaces", f"kube-system,{excluded}",
        "--readiness-address", f"127.0.0.1:{port}", "--poll-interval", "0.2",
    ]  # fmt: skip
    log = (node / "installer.log").open("wb")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        wait_ready(port, proc, node / "installer.log")
        yield proc, port
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(20)
        log.close()


def readyz(port: int) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
    try:
        conn.request("GET", "/readyz")
        return conn.getresponse().status
    except OSError:
        return 0
    finally:
        conn.close()


def wait_ready(port: int, proc: subprocess.Popen[bytes], log: Path, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while readyz(port) != 200:
        if proc.poll() is not None or time.monotonic() > deadline:
            pytest.fail(f"installer never became ready:\n{log.read_text()}")
        time.sleep(0.1)


def pod_manifest(name: str, *, inject: bool) -> dict[str, Any]:
    pod: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "annotations": {"traffic.sidecar.istio.io/excludeInboundPorts": "9090"},
        },
        "spec": {"containers": [{"name": "app", "image": "registry.invalid/app:1"}]},
    }
    if inject:
        pod = inject_pod(pod, InjectSettings(cni=True), workload_name=name).pod
        assert not any(c["name"] == "istio-init" for c in pod["spec"].get("initContainers", []))
    return pod


def test_cni_mode_pod_is_captured_through_the_real_chain(
    kube_cluster: KubeCluster, kube_api, kube_namespace: str, kubelet: Kubelet, tmp_path: Path
):
    core = k8s.CoreV1Api(kube_api)
    excluded = f"{kube_namespace}-x"
    create_namespace(kube_api, excluded)
    node = tmp_path / "node"
    (node / "net.d").mkdir(parents=True)
    conf_file = node / "net.d" / "10-meshctl-test.conflist"
    original = (json.dumps(kubelet.conflist(), indent=1) + "\n").encode()
    conf_file.write_bytes(original)
    sa_dir = tmp_path / "sa"
    sa_dir.mkdir()
    (sa_dir / "ca.crt").write_bytes(kube_cluster.ca_pem)
    try:
        with plugin_rbac(kube_api, kube_namespace):
            token = request_token(kube_cluster, kube_namespace, SA_NAME, SA_ISSUER)
            (sa_dir / "token").write_text(token)
            with installer(kube_cluster, node, sa_dir, excluded) as (proc, _):
                merged = json.loads(conf_file.read_bytes())
                assert [p["type"] for p in merged["plugins"]] == ["bridge", "meshctl-cni"]
                assert (node / "bin" / "meshctl-cni").stat().st_mode & 0o111
                run_chain(core, kube_api, kubelet, kube_namespace, excluded, merged, node)
                proc.send_signal(signal.SIGTERM)
                assert proc.wait(20) == 0
            assert conf_file.read_bytes() == original, "uninstall restores the node config"
            assert not (node / "bin" / "meshctl-cni").exists()
    finally:
        delete_namespace(kube_api, excluded)


def run_chain(core, api, kubelet: Kubelet, ns: str, excluded: str, conflist, node: Path) -> None:
    injected = pod_manifest("shop", inject=True)
    core.create_namespaced_pod(ns, injected)
    core.create_namespaced_pod(ns, pod_manifest("plain", inject=False))
    core.create_namespaced_pod(excluded, pod_manifest("system", inject=True))
    bin_dir = [node / "bin"]

    shop = kubelet.run_pod(ns, "shop", conflist=conflist, cni_path=bin_dir)
    plain = kubelet.run_pod(ns, "plain", conflist=conflist, cni_path=bin_dir)
    system = kubelet.run_pod(excluded, "system", conflist=conflist, cni_path=bin_dir)

    # The injected pod has exactly the rules its init container would have applied.
    assert any("MESH_OUTPUT" in line for line in mesh_rules(shop.netns.name))
    args = capture_args(injected["metadata"]["annotations"], proxy_uid=1337, proxy_gid=1337)
    check = run_meshctl("iptables", "check", "--netns", shop.netns.path, *args)
    assert check.returncode == 0, check.stdout + check.stderr
    assert mesh_rules(plain.netns.name) == []
    assert mesh_rules(system.netns.name) == []
    log = (node / "run" / "meshctl-cni.log").read_text()
    assert f"{ns}/plain: no capture: not injected" in log
    assert f"{excluded}/system: namespace excluded" in log

    # A client in the pod is redirected; the proxy stand-in sees the original destination.
    seen: list[tuple[str, int]] = []

    def proxy(conn, data: bytes) -> bytes:
        from meshctl.net.sockets import original_destination

        seen.append(original_destination(conn) or ("?", 0))
        return b"proxy:" + data

    stand_in = listen(shop.netns, "0.0.0.0", 15001, "proxy")  # noqa: S104 (in the pod netns)
    with serving(stand_in, proxy):
        reply = request(shop.netns, kubelet.gateway, 8080, b"hi\n")
    assert reply == b"proxy:hi\n"
    assert seen == [(kubelet.gateway, 8080)]

    # The pod's own istio-validation container, run as the kubelet would: its command and args
    # from the stored Pod, as its uid/gid, in the pod's netns. Passes while the rules are there.
    validation = validation_container(core, ns, "shop")
    passed = run_validation(shop.netns.name, validation, tmp=node)
    assert passed.returncode == 0, passed.stderr
    assert "was redirected to port 15006" in passed.stderr

    # CHECK passes while the rules are there; DEL removes them; a second DEL succeeds.
    conf = {
        **conflist["plugins"][-1],
        "name": conflist["name"],
        "cniVersion": conflist["cniVersion"],
    }
    conf["prevResult"] = shop.cni_result
    kubelet._exec_plugin("CHECK", conf, shop, "eth0")
    kubelet._exec_plugin("DEL", conf, shop, "eth0")
    assert mesh_rules(shop.netns.name) == []
    failed = run_validation(shop.netns.name, validation, tmp=node)
    assert failed.returncode == 126, failed.stderr  # the kubelet would restart the pod
    with pytest.raises(CniError, match="capture rules of pod"):
        kubelet._exec_plugin("CHECK", conf, shop, "eth0")
    kubelet.delete_pod(shop)  # the runtime's DEL of the whole chain: ours runs a second time
    kubelet.delete_pod(plain)
    kubelet.delete_pod(system)


def validation_container(core: k8s.CoreV1Api, ns: str, name: str) -> k8s.V1Container:
    stored = core.read_namespaced_pod(name, ns)
    (container,) = [c for c in stored.spec.init_containers if c.name == "istio-validation"]
    return container


def run_validation(
    netns: str, container: k8s.V1Container, tmp: Path
) -> subprocess.CompletedProcess[str]:
    """The container's command in ``netns`` as its user and group, unprivileged (no caps)."""
    assert container.command == ["meshctl"]
    context = container.security_context
    ids = [f"--reuid={context.run_as_user}", f"--regid={context.run_as_group}", "--clear-groups"]
    meshctl = [sys.executable, "-c", "from meshctl.entry import run; run()"]
    argv = ["ip", "netns", "exec", netns, "setpriv", *ids, "--", *meshctl, *container.args]
    env = {
        "PATH": "/usr/sbin:/usr/bin:/sbin:/bin",
        "HOME": str(tmp),
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    argv += ["--probe-timeout", "2"]
    return subprocess.run(argv, capture_output=True, text=True, timeout=60, env=env, check=False)
