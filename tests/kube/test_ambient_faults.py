"""Ambient mode under faults, on two nodes with the real chain and the real kube-apiserver.

The node proxy killed during transfers (pods keep their capture, nothing leaks in plaintext,
new connections succeed soon after its restart), the node agent killed (a new pod's ADD fails
closed, running pods carry on; a new agent resumes from its records), and the API server
unreachable from a node (running pods carry on; a new pod fails closed).
"""

from __future__ import annotations

import threading
import time

import pytest
from kubernetes import client as k8s

from tests.harness.cni import mesh_rules
from tests.harness.kube import CniError
from tests.harness.wait import eventually
from tests.kube.ambient_support import (
    APP,
    AmbientKubeNode,
    annotation,
    mesh_config,
    pod,
    proxy_of,
    refused,
)
from tests.netns.ztunnel_harness import EchoServer, echo_roundtrip

pytestmark = [pytest.mark.kube, pytest.mark.netns]


class Transfer(threading.Thread):
    """A slow upload through the mesh; ``error`` says how it ended (None: it finished)."""

    def __init__(self, netns, addr, chunks: int = 40, pause: float = 0.05) -> None:
        super().__init__(daemon=True)
        self.netns, self.addr, self.chunks, self.pause = netns, addr, chunks, pause
        self.error: str | None = "not started"
        self.start()

    def run(self) -> None:
        try:
            with self.netns.socket() as s:
                s.settimeout(10)
                s.connect(self.addr)
                s.sendall(b"E")
                for _ in range(self.chunks):
                    s.sendall(b"x" * 4096)
                    time.sleep(self.pause)
                s.shutdown(1)
                reply = b""
                while chunk := s.recv(65536):
                    reply += chunk
            self.error = None if len(reply) == 32 + 4096 * self.chunks else f"short: {len(reply)}"
        except OSError as exc:
            self.error = str(exc)


def works(netns, addr) -> bool:
    try:
        return echo_roundtrip(netns, addr, b"ok?", timeout=3)[32:] == b"ok?"
    except OSError:
        return False


def test_node_proxy_agent_and_api_server_faults(
    two_nodes: list[AmbientKubeNode], kube_api, mesh_namespace: str
):
    node0, node1 = two_nodes
    ns = mesh_namespace
    core = k8s.CoreV1Api(kube_api)
    core.create_namespaced_pod(ns, pod("client", sa="client"))
    core.create_namespaced_pod(ns, pod("server", sa="server"))
    client = node0.run_pod(ns, "client")
    server = node1.run_pod(ns, "server")
    mesh_config(node0.local_config, ns, client.ip, server.ip)
    eventually("config", lambda: len(proxy_of(node1).config_dump()["workloads"]) == 2)
    addr = (server.ip, APP)
    echo = EchoServer(server.netns, server.ip, APP)
    try:
        assert works(client.netns, addr)
        _proxy_killed(node1, client, server, echo, addr)
        _agent_killed(node0, kube_api, ns, client, addr)
        _api_server_unreachable(node0, kube_api, ns, client, addr)
    finally:
        echo.close()


def _proxy_killed(node1, client, server, echo, addr) -> None:
    """The server's node proxy dies in the middle of transfers."""
    transfers = [Transfer(client.netns, addr) for _ in range(3)]
    time.sleep(0.5)
    proxy_of(node1).kill()
    for t in transfers:
        t.join(20)
    assert any(t.error for t in transfers)  # what it carried is lost
    seen = len(echo.peers)
    assert refused(client.netns, addr)  # capture stays: refused, never around the mesh
    assert len(echo.peers) == seen
    assert any("MESH_PRERT" in line for line in mesh_rules(server.netns.name))
    started = time.monotonic()
    node1.start_proxy(wait=False)
    proxy_of(node1).wait_ready(30)  # the agent gave the new proxy its snapshot by itself
    ready = time.monotonic()
    eventually("new connections succeed", lambda: works(client.netns, addr), 10)
    took = time.monotonic() - ready
    print(f"proxy restart: ready after {ready - started:.2f}s, serving {took:.2f}s later")
    assert took < 2


def _agent_killed(node0, kube_api, ns, client, addr) -> None:
    """The client's node agent dies: running pods carry on, a new pod fails closed; a new agent
    resumes from its records and new pods start again."""
    core = k8s.CoreV1Api(kube_api)
    node0.kill_agent()
    assert works(client.netns, addr)
    core.create_namespaced_pod(ns, pod("newcomer"))
    with pytest.raises(CniError, match="fail closed"):
        node0.run_pod(ns, "newcomer")
    node0.start_agent()
    node0.read_conflist()
    core.create_namespaced_pod(ns, pod("second"))
    eventually("proxy back with the new agent", lambda: _ready(node0), 20)
    node0.run_pod(ns, "second")
    eventually("second annotated", lambda: annotation(kube_api, ns, "second") == "enabled")
    assert annotation(kube_api, ns, "client") == "enabled"
    assert works(client.netns, addr)


def _api_server_unreachable(node0, kube_api, ns, client, addr) -> None:
    """The API server becomes unreachable from the client's node."""
    forwarder = node0.kubelet.api_forwarder
    assert forwarder is not None
    forwarder.close()
    end = time.monotonic() + 3
    while time.monotonic() < end:
        assert works(client.netns, addr)
        time.sleep(0.3)
    k8s.CoreV1Api(kube_api).create_namespaced_pod(ns, pod("offline"))
    with pytest.raises(CniError, match="fail closed"):
        node0.run_pod(ns, "offline")


def _ready(node: AmbientKubeNode) -> bool:
    from tests.netns.ztunnel_harness import http_get

    try:
        return http_get(node.ns, 15021, "/healthz/ready", timeout=1)[0] == 200
    except OSError:
        return False
