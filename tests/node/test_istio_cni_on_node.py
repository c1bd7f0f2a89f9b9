"""meshctl's node proxy driven by Istio's own node agent (istio-cni) on the real node.

Istio's ``install-cni`` (built from the pinned Istio module, tests/harness/istio_cni.py) runs as
the istio-cni chart's DaemonSet with ambient on: it chains its plugin into the node's CNI config,
watches the pods of ambient namespaces, writes Istio's in-pod rules and serves ZDS on
/var/run/ztunnel/ztunnel.sock. meshctl's node proxy (``meshctl ztunnel manifest``) connects there
instead of to meshctl's agent (not installed), and takes its certificates and workloads from
meshctl's control plane. The tests run in order on one stack: hello and the (empty) snapshot; two
pods started afterwards added with their own netns and talking with mutual TLS through the
proxy; a restarted proxy served the running pods again from the agent's snapshot; a deleted pod
removed from the proxy. Uninstalled first (before the namespace goes), the agent leaves none of
its host rules (checked when the module's stack is torn down).
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException
from meshctl_plugins.controlplane import crds

from tests.harness import istio_cni, nodehost
from tests.harness import workloads as wl
from tests.harness.ambient_pods import (
    APP_PORT,
    NODE_PROXY_SELECTOR,
    mtls_opened,
    talk_mtls_through_node_proxy,
)
from tests.harness.cli import run_meshctl
from tests.harness.node import CNI_BIN_DIR, CNI_CONF_DIR, TestNode, report_namespace

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"
AGENT_SELECTOR = f"k8s-app={istio_cni.DAEMONSET}"


def manifest(*args: str) -> list[dict[str, Any]]:
    printed = run_meshctl(*args, "-o", "json")
    assert printed.returncode == 0, printed.stderr
    items: list[dict[str, Any]] = json.loads(printed.stdout)["items"]
    return items


@pytest.fixture(scope="module")
def stack(kube_node: TestNode, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """meshctl's control plane and node proxy, Istio's agent instead of meshctl's."""
    image = kube_node.image("meshctl")
    archive, agent_image = istio_cni.image_archive(tmp_path_factory.mktemp("istio-cni"))
    kube_node.cluster.import_image(archive)
    netns_dir = str(nodehost.WORKDIR / "containerd" / "state")  # where this node pins netns
    # Host folders the agent's hostPaths create; removed afterwards if this test made them.
    made = [d for d in (istio_cni.AGENT_RUN_DIR, istio_cni.ZDS_DIR) if not Path(d).exists()]
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": SYSTEM_NS}})
        agent = istio_cni.objects(SYSTEM_NS, agent_image, netns_dir)
        applied: list[dict[str, Any]] = []
        try:
            wl.wait_service_account(api, SYSTEM_NS)
            wl.apply(api, crds.objects())
            plane = manifest("controlplane", "manifest", "--image", image, "--replicas", "1")
            applied += plane
            wl.apply(api, plane)
            wl.wait_rollout(api, "Deployment", SYSTEM_NS, "meshctl-controlplane", timeout=180)
            service = core.read_namespaced_service("meshctl-controlplane", SYSTEM_NS)
            address = f"{service.spec.cluster_ip}:15012"  # no cluster DNS on this node
            wl.apply(api, agent)
            wl.wait_rollout(api, "DaemonSet", SYSTEM_NS, istio_cni.DAEMONSET, timeout=180)
            proxy = manifest(
                "ztunnel", "manifest", "--image", image,
                "--ca-address", address, "--xds-address", address,
            )  # fmt: skip
            applied += proxy
            wl.apply(api, proxy)
            # Ready only once it has Istio's agent's snapshot (meshctl's agent is not there).
            wl.wait_rollout(api, "DaemonSet", SYSTEM_NS, "meshctl-ztunnel", timeout=180)
            yield api
        except TimeoutError as exc:
            pytest.fail(f"{exc}\n{wl.describe_namespace(api, SYSTEM_NS)}")
        finally:
            # Istio's agent first (the control plane's manifest holds the namespace), and its pod
            # given its grace with its RBAC in place: seeing its DaemonSet deleted, the agent is
            # to remove its plugin, kubeconfig and host rules (an upgrade would keep them). Its
            # log is read until the pod is gone.
            with contextlib.suppress(ApiException):
                k8s.AppsV1Api(api).delete_namespaced_daemon_set(
                    istio_cni.DAEMONSET, SYSTEM_NS, propagation_policy="Foreground"
                )
            shutdown = wait_agent_gone(api)
            wl.delete(api, agent)
            wl.delete(api, list(reversed(applied)))
            wl.delete_namespace_now(api, SYSTEM_NS)
            left = istio_cni.remove_host_rules()
            for folder in made:
                shutil.rmtree(folder, ignore_errors=True)
            # Removed above all the same; that the agent cleaned up after itself is part of
            # running it as its chart does.
            last_words = "\n".join(shutdown.splitlines()[-30:]) or "(no log could be read)"
            assert not left, f"Istio's agent left {left} on the node; its last log:\n{last_words}"


