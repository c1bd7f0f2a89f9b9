"""`meshctl cni manifest`, applied as is, on the real node: containerd calls our plugin.

The DaemonSet's pod (from the meshctl image imported into the node) installs the plugin into
/opt/cni/bin and our entry into the node's conflist; every pod sandbox created afterwards goes
through bridge + host-local + meshctl-cni as containerd runs the chain. An injected pod in CNI mode
gets its capture rules without an init container and its istio-validation init container passes;
a pod in an excluded namespace and a plain pod are untouched; deleting the DaemonSet gives the
node its conflist back.
"""

from __future__ import annotations

import datetime
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s

from meshctl.core.k8s.cni.spec import DEFAULT_RUN_DIR
from meshctl.core.k8s.inject.interception import capture_args
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.core.pki import certs
from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.cli import run_meshctl
from tests.harness.node import CNI_BIN_DIR, CNI_CONF_DIR, CONFLIST_NAME, TestNode, report_namespace

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"


# Where this node's containerd pins pod netns (under its state dir): the agent, which serves the
# plugin's requests, enters them through its mount of this directory.
NETNS_DIR = nodehost.WORKDIR / "containerd" / "state"


def manifest() -> list[dict[str, Any]]:
    printed = run_meshctl("cni", "manifest", "--netns-dir", str(NETNS_DIR), "-o", "json")
    assert printed.returncode == 0, printed.stderr
    items: list[dict[str, Any]] = json.loads(printed.stdout)["items"]
    return items


@pytest.fixture(scope="module")
def cni_daemonset(kube_node: TestNode) -> Iterator[tuple[bytes, list[dict[str, Any]]]]:
    """The DaemonSet rolled out; yields the node's conflist as it was before, and the objects."""
    kube_node.image("meshctl")
    conflist = CNI_CONF_DIR / CONFLIST_NAME
    original = conflist.read_bytes()
    objects = manifest()
    with kube_node.cluster.api_client() as api:
        k8s.CoreV1Api(api).create_namespace({"metadata": {"name": SYSTEM_NS}})
        try:
            wl.wait_service_account(api, SYSTEM_NS)
            publish_root_cert(api, SYSTEM_NS)
            wl.apply(api, objects)
            try:
                wl.wait_rollout(api, "DaemonSet", SYSTEM_NS, "meshctl-cni-node", timeout=120)
            except TimeoutError as exc:
                pytest.fail(f"{exc}\n{wl.describe_namespace(api, SYSTEM_NS)}")
            yield original, objects
        finally:
            wl.delete(api, objects)
            wl.delete_namespace_now(api, SYSTEM_NS)


def publish_root_cert(api, namespace: str) -> None:
    """What the control plane does in every namespace: the mesh root in its ConfigMap (the
    injected containers mount it; without it kubelet never creates the pod's sandbox)."""
    root = certs.mint_root(
        trust_domain="cluster.local",
        now=datetime.datetime.now(datetime.UTC),
        ttl=datetime.timedelta(days=1),
    )
    body = {
        "metadata": {"name": InjectSettings().root_ca_configmap},
        "data": {"root-cert.pem": root.cert_pem.decode()},
    }
    k8s.CoreV1Api(api).create_namespaced_config_map(namespace, body)


def pod_netns(ip: str) -> str:
    """The netns file (containerd keeps them under its state dir) that holds ``ip``."""
    for point in nodehost.mounts_under([str(nodehost.WORKDIR / "containerd" / "state")]):
        if "/netns/" not in point:
            continue
        out = subprocess.run(
            ["nsenter", f"--net={point}", "ip", "-4", "-o", "addr"],
            capture_output=True,
            text=True,
            check=False,
        ).stdout
        if f" {ip}/" in out:
            return point
    raise AssertionError(f"no pod netns holds {ip}")


def mesh_rules(netns_path: str) -> list[str]:
    lines = []
    for tool in ("iptables-legacy-save", "iptables-nft-save"):
        out = subprocess.run(
            ["nsenter", f"--net={netns_path}", tool], capture_output=True, text=True, check=False
        ).stdout
        lines += [line for line in out.splitlines() if "MESH_" in line]
    return lines


def injected(pod: dict[str, Any], tmp_path: Path) -> dict[str, Any]:
    """`meshctl inject --cni` of the pod, as a user would run it."""
    source = tmp_path / f"{pod['metadata']['name']}.yaml"
    source.write_text(yaml.safe_dump(pod))
    out = run_meshctl("inject", "--cni", "-f", str(source))
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = yaml.safe_load(out.stdout)
    return result


