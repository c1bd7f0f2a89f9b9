"""The node agent against an independent ZDS proxy peer (tests/netns/zds_peer.py), not our
node proxy: the real CNI chain, the real kube-apiserver, the agent's ZDS exactly as Istio's.

Also the agent's bad-input cases: a proxy that refuses a pod, a pod deleted while its
enrollment waits for the proxy, a netns that vanished before a label enrolled its pod, and a
peer that speaks garbage; each refused with a clear log line, every other pod unaffected.
"""

from __future__ import annotations

import contextlib
import re
import socket
import threading
from pathlib import Path

import pytest
from kubernetes import client as k8s

from meshctl.core.k8s import ambient
from meshctl.proto import zds_pb2
from tests.harness import netns as netns_mod
from tests.harness.cni import mesh_rules
from tests.harness.kube import CniError, create_namespace, delete_namespace, kubelet_node
from tests.harness.wait import eventually
from tests.kube.ambient_support import (
    AmbientKubeNode,
    agent_rbac,
    annotation,
    pod,
    prepare_nodes,
)
from tests.netns.zds_peer import PACKET, ProxyPeer

pytestmark = [pytest.mark.kube, pytest.mark.netns]


@pytest.fixture
def node(kube_cluster, kube_api, netns_factory, tmp_path, kube_namespace):
    """One node with its agent and no node proxy: the test plays the proxy."""
    with (
        kubelet_node(kube_cluster, kube_api, netns_factory) as kubelet,
        agent_rbac(kube_api, kube_namespace),
    ):
        (node,) = prepare_nodes(kube_cluster, [kubelet], tmp_path, kube_namespace)
        node.start_agent()
        node.read_conflist()
        try:
            yield node
        finally:
            with contextlib.suppress(CniError):
                kubelet.close()  # sandboxes first: their CNI DEL needs the installed plugin
            node.stop_agent()


@pytest.fixture
def mesh_ns(kube_api, kube_namespace):
    name = f"{kube_namespace}-z"[:60]
    create_namespace(kube_api, name, labels={ambient.DATAPLANE_MODE: ambient.MODE_AMBIENT})
    try:
        yield name
    finally:
        delete_namespace(kube_api, name)


def test_the_agent_speaks_zds_to_an_independent_proxy(node: AmbientKubeNode, kube_api, mesh_ns):
    core = k8s.CoreV1Api(kube_api)
    peer = ProxyPeer(node.socket).start()
    try:
        eventually("empty snapshot", lambda: peer.kinds() == ["snapshot_sent"])
        core.create_namespaced_pod(mesh_ns, pod("web"))
        web = node.run_pod(mesh_ns, "web")
        add = next(r for r in peer.received if r.kind == "add")
        assert add.uid == web.uid
        assert add.info == (mesh_ns, "web", "default")
        assert (
            add.netns_inode == Path(web.netns.path).stat().st_ino
        )  # the pod's netns, as SCM_RIGHTS
        eventually("annotated", lambda: annotation(kube_api, mesh_ns, "web") == "enabled")

        # A proxy that reconnects gets the snapshot again: the pod with its netns, then the end.
        peer.close()
        again = ProxyPeer(node.socket).start()
        try:
            eventually("second snapshot", lambda: again.kinds() == ["add", "snapshot_sent"])
            assert again.received[0].netns_inode == add.netns_inode

            # A pod the proxy refuses: the ADD fails (the runtime retries), pending + an event.
            core.create_namespaced_pod(mesh_ns, pod("refused"))
            uid = core.read_namespaced_pod("refused", mesh_ns).metadata.uid
            again.refuse[uid] = "failure to start proxy : no room"
            with pytest.raises(CniError, match="did not capture it"):
                node.run_pod(mesh_ns, "refused")
            assert annotation(kube_api, mesh_ns, "refused") == ambient.REDIRECTION_PENDING
            eventually("a Warning event", lambda: failed_event(core, mesh_ns, "refused"))
            assert "no room" in node.log()
            assert annotation(kube_api, mesh_ns, "web") == "enabled"  # the other pod: untouched

            # The pod goes: the proxy is told to delete it, every rule of ours is gone.
            node.kubelet.delete_pod(web)
            eventually("del sent", lambda: sent(again, "del", web.uid))
            eventually(
                "no probe SNAT for it",
                lambda: not any(web.ip in line for line in mesh_rules(node.ns.name)),
            )
        finally:
            again.close()
    finally:
        peer.close()