@pytest.fixture(scope="module")
def pods_ns(kube_node: TestNode, stack: Any) -> Iterator[str]:
    """The namespace of the ambient pods, shared by the ordered tests below."""
    name = f"istio-cni-pods-{int(time.time()) % 100000}"
    k8s.CoreV1Api(stack).create_namespace({"metadata": {"name": name}})
    try:
        wl.wait_service_account(stack, name)
        yield name
    finally:
        wl.delete_namespace_now(stack, name)


def wait_agent_gone(api: Any, timeout: float = 90) -> str:
    """Waits until the agent's pod is gone; returns its log as last read (its shutdown)."""
    last = ""
    deadline = time.monotonic() + timeout
    while agents := wl.pods(api, SYSTEM_NS, AGENT_SELECTOR):
        name = agents[0].metadata.name
        with contextlib.suppress(ApiException):
            last = wl.pod_logs(api, SYSTEM_NS, name)
        with contextlib.suppress(ApiException):  # a container that ended and was restarted
            last = wl.pod_logs(api, SYSTEM_NS, name, previous=True, tail=30) + last
        if time.monotonic() > deadline:
            break
        time.sleep(0.5)
    return last


def live_proxies(api: Any) -> list[Any]:
    """The node proxy pods not on their way out (a restart overlaps two)."""
    found = wl.pods(api, SYSTEM_NS, NODE_PROXY_SELECTOR)
    return [p for p in found if not p.metadata.deletion_timestamp]


def current_proxy(api: Any) -> Any:
    live = live_proxies(api)
    assert live, "no node proxy pod"
    return max(live, key=lambda p: p.metadata.creation_timestamp)


def proxy_logs(api: Any) -> str:
    return wl.pod_logs(api, SYSTEM_NS, current_proxy(api).metadata.name)


def agent_logs(api: Any) -> str:
    (pod,) = wl.pods(api, SYSTEM_NS, AGENT_SELECTOR)
    return wl.pod_logs(api, SYSTEM_NS, pod.metadata.name)


def wait_log(api: Any, read: Any, pattern: str, timeout: float = 60) -> re.Match[str]:
    deadline = time.monotonic() + timeout
    while True:
        found = re.search(pattern, read(api))
        if found:
            return found
        assert time.monotonic() < deadline, f"no {pattern!r} in:\n{read(api)[-3000:]}"
        time.sleep(1)


def pod_netns(api: Any, namespace: str, name: str) -> str:
    out = wl.pod_exec(api, namespace, name, ["readlink", "/proc/self/ns/net"], timeout=20)
    assert out.stdout.startswith("net:["), out
    return out.stdout.strip()


