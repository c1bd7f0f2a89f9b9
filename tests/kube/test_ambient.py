"""Ambient mode end to end: two nodes, each with its node agent and node proxy, pods started
through the real CNI chain (the spec's ``dbnet`` list + meshctl-cni), the real kube-apiserver.

Pods get no sidecar and no capability: the agent captures them from outside when the runtime's
CNI ADD reaches it (or when a label enrolls a running pod), the node proxy serves them from
inside their namespaces, and pod-to-pod traffic between the nodes is HBONE with each pod's own
identity.
"""

from __future__ import annotations

import hashlib
import secrets

import pytest
from kubernetes import client as k8s

from meshctl.core.k8s import ambient
from tests.harness.cni import mesh_rules
from tests.harness.kube import create_namespace, delete_namespace
from tests.harness.wait import eventually
from tests.kube.ambient_support import (
    APP,
    CLIENT_ID,
    SVC_PORT,
    VIP,
    AmbientKubeNode,
    annotation,
    host_rules,
    identities,
    listening,
    loaded,
    mesh_config,
    opened,
    pod,
    proxy_of,
    refused,
    serves_nothing,
)
from tests.netns.ztunnel_harness import EchoServer, Sniffer, echo_roundtrip

pytestmark = [pytest.mark.kube, pytest.mark.netns]


def test_pods_on_two_nodes_talk_mtls_and_enrollment_follows_labels(
    two_nodes: list[AmbientKubeNode], kube_api, mesh_namespace: str, kube_namespace: str
):
    node0, node1 = two_nodes
    ns = mesh_namespace
    core = k8s.CoreV1Api(kube_api)
    core.create_namespaced_pod(ns, pod("client", sa="client"))
    core.create_namespaced_pod(ns, pod("server", sa="server"))
    opted_out = {"app": "bystander", ambient.DATAPLANE_MODE: ambient.MODE_NONE}
    core.create_namespaced_pod(ns, pod("bystander", labels=opted_out))
    client = node0.run_pod(ns, "client")
    server = node1.run_pod(ns, "server")
    bystander = node0.run_pod(ns, "bystander")

    # CNI ADD returned only once the agent had captured the pod and its node proxy serves it.
    for netns in (client.netns, server.netns):
        assert any("MESH_PRERT" in line for line in mesh_rules(netns.name))
        assert all(listening(netns, p) for p in (15001, 15006, 15008))
    for name in ("client", "server"):
        eventually(f"{name} annotated", lambda n=name: annotation(kube_api, ns, n) == "enabled")
    # The opted-out pod is left alone: no rules, no listeners, no annotation.
    assert mesh_rules(bystander.netns.name) == []
    assert not listening(bystander.netns, 15001)
    assert annotation(kube_api, ns, "bystander") is None
    # Kubelet probes to enrolled pods leave the node from the probe address.
    for node, running in ((node0, client), (node1, server)):
        eventually(
            f"probe SNAT for {running.name}",
            lambda n=node, r=running: any(
                r.ip in line and "169.254.7.127" in line for line in host_rules(n)
            ),
        )

    mesh_config(node0.local_config, ns, client.ip, server.ip)
    eventually("config loaded", lambda: loaded(node0, "client", "server") and loaded(node1))
    echo = EchoServer(server.netns, server.ip, APP)
    try:
        _mtls_between_nodes(node0, node1, client, server, echo, ns)
        _deny_policy_refuses(node0, node1, client, server, echo, ns)
        _opted_out_and_probe(node0, node1, bystander, server, echo)
    finally:
        echo.close()
    _label_flip(node1, kube_api, f"{kube_namespace}-late"[:60])

    # CNI DEL undoes everything: the node keeps no rule for a pod that is gone.
    node0.kubelet.delete_pod(client)
    node1.kubelet.delete_pod(server)
    node0.kubelet.delete_pod(bystander)
    eventually("node rules gone", lambda: host_rules(node0) == [] and host_rules(node1) == [])
    eventually("proxies serve nothing", lambda: serves_nothing(node0, node1))


