"""Ambient mode's way in and out on the real node, through the installed DaemonSets exactly as
manifested (the node agent on a read-only root with its real mounts).

In order, on one install: with the default ``components.cni.netnsDir`` (this node's containerd
pins pod netns under its own state directory) an ambient pod cannot start and both its events
and ``verify`` name the right value; installed again with it, running pods are enrolled and
released by label flips both ways (namespace label, the pod's own opt-out), their connection
checked after every step; ``verify --workload`` reads an ambient pod through its node proxy; the
node's probe rules sit in the nft tables this node's kubelet and kube-proxy use; and
``uninstall``, then ``uninstall --purge``, leave the pods talking and the host's rules and files
as they were before the install.
"""

from __future__ import annotations

import functools
import json
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from meshctl.core.k8s import ambient
from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.ambient_pods import mtls_opened
from tests.harness.mesh_install import SYSTEM_NS, Mesh, failing, installed
from tests.harness.node import TestNode, report_namespace

pytestmark = pytest.mark.node

APP_PORT = 8080
NETNS_DIR = nodehost.WORKDIR / "containerd" / "state"  # where this node's containerd pins them
ENROLLABLE = "meshctl-cni: ambient pods can be enrolled on every node"
LEFT = "meshctl-cni: no pod is redirected to a node proxy that is gone"


def host_mesh_rules() -> list[str]:
    """Every line of the host's tables (both kinds, both families) naming a MESH_ chain."""
    lines = []
    for tool in nodehost.IPTABLES_TOOLS:
        out = subprocess.run([f"{tool}-save"], capture_output=True, text=True, check=False)
        lines += [f"{tool}: {ln}" for ln in out.stdout.splitlines() if "MESH_" in ln]
    return lines


def run_dir_entries() -> list[str]:
    path = Path("/run/meshctl-cni")
    return sorted(p.name for p in path.iterdir()) if path.exists() else []


@pytest.fixture(scope="module")
def before_install() -> dict[str, list[str]]:
    return {"rules": host_mesh_rules(), "run_dir": run_dir_entries()}


@pytest.fixture(scope="module")
def mesh(kube_node: TestNode, before_install) -> Iterator[Mesh]:
    with installed(Mesh(kube_node, "ambient")) as installed_mesh:  # the default netnsDir
        yield installed_mesh


@pytest.fixture(scope="module")
def app_namespace(kube_node: TestNode, mesh: Mesh) -> Iterator[str]:
    name = "ambient-lifecycle"
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": name}})
        wl.wait_service_account(api, name, "default")
        for sa in ("client", "server"):
            core.create_namespaced_service_account(name, {"metadata": {"name": sa}})
        try:
            yield name
        finally:
            wl.delete_namespace_now(api, name)


def label_namespace(api: Any, namespace: str, value: str | None) -> None:
    body = {"metadata": {"labels": {ambient.DATAPLANE_MODE: value}}}
    k8s.CoreV1Api(api).patch_namespace(namespace, body)


def redirection(api: Any, namespace: str, name: str) -> str | None:
    pod = k8s.CoreV1Api(api).read_namespaced_pod(name, namespace)
    return (pod.metadata.annotations or {}).get(ambient.REDIRECTION)


def wait_redirection(api: Any, namespace: str, name: str, value: str | None) -> None:
    found = wl.retry(
        functools.partial(redirection, api, namespace, name),
        lambda found: found == value,
        timeout=60,
    )
    assert found == value, f"pod {namespace}/{name}: {ambient.REDIRECTION}={found}, not {value}"


def talks(api: Any, namespace: str, server_ip: str, timeout: float = 60) -> None:
    """The client reaches the server (retried while discovery catches up with a change)."""

    def once() -> bool:
        out = wl.pod_exec(
            api, namespace, "client", ["nc", "-w", "3", server_ip, str(APP_PORT)], timeout=20
        )
        return "served" in out.stdout

    assert wl.retry(once, bool, timeout=timeout), f"the client did not reach {server_ip}"


def test_a_netns_dir_the_runtime_does_not_use_is_named_with_the_fix(
    kube_node: TestNode, mesh: Mesh, app_namespace: str, request
):
    report_namespace(request.node, SYSTEM_NS)
    with kube_node.cluster.api_client() as api:
        label_namespace(api, app_namespace, ambient.MODE_AMBIENT)
        pod = wl.busybox_pod("stuck", kube_node.image("busybox"), ["sleep", "3600"])
        k8s.CoreV1Api(api).create_namespaced_pod(app_namespace, pod)

        def explained() -> str:
            found = k8s.CoreV1Api(api).list_namespaced_event(
                app_namespace, field_selector="involvedObject.name=stuck"
            )
            return " ".join(e.message or "" for e in found.items)

        text = wl.retry(explained, lambda t: f"components.cni.netnsDir={NETNS_DIR}" in t, 90)
        assert "not visible to the node" in text, text
        stuck = k8s.CoreV1Api(api).read_namespaced_pod("stuck", app_namespace)
        assert not wl.pod_ready(stuck), "an ambient pod must never start uncaptured"
    code, checks, printed = mesh.verify()
    assert code == 3, printed
    assert checks[ENROLLABLE]["result"] == "error", printed
    assert f"components.cni.netnsDir={NETNS_DIR}" in printed, printed
    with kube_node.cluster.api_client() as api:
        k8s.CoreV1Api(api).delete_namespaced_pod("stuck", app_namespace, grace_period_seconds=0)
        label_namespace(api, app_namespace, None)
    # Installed again with this node's directory: the agent restarts with the right mount.
    mesh.extra = ["--set", f"components.cni.netnsDir={NETNS_DIR}"]
    again = mesh.install()
    assert again.returncode == 0, again.stderr