def test_istio_agent_takes_the_node_proxys_hello_and_sends_its_snapshot(stack, request):
    report_namespace(request.node, SYSTEM_NS)
    wait_log(stack, agent_logs, r"received hello from ztunnel")
    wait_log(stack, proxy_logs, r"connected to the node agent at /var/run/ztunnel/ztunnel\.sock")
    wait_log(stack, proxy_logs, r"node agent snapshot applied: 0 pods served")
    # Istio's plugin is chained into the node's CNI config, next to its binary.
    conflists = [json.loads(p.read_text()) for p in CNI_CONF_DIR.glob("*.conflist")]
    assert any(p.get("type") == "istio-cni" for c in conflists for p in c["plugins"]), conflists
    assert (CNI_BIN_DIR / "istio-cni").is_file()


def test_pods_istio_adds_talk_mtls_through_meshctls_node_proxy(stack, pods_ns, kube_node, request):
    report_namespace(request.node, SYSTEM_NS)
    talk_mtls_through_node_proxy(stack, pods_ns, kube_node.image("busybox"), SYSTEM_NS)
    core = k8s.CoreV1Api(stack)
    for name in ("server", "client"):
        uid = core.read_namespaced_pod(name, pods_ns).metadata.uid
        enrolled = rf"pod {pods_ns}/{name} \({uid}\) enrolled: [^\"]* in (net:\[\d+\])"
        added = wait_log(stack, proxy_logs, enrolled)
        # The descriptor Istio's agent passed is the pod's own network namespace.
        assert added.group(1) == pod_netns(stack, pods_ns, name)


def test_restarted_node_proxy_serves_running_pods_from_istios_snapshot(stack, pods_ns, request):
    report_namespace(request.node, SYSTEM_NS)
    (old,) = wl.pods(stack, SYSTEM_NS, NODE_PROXY_SELECTOR)
    k8s.CoreV1Api(stack).delete_namespaced_pod(old.metadata.name, SYSTEM_NS)
    wl.wait_rollout(stack, "DaemonSet", SYSTEM_NS, "meshctl-ztunnel", timeout=120)
    # Until the old one is gone: the metrics below must be the new proxy's.
    only = wl.retry(
        lambda: wl.pods(stack, SYSTEM_NS, NODE_PROXY_SELECTOR),
        lambda found: (
            len(found) == 1
            and found[0].metadata.name != old.metadata.name
            and wl.pod_ready(found[0])
        ),
        timeout=120,
    )
    assert [p.metadata.name for p in only] != [old.metadata.name], "the proxy never restarted"
    wait_log(stack, proxy_logs, r"node agent snapshot applied: 2 pods served")
    for name in ("server", "client"):
        wait_log(stack, proxy_logs, rf"pod {pods_ns}/{name} \([^)]+\) enrolled")
    server_ip = k8s.CoreV1Api(stack).read_namespaced_pod("server", pods_ns).status.pod_ip
    deadline = time.monotonic() + 60
    while True:
        out = wl.pod_exec(stack, pods_ns, "client", ["nc", "-w", "3", server_ip, str(APP_PORT)])
        if "served" in out.stdout:
            break
        assert time.monotonic() < deadline, "the client never reached the server again"
        time.sleep(1)
    client_id = f"spiffe://cluster.local/ns/{pods_ns}/sa/client"
    server_id = f"spiffe://cluster.local/ns/{pods_ns}/sa/server"
    assert mtls_opened(stack, SYSTEM_NS, client_id, server_id) > 0  # counted by the new proxy


def test_pod_deleted_is_removed_from_meshctls_node_proxy(stack, pods_ns, request):
    report_namespace(request.node, SYSTEM_NS)
    uid = k8s.CoreV1Api(stack).read_namespaced_pod("server", pods_ns).metadata.uid
    k8s.CoreV1Api(stack).delete_namespaced_pod("server", pods_ns)
    wait_log(stack, proxy_logs, rf"pod {pods_ns}/server \({uid}\) removed")