def _mtls_between_nodes(node0, node1, client, server, echo, ns: str) -> None:
    canary = b"AMBIENT-KUBE-" + secrets.token_hex(6).encode()
    payload = canary * 10_000
    link = Sniffer(node0.ns, "node0")
    for addr in ((server.ip, APP), (VIP, SVC_PORT)):
        reply = echo_roundtrip(client.netns, addr, payload)
        assert reply == hashlib.sha256(payload).digest() + payload
    segments = link.stop()
    between = [s for s in segments if {s.src[0], s.dst[0]} == {client.ip, server.ip}]
    assert between, "the pods' traffic crossed the node link"
    assert {s.dst[1] for s in between if s.src[0] == client.ip} == {15008}
    assert canary not in b"".join(s.payload for s in segments)
    up = b"".join(s.payload for s in between if s.dst[1] == 15008)
    assert up[:1] == b"\x16"  # TLS handshake, then records
    assert b"\x17\x03\x03" in up
    assert {p[0] for p in echo.peers} == {client.ip}  # delivered from the client's address
    ids = identities(ns)
    assert (opened(node0, "source", ids), opened(node1, "destination", ids)) == (2, 2)
    for node in (node0, node1):
        log = proxy_of(node).log_text(None)
        assert f"src.identity={ids['source_principal']}" in log
        assert f"dst.identity={ids['destination_principal']}" in log


def _deny_policy_refuses(node0, node1, client, server, echo, ns: str) -> None:
    deny = {
        "name": "deny-client",
        "namespace": ns,
        "scope": "Namespace",
        "action": "Deny",
        "rules": [[[{"principals": [CLIENT_ID.format(ns=ns).removeprefix("spiffe://")]}]]],
    }
    mesh_config(node0.local_config, ns, client.ip, server.ip, policies=[deny])
    eventually("policy loaded", lambda: bool(proxy_of(node1).config_dump()["policies"]))
    seen = len(echo.peers)
    assert refused(client.netns, (server.ip, APP))
    assert len(echo.peers) == seen
    mesh_config(node0.local_config, ns, client.ip, server.ip)
    eventually("policy gone", lambda: not proxy_of(node1).config_dump()["policies"])


def _opted_out_and_probe(node0, node1, bystander, server, echo) -> None:
    # The opted-out pod's own traffic is not captured (no outbound flow on its node), and it
    # reaches the enrolled server as a plaintext client through the server pod's 15006.
    assert echo_roundtrip(bystander.netns, (server.ip, APP), b"plain")[32:] == b"plain"
    assert f"src.addr={bystander.ip}:" not in proxy_of(node0).log_text(None)
    eventually(
        "inbound plaintext flow logged",
        lambda: f"src.addr={bystander.ip}:" in proxy_of(node1).log_text(None),
    )
    # A kubelet probe (from the node itself) reaches the app directly, as 169.254.7.127.
    assert echo_roundtrip(node1.ns, (server.ip, APP), b"probe")[32:] == b"probe"
    assert echo.peers[-1][0] == "169.254.7.127"


def _label_flip(node1: AmbientKubeNode, kube_api, other: str) -> None:
    """A running pod enrolled by a namespace label, and taken out by its own ``none``."""
    core = k8s.CoreV1Api(kube_api)
    create_namespace(kube_api, other)
    try:
        core.create_namespaced_pod(other, pod("late"))
        late = node1.run_pod(other, "late")
        assert mesh_rules(late.netns.name) == []
        enroll = {"metadata": {"labels": {ambient.DATAPLANE_MODE: ambient.MODE_AMBIENT}}}
        core.patch_namespace(other, enroll)
        eventually("late enrolled", lambda: annotation(kube_api, other, "late") == "enabled", 15)
        assert any("MESH_PRERT" in line for line in mesh_rules(late.netns.name))
        assert listening(late.netns, 15008)
        eventually("its probe SNAT", lambda: any(late.ip in line for line in host_rules(node1)))
        opt_out = {"metadata": {"labels": {ambient.DATAPLANE_MODE: ambient.MODE_NONE}}}
        core.patch_namespaced_pod("late", other, opt_out)
        eventually("late removed", lambda: annotation(kube_api, other, "late") is None, 15)
        eventually("its rules removed", lambda: mesh_rules(late.netns.name) == [])
        assert not listening(late.netns, 15008)
        assert "lookup 100" not in late.netns.run(["ip", "rule", "list"]).stdout
        eventually("no probe SNAT", lambda: not any(late.ip in ln for ln in host_rules(node1)))
        node1.kubelet.delete_pod(late)
    finally:
        delete_namespace(kube_api, other)