def test_label_flips_enroll_and_release_running_pods(
    kube_node: TestNode, mesh: Mesh, app_namespace: str, request
):
    report_namespace(request.node, SYSTEM_NS)
    ns = app_namespace
    image = kube_node.image("busybox")
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        server = wl.busybox_pod(
            "server", image, ["nc", "-ll", "-p", str(APP_PORT), "-e", "/bin/echo", "served"],
            serviceAccountName="server",
        )  # fmt: skip
        client = wl.busybox_pod("client", image, ["sleep", "3600"], serviceAccountName="client")
        core.create_namespaced_pod(ns, server)
        core.create_namespaced_pod(ns, client)
        server_ip = wl.wait_pod_ready(api, ns, "server", timeout=120).status.pod_ip
        wl.wait_pod_ready(api, ns, "client", timeout=120)
        talks(api, ns, server_ip)  # unmeshed

        client_id = f"spiffe://cluster.local/ns/{ns}/sa/client"
        server_id = f"spiffe://cluster.local/ns/{ns}/sa/server"
        label_namespace(api, ns, ambient.MODE_AMBIENT)  # running pods join
        for name in ("server", "client"):
            wait_redirection(api, ns, name, ambient.REDIRECTION_ENABLED)
        seen = mtls_opened(api, SYSTEM_NS, client_id, server_id)
        talks(api, ns, server_ip)
        assert mtls_opened(api, SYSTEM_NS, client_id, server_id) > seen

        # The node's probe rules: in this node's nft tables (kubelet and kube-proxy use nft).
        rules = host_mesh_rules()
        assert any(server_ip in r and r.startswith("iptables-nft:") for r in rules), rules
        assert not any("legacy" in r for r in rules), rules

        opt_out = {"metadata": {"labels": {ambient.DATAPLANE_MODE: ambient.MODE_NONE}}}
        core.patch_namespaced_pod("server", ns, opt_out)  # the pod's own opt-out
        wait_redirection(api, ns, "server", None)
        talks(api, ns, server_ip)  # a meshed client to a plaintext server

        back = {"metadata": {"labels": {ambient.DATAPLANE_MODE: None}}}
        core.patch_namespaced_pod("server", ns, back)  # the namespace's label applies again
        wait_redirection(api, ns, "server", ambient.REDIRECTION_ENABLED)
        seen = mtls_opened(api, SYSTEM_NS, client_id, server_id)
        talks(api, ns, server_ip)
        assert mtls_opened(api, SYSTEM_NS, client_id, server_id) > seen

        label_namespace(api, ns, None)  # both leave
        for name in ("server", "client"):
            wait_redirection(api, ns, name, None)
        talks(api, ns, server_ip)
        assert not any(server_ip in r for r in host_mesh_rules())

        label_namespace(api, ns, ambient.MODE_AMBIENT)  # and join again, for what follows
        for name in ("server", "client"):
            wait_redirection(api, ns, name, ambient.REDIRECTION_ENABLED)
        talks(api, ns, server_ip)


def test_verify_reads_an_ambient_pod_through_its_node_proxy(
    kube_node: TestNode, mesh: Mesh, app_namespace: str
):
    code, checks, printed = mesh.verify("--workload", f"{app_namespace}/server")
    assert code == 0, printed
    assert not failing(checks), printed
    identity = checks["meshctl-data-plane: the workload's proxy holds its identity"]
    assert "ambient, node proxy" in identity["message"], printed
    assert f"spiffe://cluster.local/ns/{app_namespace}/sa/server" in identity["message"]
    mtls = checks["meshctl-data-plane: the workload talks mTLS to meshed peers"]
    assert mtls["result"] == "success", printed
    assert checks[ENROLLABLE]["result"] == "success", printed
    assert checks[LEFT]["result"] == "success", printed


def test_uninstall_releases_the_pods_and_leaves_the_host_as_before(
    kube_node: TestNode, mesh: Mesh, app_namespace: str, before_install
):
    ns = app_namespace
    with kube_node.cluster.api_client() as api:
        server_ip = k8s.CoreV1Api(api).read_namespaced_pod("server", ns).status.pod_ip
        removed = mesh.run("uninstall", "-y", timeout=300)
        assert removed.returncode == 0, removed.stderr
        for name in ("server", "client"):
            assert redirection(api, ns, name) is None, name
        talks(api, ns, server_ip, timeout=20)
        assert host_mesh_rules() == before_install["rules"]
        assert run_dir_entries() == before_install["run_dir"]
        purged = mesh.run("uninstall", "-y", "--purge", timeout=300)
        assert purged.returncode == 0, purged.stderr
        talks(api, ns, server_ip, timeout=20)
    assert host_mesh_rules() == before_install["rules"]
    assert json.dumps(run_dir_entries()) == json.dumps(before_install["run_dir"])