def test_daemonset_installs_the_plugin_and_containerd_calls_it_for_new_pods(
    kube_node: TestNode, cni_daemonset, node_namespace: str, tmp_path: Path, request
):
    merged = json.loads((CNI_CONF_DIR / CONFLIST_NAME).read_bytes())
    assert [p["type"] for p in merged["plugins"]] == ["bridge", "meshctl-cni"]
    assert (CNI_BIN_DIR / "meshctl-cni").stat().st_mode & 0o111
    image = kube_node.image("busybox")
    report_namespace(request.node, SYSTEM_NS)
    app = wl.busybox_pod("shop", image, ["sleep", "3600"])
    app["metadata"]["annotations"] = {"traffic.sidecar.istio.io/excludeInboundPorts": "9090"}
    shop = injected(app, tmp_path)
    names = [c["name"] for c in shop["spec"]["initContainers"]]
    assert "istio-init" not in names
    assert "istio-validation" in names
    # The same injected pod in a namespace the manifest excludes (meshctl-system).
    excluded = injected(wl.busybox_pod("excluded", image, ["sleep", "3600"]), tmp_path)
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        publish_root_cert(api, node_namespace)
        core.create_namespaced_pod(node_namespace, shop)
        core.create_namespaced_pod(
            node_namespace, wl.busybox_pod("plain", image, ["sleep", "3600"])
        )
        core.create_namespaced_pod(SYSTEM_NS, excluded)
        plain = wl.wait_pod_ready(api, node_namespace, "plain")

        def validation_done(pod) -> bool:
            return any(
                s.name == "istio-validation" and s.state.terminated is not None
                for s in pod.status.init_container_statuses or []
            )

        def read(ns: str, name: str):
            return lambda: core.read_namespaced_pod(name, ns)

        # The validation init container ran in the pod's netns, as the proxy's uid, and found
        # the capture the plugin installed (exit 0, first try).
        stored = wl.retry(read(node_namespace, "shop"), validation_done, timeout=90)
        assert validation_done(stored), "istio-validation never finished"
        (status,) = [
            s for s in stored.status.init_container_statuses if s.name == "istio-validation"
        ]
        assert status.state.terminated.exit_code == 0, status
        assert status.restart_count == 0
        shop_netns = pod_netns(stored.status.pod_ip)
        assert any("MESH_OUTPUT" in line for line in mesh_rules(shop_netns))
        args = capture_args(shop["metadata"]["annotations"], proxy_uid=1337, proxy_gid=1337)
        check = run_meshctl("iptables", "check", "--netns", shop_netns, *args)
        assert check.returncode == 0, check.stdout + check.stderr
        assert mesh_rules(pod_netns(plain.status.pod_ip)) == []
        # Excluded by namespace: untouched, so its own validation fails (and kubelet retries it).
        other = wl.retry(read(SYSTEM_NS, "excluded"), lambda p: bool(p.status.pod_ip), timeout=60)
        assert mesh_rules(pod_netns(other.status.pod_ip)) == []
        failed = wl.retry(read(SYSTEM_NS, "excluded"), validation_done, timeout=90)
        if validation_done(failed):
            (status,) = [
                s for s in failed.status.init_container_statuses if s.name == "istio-validation"
            ]
            assert status.state.terminated.exit_code == 126, status
    # containerd called the plugin for every new sandbox, whatever it decided.
    log = (Path(DEFAULT_RUN_DIR) / "meshctl-cni.log").read_text()
    assert f"{node_namespace}/plain: no capture: not injected" in log
    assert f"{SYSTEM_NS}/excluded: namespace excluded" in log
    assert f"{node_namespace}/shop" in log


def test_deleting_the_daemonset_restores_the_node_conflist(kube_node: TestNode, cni_daemonset):
    original, objects = cni_daemonset
    daemonset = [o for o in objects if o["kind"] == "DaemonSet"]
    with kube_node.cluster.api_client() as api:
        wl.delete(api, daemonset)
        wl.retry(
            (CNI_CONF_DIR / CONFLIST_NAME).read_bytes,
            lambda conf: conf == original,
            timeout=30,
        )
    assert (CNI_CONF_DIR / CONFLIST_NAME).read_bytes() == original
    assert not (CNI_BIN_DIR / "meshctl-cni").exists()
