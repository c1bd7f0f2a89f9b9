"""Ambient nodes for the kube tests: a kubelet stand-in per node, each with its own node agent
(``meshctl cni install --ambient``) and node proxy (``meshctl ztunnel run --mode node``), the
node's CNI config seeded from the CNI spec's ``dbnet`` list and merged by the installer, and a
link between the nodes' namespaces that carries their pods' traffic (the "node network").

Everything runs inside the test's namespaces and temp dirs; the agents talk to the real
kube-apiserver with a service-account token bound by the manifest's own RBAC.
"""

from __future__ import annotations

import contextlib
import http.client
import json
import os
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from meshctl_plugins.cni.manifest import CniValues, objects

from meshctl.core.k8s import ambient
from meshctl.core.k8s.cni import netconf
from meshctl.core.k8s.install.components import standalone
from tests.harness.cni import mesh_rules
from tests.harness.kube import (
    SA_ISSUER,
    CniError,
    KubeCluster,
    Kubelet,
    RunningPod,
    request_token,
)
from tests.harness.netns import Netns, veth_pair
from tests.netns.ambient_harness import NodeProxy, write_ca_dir
from tests.netns.ztunnel_harness import (
    Ca,
    echo_roundtrip,
    http_get,
    metric_sum,
    workload,
    write_local_config,
)

SA_NAME = "meshctl-cni-node"
SEED = Path(__file__).parents[1] / "golden" / "cni" / "testdata" / "dbnet.conflist"
AGENT_PORT = 8000  # each node's readiness, inside its own namespace


def seed_conflist(kubelet: Kubelet) -> dict[str, Any]:
    """The CNI spec's ``dbnet`` example (bridge + tuning) on this node's subnet and stores."""
    conf = json.loads(SEED.read_text())
    bridge = conf["plugins"][0]
    bridge["bridge"] = kubelet.bridge
    bridge["isGateway"] = True
    bridge["ipam"] = {
        "type": "host-local",
        "subnet": str(kubelet.subnet),
        "gateway": kubelet.gateway,
        "routes": [{"dst": "0.0.0.0/0"}],
        "dataDir": str(kubelet.ipam_dir),
    }
    bridge["dns"] = {"nameservers": [kubelet.gateway]}
    conf["name"] = kubelet.network_name  # the stand-in keys its result cache by it
    return conf


@contextlib.contextmanager
def agent_rbac(api: k8s.ApiClient, namespace: str, *, ambient: bool = True) -> Iterator[None]:
    """The manifest's ClusterRole/Binding for the node agent's SA (``ambient``: with the
    ambient agent's permissions); unique names, as they are cluster-scoped."""
    rendered = objects(standalone(namespace, None), CniValues(ambient=ambient))
    by_kind = {o["kind"]: o for o in rendered}
    role, binding = by_kind["ClusterRole"], by_kind["ClusterRoleBinding"]
    name = f"{SA_NAME}-{secrets.token_hex(3)}"
    role["metadata"]["name"] = binding["metadata"]["name"] = binding["roleRef"]["name"] = name
    rbac = k8s.RbacAuthorizationV1Api(api)
    rbac.create_cluster_role(role)
    rbac.create_cluster_role_binding(binding)
    try:
        yield
    finally:
        rbac.delete_cluster_role_binding(name)
        rbac.delete_cluster_role(name)


