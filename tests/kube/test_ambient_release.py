"""Taking pods out of ambient mode without breaking them: a removal that fails, and the node
agent's exit (an upgrade keeps the pods, an uninstall releases them).

One node (kubelet stand-in, the real chain, the real kube-apiserver) with its node agent and node
proxy; an enrolled server with an echo app, and an opted-out bystander that talks to it in
plaintext (through the server's 15006 while enrolled, straight to the app once released). The
bystander's connection must work at every step: a pod redirected to a proxy that no longer
serves it refuses every connection, which is the defect these tests guard against.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator

import pytest
from kubernetes import client as k8s

from meshctl.core.k8s import ambient
from tests.harness.cni import mesh_rules
from tests.harness.kube import kubelet_node
from tests.harness.wait import eventually
from tests.kube.ambient_support import (
    AGENT_PORT,
    APP,
    AmbientKubeNode,
    ambient_nodes,
    annotation,
    host_rules,
    pod,
    proxy_of,
    serves_nothing,
)
from tests.netns.ztunnel_harness import EchoServer, echo_roundtrip, http_get

pytestmark = [pytest.mark.kube, pytest.mark.netns]

OPTED_OUT = {"app": "bystander", ambient.DATAPLANE_MODE: ambient.MODE_NONE}


@pytest.fixture
def one_node(kube_cluster, kube_api, netns_factory, tmp_path, kube_namespace):
    with (
        kubelet_node(kube_cluster, kube_api, netns_factory) as kubelet,
        ambient_nodes(kube_cluster, [kubelet], tmp_path, kube_namespace, kube_api) as nodes,
    ):
        yield nodes[0]


@pytest.fixture
def served(one_node: AmbientKubeNode, kube_api, mesh_namespace: str) -> Iterator[tuple]:
    """The enrolled server (echo app running) and the opted-out bystander."""
    core = k8s.CoreV1Api(kube_api)
    core.create_namespaced_pod(mesh_namespace, pod("server", sa="server"))
    core.create_namespaced_pod(mesh_namespace, pod("bystander", labels=OPTED_OUT))
    server = one_node.run_pod(mesh_namespace, "server")
    bystander = one_node.run_pod(mesh_namespace, "bystander")
    eventually(
        "server enrolled", lambda: annotation(kube_api, mesh_namespace, "server") == "enabled"
    )
    echo = EchoServer(server.netns, server.ip, APP)
    try:
        assert works(bystander, server)
        yield server, bystander
    finally:
        echo.close()


def works(client, server) -> bool:
    try:
        return echo_roundtrip(client.netns, (server.ip, APP), b"hello", timeout=3)[32:] == b"hello"
    except OSError:
        return False


def status(node: AmbientKubeNode) -> dict:
    code, body = http_get(node.ns, AGENT_PORT, "/status", timeout=5)[:2]
    assert code == 200
    return json.loads(body)


def events(api, namespace: str, name: str) -> list[str]:
    found = k8s.CoreV1Api(api).list_namespaced_event(
        namespace, field_selector=f"involvedObject.name={name}"
    )
    return [f"{e.reason}: {e.message}" for e in found.items]


def test_a_removal_that_fails_keeps_the_pod_served_and_is_retried(
    one_node: AmbientKubeNode, kube_api, mesh_namespace: str, served
):
    server, bystander = served
    ns = mesh_namespace
    # The pod's netns file stops being a namespace (its bind mount gone, the namespace alive:
    # we hold it): every attempt to enter it fails, as a broken removal would.
    held = os.open(server.netns.path, os.O_RDONLY)
    subprocess.run(["umount", "--lazy", server.netns.path], check=True)
    try:
        opt_out = {"metadata": {"labels": {ambient.DATAPLANE_MODE: ambient.MODE_NONE}}}
        k8s.CoreV1Api(kube_api).patch_namespaced_pod("server", ns, opt_out)
        eventually(
            "a Warning event says the removal failed",
            lambda: any(
                e.startswith("AmbientRemovalFailed") for e in events(kube_api, ns, "server")
            ),
            timeout=15,
        )
        entry = next(p for p in status(one_node)["pods"] if p["name"] == "server")
        assert entry["captured"], entry
        assert entry["served"], entry
        assert "could not be removed" in entry["error"], entry
        assert f"{ns}/server" in " ".join(status(one_node)["ambient"]["failing"])
        assert works(bystander, server), "the pod must stay served while its rules remain"
        assert annotation(kube_api, ns, "server") == "enabled"
    finally:
        subprocess.run(
            [
                "mount",
                "--bind",
                "--no-canonicalize",
                f"/proc/{os.getpid()}/fd/{held}",
                server.netns.path,
            ],
            check=True,
        )
        os.close(held)
    # The retry (backing off from 0.5 s) succeeds now.
    eventually("annotation removed", lambda: annotation(kube_api, ns, "server") is None, 30)
    eventually("its rules removed", lambda: mesh_rules(server.netns.name) == [])
    eventually("the proxy lets it go", lambda: serves_nothing(one_node))
    eventually("no probe SNAT", lambda: not any(server.ip in r for r in host_rules(one_node)))
    assert works(bystander, server)
    assert "removed from the mesh" in one_node.log()


def _agent_pod(api, namespace: str, *, owner: dict | None) -> str:
    """A Pod object standing for the agent's own (never run), owned by ``owner``."""
    body = pod("agent-self")
    if owner is not None:
        body["metadata"]["ownerReferences"] = [
            {
                "apiVersion": "apps/v1",
                "kind": "DaemonSet",
                "name": owner["metadata"]["name"],
                "uid": owner["metadata"]["uid"],
                "controller": True,
            }
        ]
    k8s.CoreV1Api(api).create_namespaced_pod(namespace, body)
    return "agent-self"