def test_a_pod_deleted_while_its_proxy_hand_over_waits_is_removed_again(
    node: AmbientKubeNode, kube_api, mesh_ns
):
    core = k8s.CoreV1Api(kube_api)
    peer = ProxyPeer(node.socket).start()
    try:
        eventually("empty snapshot", lambda: peer.kinds() == ["snapshot_sent"])
        core.create_namespaced_pod(mesh_ns, pod("brief"))
        uid = core.read_namespaced_pod("brief", mesh_ns).metadata.uid
        gate = peer.hold[uid] = threading.Event()
        result: list[object] = []
        adding = threading.Thread(
            target=lambda: result.append(_run(node, mesh_ns, "brief")), daemon=True
        )
        adding.start()
        eventually("add in flight", lambda: "add" in peer.kinds(), 20)
        core.delete_namespaced_pod("brief", mesh_ns, grace_period_seconds=0)
        gate.set()
        adding.join(30)
        eventually("del sent", lambda: sent(peer, "del", uid), 15)
        # Which reason depends on what the watch delivers first: the pod with its deletion
        # timestamp (grace 0 still sets one) or already DELETED.
        eventually(
            "logged as gone",
            lambda: (
                re.search(r"removed from the mesh: the pod is (gone|being deleted)", node.log())
                is not None
            ),
            15,
        )
    finally:
        peer.close()


def failed_event(core: k8s.CoreV1Api, namespace: str, name: str) -> bool:
    events = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}")
    return any(e.reason == "AmbientEnrollmentFailed" for e in events.items)


def sent(peer: ProxyPeer, kind: str, uid: str) -> bool:
    return any((r.kind, r.uid) == (kind, uid) for r in list(peer.received))


def _run(node, ns, name):
    """The stand-in kubelet's start of a pod the test deletes meanwhile (any outcome)."""
    try:
        return node.run_pod(ns, name)
    except Exception as exc:  # noqa: BLE001 (the pod vanished under the stand-in: any error)
        return exc


def test_a_vanished_netns_and_garbage_are_refused_and_others_are_unaffected(
    node: AmbientKubeNode, kube_api, mesh_ns, kube_namespace
):
    core = k8s.CoreV1Api(kube_api)
    peer = ProxyPeer(node.socket).start()
    try:
        eventually("empty snapshot", lambda: peer.kinds() == ["snapshot_sent"])
        core.create_namespaced_pod(mesh_ns, pod("steady"))
        steady = node.run_pod(mesh_ns, "steady")
        # A pod outside the mesh whose netns disappears without a CNI DEL, then a label
        # enrolls it: refused with a clear line and an event.
        plain = f"{kube_namespace}-plain"[:60]
        create_namespace(kube_api, plain)
        try:
            core.create_namespaced_pod(plain, pod("ghost"))
            ghost = node.run_pod(plain, "ghost")
            netns_mod.destroy(ghost.netns)
            enroll = {"metadata": {"labels": {ambient.DATAPLANE_MODE: ambient.MODE_AMBIENT}}}
            core.patch_namespace(plain, enroll)
            eventually("refused", lambda: "vanished" in node.log(), 15)
            eventually("a Warning event", lambda: failed_event(core, plain, "ghost"))
        finally:
            delete_namespace(kube_api, plain)

        # Garbage instead of a hello, and an answer that is not an ack: each such connection
        # is dropped; the agent keeps serving the real proxy.
        not_a_hello = zds_pb2.WorkloadRequest(snapshot_sent={}).SerializeToString()
        for junk in (b"\xff\xfe\xfd", not_a_hello):
            bad = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            bad.settimeout(10)
            bad.connect(str(node.socket))
            bad.send(junk)
            bad.recv(PACKET)  # closed by the agent (or its snapshot's first packet)
            bad.close()
        assert "dropped" in node.log()
        core.create_namespaced_pod(mesh_ns, pod("after"))
        node.run_pod(mesh_ns, "after")
        assert annotation(kube_api, mesh_ns, "steady") == "enabled"
        assert any("MESH_PRERT" in line for line in mesh_rules(steady.netns.name))
    finally:
        peer.close()