@dataclass
class AmbientKubeNode:
    kubelet: Kubelet
    dir: Path
    sa_dir: Path
    kubeconfig: Path
    cluster: KubeCluster
    local_config: Path
    ca_dir: Path
    agent: subprocess.Popen[bytes] | None = None
    proxy: NodeProxy | None = None
    conflist: dict[str, Any] = field(default_factory=dict)
    _agent_log: Any = None

    @property
    def ns(self) -> Netns:
        return self.kubelet.node

    @property
    def socket(self) -> Path:
        return self.dir / "ztunnel" / "ztunnel.sock"

    @property
    def agent_log(self) -> Path:
        return self.dir / "agent.log"

    def start_agent(self, *, wait: bool = True, env: dict[str, str] | None = None) -> None:
        argv = [
            sys.executable, "-m", "meshctl", "--log-level", "info",
            "--kubeconfig", str(self.kubeconfig),
            "cni", "install", "--ambient",
            "--node-name", self.kubelet.node_name,
            "--ztunnel-socket", str(self.socket),
            "--cni-bin-dir", str(self.dir / "bin"), "--cni-conf-dir", str(self.dir / "net.d"),
            "--run-dir", str(self.dir / "run"), "--service-account-dir", str(self.sa_dir),
            "--kube-server", self.cluster.server, "--exclude-namespaces", "kube-system",
            "--readiness-address", f"127.0.0.1:{AGENT_PORT}", "--poll-interval", "0.2",
        ]  # fmt: skip
        self._agent_log = self.agent_log.open("ab")
        self.agent = self.ns.popen(
            argv,
            stdout=self._agent_log,
            stderr=subprocess.STDOUT,
            env={**os.environ, **(env or {})},
        )
        if wait:
            self.wait_agent_ready()

    def read_conflist(self) -> None:
        """What the runtime would read now: the seed with our entry merged in."""
        self.conflist = json.loads((self.dir / "net.d" / "10-dbnet.conflist").read_text())

    def agent_ready(self) -> int:
        try:
            return http_get(self.ns, AGENT_PORT, "/readyz", timeout=2)[0]
        except (OSError, http.client.HTTPException, ValueError, IndexError):
            return 0

    def wait_agent_ready(self, timeout: float = 60) -> None:
        deadline = time.monotonic() + timeout
        while self.agent_ready() != 200:
            if self.agent is None or self.agent.poll() is not None or time.monotonic() > deadline:
                pytest.fail(f"node agent never became ready:\n{self.agent_log.read_text()[-4000:]}")
            time.sleep(0.1)

    def kill_agent(self) -> None:
        assert self.agent is not None
        self.agent.kill()
        self.agent.wait(10)

    def stop_agent(self) -> int:
        if self.agent is None:
            return 0
        if self.agent.poll() is None:
            self.agent.send_signal(signal.SIGTERM)
            self.agent.wait(30)
        if self._agent_log is not None:
            self._agent_log.close()
        return self.agent.returncode

    def start_proxy(
        self,
        *,
        wait: bool = True,
        extra: tuple[str, ...] = (),
        env: dict[str, str] | None = None,
        discovery: bool = False,
    ) -> NodeProxy:
        self.proxy = NodeProxy(
            self.ns,
            "",
            self.dir,
            None if discovery else self.local_config,
            log_path=self.dir / "proxy.log",
            group=None,
            extra=extra,
            env=env or {},
            socket_path=self.socket,
            ca_dir=self.ca_dir,
        )
        self.proxy.start(wait_ready=wait)
        return self.proxy

    def run_pod(self, namespace: str, name: str) -> RunningPod:
        return self.kubelet.run_pod(
            namespace, name, conflist=self.conflist, cni_path=[self.dir / "bin"]
        )

    def log(self) -> str:
        return self.agent_log.read_text(errors="replace")


def link_nodes(a: AmbientKubeNode, b: AmbientKubeNode) -> tuple[str, str]:
    """A veth between the two node namespaces, routes to each other's pod subnet; returns the
    node-side interface names (both ``node0``)."""
    net = f"10.251.{secrets.randbelow(250)}"
    veth_pair(
        a.ns, b.ns, a_addr=f"{net}.1/30", b_addr=f"{net}.2/30", a_name="node0", b_name="node0"
    )
    a.ns.run(["ip", "route", "add", str(b.kubelet.subnet), "via", f"{net}.2"])
    b.ns.run(["ip", "route", "add", str(a.kubelet.subnet), "via", f"{net}.1"])
    for node in (a, b):
        node.ns.run(["sysctl", "-qw", "net.ipv4.ip_forward=1"])
    return "node0", "node0"


def prepare_nodes(
    cluster: KubeCluster, kubelets: list[Kubelet], tmp: Path, agent_namespace: str
) -> list[AmbientKubeNode]:
    """Per node: its dirs and the seed conflist; shared: a development CA for the proxies, an
    empty local config, the agents' token and kubeconfig (RBAC from ``agent_rbac``)."""
    ca = Ca.create(tmp / "certs")
    ca_dir = write_ca_dir(ca, tmp / "ca")
    local_config = write_local_config(tmp / "local.yaml", workloads=[], services=[], policies=[])
    sa_dir = tmp / "sa"
    sa_dir.mkdir()
    (sa_dir / "ca.crt").write_bytes(cluster.ca_pem)
    token = request_token(cluster, agent_namespace, SA_NAME, SA_ISSUER)
    (sa_dir / "token").write_text(token)
    kubeconfig = tmp / "agent-kubeconfig"
    kubeconfig.write_bytes(netconf.kubeconfig(cluster.server, token, cluster.ca_pem))
    nodes = []
    for i, kubelet in enumerate(kubelets):
        folder = tmp / f"node{i}"
        (folder / "net.d").mkdir(parents=True)
        (folder / "net.d" / "10-dbnet.conflist").write_text(
            json.dumps(seed_conflist(kubelet), indent=2) + "\n"
        )
        nodes.append(
            AmbientKubeNode(kubelet, folder, sa_dir, kubeconfig, cluster, local_config, ca_dir)
        )
    return nodes