def _daemonset(api, namespace: str) -> dict:
    body = {
        "apiVersion": "apps/v1",
        "kind": "DaemonSet",
        "metadata": {"name": "meshctl-cni-node"},
        "spec": {
            "selector": {"matchLabels": {"app": "agent"}},
            "template": {
                "metadata": {"labels": {"app": "agent"}},
                "spec": {"containers": [{"name": "a", "image": "registry.invalid/a:1"}]},
            },
        },
    }
    created = k8s.AppsV1Api(api).create_namespaced_daemon_set(namespace, body)
    return api.sanitize_for_serialization(created)


def test_an_upgraded_agent_keeps_the_pods_and_an_uninstalled_one_releases_them(
    one_node: AmbientKubeNode, kube_api, mesh_namespace: str, kube_namespace: str, served
):
    server, bystander = served
    state_file = one_node.dir / "run" / "ambient-pods.json"
    daemonset = _daemonset(kube_api, kube_namespace)
    own = {"POD_NAME": _agent_pod(kube_api, kube_namespace, owner=daemonset),
           "POD_NAMESPACE": kube_namespace}  # fmt: skip

    # SIGTERM while its DaemonSet stays: an upgrade; the pod stays captured and served.
    one_node.stop_agent()
    one_node.start_agent(env=own)
    assert one_node.stop_agent() == 0
    assert "keeping the pods" in one_node.log()
    assert any("MESH_PRERT" in line for line in mesh_rules(server.netns.name))
    assert state_file.exists()
    assert works(bystander, server)
    assert annotation(kube_api, mesh_namespace, "server") == "enabled"

    # SIGTERM once its DaemonSet is gone: an uninstall; every pod is released first.
    one_node.start_agent(env=own)
    eventually(
        "the new agent handed the pod to the proxy again",
        lambda: any(p["name"] == "server" and p["served"] for p in status(one_node)["pods"]),
        15,
    )
    k8s.AppsV1Api(kube_api).delete_namespaced_daemon_set("meshctl-cni-node", kube_namespace)
    assert one_node.stop_agent() == 0
    assert "releasing the pods" in one_node.log()
    assert mesh_rules(server.netns.name) == []
    assert not any(server.ip in r for r in host_rules(one_node))
    assert annotation(kube_api, mesh_namespace, "server") is None
    assert not state_file.exists()
    eventually("the proxy serves nothing", lambda: serves_nothing(one_node))
    assert works(bystander, server)
    # The proxy itself is still up: with no agent it simply has nothing to serve.
    assert proxy_of(one_node).config_dump()["workloadState"] == {}