@contextlib.contextmanager
def ambient_nodes(
    cluster: KubeCluster, kubelets: list[Kubelet], tmp: Path, agent_namespace: str, api: Any
) -> Iterator[list[AmbientKubeNode]]:
    """Agents (with the manifest's RBAC) and proxies on every kubelet, the nodes linked."""
    with agent_rbac(api, agent_namespace):
        nodes = prepare_nodes(cluster, kubelets, tmp, agent_namespace)
        if len(nodes) == 2:
            link_nodes(nodes[0], nodes[1])
        try:
            for node in nodes:
                node.start_agent(wait=False)
            for node in nodes:
                node.wait_agent_ready()
                node.read_conflist()
                node.start_proxy()
            yield nodes
        finally:
            for node in nodes:  # sandboxes first: their CNI DEL needs the installed plugin
                with contextlib.suppress(CniError):
                    node.kubelet.close()
            for node in nodes:
                if node.proxy is not None:
                    node.proxy.stop()
            for node in nodes:
                node.stop_agent()


# -- what the ambient tests share ------------------------------------------------------------

APP = 8080
SVC_PORT = 80
VIP = "10.0.0.77"  # inside the API server's service range, routed nowhere
SVC_HOST = "echo.shop.svc.cluster.local"
CLIENT_ID = "spiffe://cluster.local/ns/{ns}/sa/client"
SERVER_ID = "spiffe://cluster.local/ns/{ns}/sa/server"


def pod(name: str, *, sa: str = "default", labels: dict | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {
            "serviceAccountName": sa,
            "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
        },
    }


def annotation(api, ns: str, name: str) -> str | None:
    stored = k8s.CoreV1Api(api).read_namespaced_pod(name, ns)
    return (stored.metadata.annotations or {}).get(ambient.REDIRECTION)


def listening(netns, port: int) -> bool:
    return bool(netns.run(["ss", "-Hltn", f"sport = :{port}"]).stdout.strip())


def host_rules(node: AmbientKubeNode) -> list[str]:
    return mesh_rules(node.ns.name)


def mesh_config(path, ns: str, client_ip: str, server_ip: str, policies: list | None = None):
    client = workload("client", ns, client_ip, sa="client")
    services = {f"{ns}/{SVC_HOST}": {SVC_PORT: APP}}
    server = workload("server", ns, server_ip, sa="server", services=services)
    service = {
        "name": "echo",
        "namespace": ns,
        "hostname": SVC_HOST,
        "vips": [f"/{VIP}"],
        "ports": {SVC_PORT: APP},
    }
    write_local_config(
        path, workloads=[client, server], services=[service], policies=policies or []
    )


def loaded(node: AmbientKubeNode, *names: str) -> bool:
    have = {w["name"] for w in proxy_of(node).config_dump()["workloads"]}
    return set(names) <= have


def proxy_of(node: AmbientKubeNode) -> NodeProxy:
    assert node.proxy is not None
    return node.proxy


def serves_nothing(*nodes: AmbientKubeNode) -> bool:
    return not any(proxy_of(n).config_dump()["workloadState"] for n in nodes)


def refused(netns, addr) -> bool:
    try:
        reply = echo_roundtrip(netns, addr, b"x" * 100, timeout=5)
    except OSError:
        return True
    return reply == b""


def opened(node: AmbientKubeNode, reporter: str, ids: dict[str, str]) -> float:
    text = proxy_of(node).metrics()
    return metric_sum(text, "istio_tcp_connections_opened_total", reporter=reporter, **ids)


def identities(ns: str) -> dict[str, str]:
    return {
        "source_principal": CLIENT_ID.format(ns=ns),
        "destination_principal": SERVER_ID.format(ns=ns),
    }
