"""A second real node beside the session's node: its own kubelet, containerd and kube-proxy.

Owns: node 2's network namespace and mount namespace, the link between the nodes, its pod
network, its identities (from node 1's CAs) and configs, starting and stopping its components,
and everything of it going away again (node 1's host state stays node 1's: tests/harness/node.py,
nodehost.py).

Design. Node 1 is the host (the root netns, bridge ``mtnode0``, 10.250.0.0/24). Node 2 lives in
a network namespace and a mount namespace of its own, held by one idle process; containerd,
kubelet and kube-proxy of node 2 enter both (``nsenter``), so:
- its node address ``10.250.1.1`` sits on its own bridge ``mtnode2`` (pods 10.250.1.0/24), and
  the only way in or out is the veth ``mtnode2h`` (host, 10.250.2.1/30) -- ``mtlink0`` (node 2,
  10.250.2.2/30): every packet between the nodes crosses ``mtnode2h``, where a test captures.
  The host routes 10.250.1.0/24 over it; node 2 routes everything to the host, whose forwarding
  guard accepts only mtnode0 <-> mtnode2h besides bridge <-> bridge (nothing leaves the machine).
- the host-global paths kubelet, containerd, CNI and the mesh's DaemonSets use are node 2's own
  in its mount namespace: a tmpfs on /run (containerd's shim sockets, the CNI agent's and node
  proxy's run dirs, the xtables lock), and bind mounts of private directories on /etc/cni/net.d,
  /opt/cni/bin, /var/lib/cni, /var/lib/kubelet, /var/log/containers and /var/log/pods. A pod's
  hostPath is resolved by runc in that mount namespace, so the mesh's CNI DaemonSet on node 2
  installs into node 2's conflist with the very manifest that works on node 1.
- containerd's directory is node 1's path with node 2's directory bound over it in node 2's
  mount namespace: the pinned pod netns files (``components.cni.netnsDir``) have the same path
  on both nodes, so one install value fits both.
- the mount namespace starts as a slave of the host's (node 1's later mounts reach it, its own
  never reach the host) and is then made shared inside, as a systemd host's is (kubelet's mount
  propagation, the agent's HostToContainer netns dir).
Invariants: node 2 exists only between ``start`` and ``stop``; its processes are exactly those in
its namespaces or its cgroup; when it stops, its Node object, pods, link, guard rules, cgroups
and directories are gone (a killed run: node 1's next start kills it by its work dir marker and
deletes the link recorded in the state file).
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from tests.harness import nodehost
from tests.harness.kube import _Child, free_port
from tests.harness.node import (
    CONFLIST_NAME,
    NodeStartError,
    TestNode,
    _archive_tags,
    _failure,
    _Start,
    _wait,
    containerd_config,
    kube_proxy_config,
    kubelet_config,
    node_conflist,
)

NODE2_NAME = "meshctl-test-node-2"
NODE2_NETWORK = ipaddress.IPv4Network("10.250.1.0/24")
NODE2_IP = str(NODE2_NETWORK.network_address + 1)
NODE2_BRIDGE = "mtnode2"
LINK_HOST = "mtnode2h"  # the host's end of the link between the nodes: capture here
LINK_NODE = "mtlink0"
LINK_NETWORK = ipaddress.IPv4Network("10.250.2.0/30")
LINK_HOST_IP = str(LINK_NETWORK.network_address + 1)
LINK_NODE_IP = str(LINK_NETWORK.network_address + 2)
# Both nodes' pods: kube-proxy masquerades Service traffic only from outside of it.
CLUSTER_NETWORK = "10.250.0.0/23"
WORKDIR2 = nodehost.WORKDIR / "node2"
CGROUP_PARENT = f"{nodehost.CGROUP_ROOT}/node2"  # kubelet's cgroupRoot (below node 1's root)
GUARD_COMMENT = "meshctl-test-node-2"
# Host path -> node 2's directory, bound in node 2's mount namespace (/run gets a tmpfs).
PRIVATE_PATHS = (
    "/etc/cni/net.d",
    "/opt/cni/bin",
    "/var/lib/cni",
    "/var/lib/kubelet",
    "/var/log/containers",
    "/var/log/pods",
)


def private_dir(host_path: str) -> Path:
    return WORKDIR2 / "host" / host_path.strip("/").replace("/", "-")


def node2_conflist() -> dict[str, Any]:
    """Node 1's network shape on node 2's bridge and range."""
    conflist = node_conflist()
    bridge = conflist["plugins"][0]
    bridge["bridge"] = NODE2_BRIDGE
    bridge["ipam"].update(
        subnet=str(NODE2_NETWORK),
        gateway=NODE2_IP,
        rangeStart=str(NODE2_NETWORK.network_address + 16),
        dataDir=str(WORKDIR2 / "cni-ipam"),
    )
    return conflist


@dataclass(frozen=True, slots=True)
class Namespaces:
    """Node 2's holder process and the identities of its namespaces (inode numbers)."""

    pid: int
    mnt: int
    net: int

    @classmethod
    def of(cls, pid: int) -> Namespaces:
        return cls(pid, _ns_inode(pid, "mnt"), _ns_inode(pid, "net"))

    def enter(self) -> list[str]:
        return ["nsenter", "-t", str(self.pid), "-m", "-n", "--"]


def _ns_inode(pid: int | str, kind: str) -> int:
    return Path(f"/proc/{pid}/ns/{kind}").stat().st_ino


def _sh(argv: list[str], stdin: str | None = None) -> None:
    done = subprocess.run(
        argv, capture_output=True, text=True, input=stdin, timeout=60, check=False
    )
    if done.returncode != 0:
        raise NodeStartError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")


class SecondNode:
    """Node 2: ``start()`` beside a running ``TestNode``, ``stop()`` before it stops."""

    def __init__(self, node: TestNode) -> None:
        self.node = node
        self.children: list[_Child] = []
        self.ns: Namespaces | None = None
        self.start_seconds = 0.0

    @property
    def name(self) -> str:
        return NODE2_NAME

    @property
    def ip(self) -> str:
        return NODE2_IP

    @property
    def containerd_socket(self) -> Path:
        return WORKDIR2 / "containerd" / "containerd.sock"

    def child(self, name: str, argv: list[str]) -> _Child:
        logs = WORKDIR2 / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        proc = _Child(name, argv, logs / f"{name}.log")
        self.children.append(proc)
        return proc

    def start(self) -> SecondNode:
        cluster = self.node.cluster
        first = self.node.started
        started = time.monotonic()  # node 1 is up: what follows is node 2's own cost
        self.node.before_stop.append(self.stop)
        try:
            self._namespaces()
            self._link()
            pki = self._identities(first)
            socket = self._containerd()
            self._kubelet(pki, socket)
            proxy_healthz = self._kube_proxy(first)
            with cluster.api_client() as api:
                core = k8s.CoreV1Api(api)
                _wait("node 2 to be Ready", lambda: _ready(core), 120, self.children, "kubelet-2")
            _wait(
                "node 2's kube-proxy healthz",
                lambda: _healthz_at(NODE2_IP, proxy_healthz),
                60,
                self.children,
                "kube-proxy-2",
            )
        except BaseException:
            self.stop()
            raise
        self.start_seconds = time.monotonic() - started
        return self

    def _namespaces(self) -> None:
        for hierarchy in nodehost.hierarchies():
            (hierarchy / CGROUP_PARENT).mkdir(parents=True, exist_ok=True)
        WORKDIR2.mkdir(parents=True)
        for host_path in PRIVATE_PATHS:
            private_dir(host_path).mkdir(parents=True)
            # The mount point: node 1's cleanup removes it when the host did not have it.
            Path(host_path).mkdir(parents=True, exist_ok=True)
        for sub in ("containerd", "kubelet", "pod-logs", "cni-ipam", "pki"):
            (WORKDIR2 / sub).mkdir()
        # The holder names the work dir: a killed run's cleanup finds it by that marker.
        holder = self.child(
            "namespaces",
            ["unshare", "--mount", "--net", "--propagation", "slave", "--",
             "python3", "-c", "import signal; signal.pause()", str(WORKDIR2)],
        )  # fmt: skip
        mine = _ns_inode("self", "net")

        def unshared() -> bool:
            return _ns_inode(holder.proc.pid, "net") != mine

        _wait("node 2's namespaces", unshared, 10, self.children, holder.name)
        self.ns = Namespaces.of(holder.proc.pid)
        binds = [(private_dir(p), Path(p)) for p in PRIVATE_PATHS]
        binds.append((WORKDIR2 / "containerd", nodehost.WORKDIR / "containerd"))
        script = "\n".join(
            [
                "set -e",
                "mount --make-rshared /",
                "mount -t tmpfs -o mode=0755 meshctl-node2-run /run",
                *(f"mount --bind '{src}' '{dst}'" for src, dst in binds),
                "ip link set lo up",
                f"ip link add {NODE2_BRIDGE} type bridge",
                f"ip addr add {NODE2_IP}/{NODE2_NETWORK.prefixlen} dev {NODE2_BRIDGE}",
                f"ip link set {NODE2_BRIDGE} up",
                # Node 2's own forwarding (per netns): its only way out is the guarded host.
                "echo 1 > /proc/sys/net/ipv4/ip_forward",
            ]
        )
        _sh([*self.ns.enter(), "sh", "-c", script])
        (private_dir("/etc/cni/net.d") / CONFLIST_NAME).write_text(
            json.dumps(node2_conflist(), indent=2) + "\n"
        )

    def _link(self) -> None:
        assert self.ns is not None
        state = nodehost.read_state() or {}
        state["extra_links"] = [LINK_HOST]
        nodehost.write_state(state)
        _sh(["ip", "link", "add", LINK_HOST, "type", "veth", "peer", "name", LINK_NODE,
             "netns", str(self.ns.pid)])  # fmt: skip
        _sh(["ip", "addr", "add", f"{LINK_HOST_IP}/{LINK_NETWORK.prefixlen}", "dev", LINK_HOST])
        _sh(["ip", "link", "set", LINK_HOST, "up"])
        _sh(["ip", "route", "add", str(NODE2_NETWORK), "via", LINK_NODE_IP, "dev", LINK_HOST])
        inside = "\n".join(
            [
                "set -e",
                f"ip addr add {LINK_NODE_IP}/{LINK_NETWORK.prefixlen} dev {LINK_NODE}",
                f"ip link set {LINK_NODE} up",
                f"ip route add default via {LINK_HOST_IP} dev {LINK_NODE}",
            ]
        )
        _sh([*self.ns.enter(), "sh", "-c", inside])
        # Pods of node 1 <-> the link, both ways; the chain's drop policy stays for the rest.
        rules = "".join(
            f'add rule inet {nodehost.GUARD_TABLE} forward iifname "{a}" oifname "{b}" accept '
            f'comment "{GUARD_COMMENT}"\n'
            for a, b in ((nodehost.BRIDGE, LINK_HOST), (LINK_HOST, nodehost.BRIDGE))
        )
        _sh(["nft", "-f", "-"], stdin=rules)

    def _identities(self, first: _Start) -> Path:
        assert first.server_ca is not None
        assert first.client_ca is not None
        pki = WORKDIR2 / "pki"
        (pki / "client-ca.crt").write_bytes(first.client_ca.cert_pem)
        first.server_ca.issue(
            NODE2_NAME, server=True, ip_sans=[NODE2_IP], dns_sans=[NODE2_NAME]
        ).write(pki, "kubelet-serving")
        _Start._kubeconfig(
            self.node.cluster.control_plane,
            first.client_ca,
            pki,
            "kubelet",
            f"system:node:{NODE2_NAME}",
            ("system:nodes",),
        )
        return pki

    def _containerd(self) -> Path:
        assert self.ns is not None
        # Node 1's paths: in node 2's mount namespace they are node 2's directory.
        config = WORKDIR2 / "containerd" / "config.toml"
        archives = {r: a for r, a in self.node.archives.items() if r in self.node.cluster.images}
        sandbox = _archive_tags(archives["pause"])[0]
        config.write_text(containerd_config(nodehost.WORKDIR, self.node.binaries.runc, sandbox))
        containerd = self.child(
            "containerd-2",
            [*self.ns.enter(), str(self.node.binaries.containerd("containerd")),
             "--config", str(nodehost.WORKDIR / "containerd" / "config.toml")],
        )  # fmt: skip
        ctr = [str(self.node.binaries.containerd("ctr")), "--address", str(self.containerd_socket)]

        def serving() -> bool:
            probe = subprocess.run([*ctr, "version"], capture_output=True, timeout=10, check=False)
            return probe.returncode == 0

        _wait("node 2's containerd", serving, 60, self.children, containerd.name)
        for archive in sorted(set(archives.values())):
            done = subprocess.run(
                [*ctr, "-n", "k8s.io", "images", "import", str(archive)],
                capture_output=True, text=True, timeout=300, check=False,
            )  # fmt: skip
            if done.returncode != 0:
                raise _failure(f"node 2: ctr images import {archive}: {done.stderr.strip()}",
                               self.children, containerd.name)  # fmt: skip
        return nodehost.WORKDIR / "containerd" / "containerd.sock"  # its path inside node 2

    def _kubelet(self, pki: Path, socket: Path) -> None:
        assert self.ns is not None
        config = kubelet_config(pki, socket, free_port(), WORKDIR2)
        config.update(
            address=NODE2_IP,
            cgroupRoot=f"/{CGROUP_PARENT}",
            # The node's resolver (dnsmasq on node 1's address): reached over the link.
            resolvConf=str(nodehost.WORKDIR / "resolv.conf"),
        )
        path = WORKDIR2 / "kubelet.yaml"
        path.write_text(yaml.safe_dump(config))
        self.child(
            "kubelet-2",
            [*self.ns.enter(), str(self.node.binaries.k8s("kubelet")),
             f"--config={path}", f"--kubeconfig={pki / 'kubelet.kubeconfig'}",
             f"--root-dir={WORKDIR2 / 'kubelet'}", f"--hostname-override={NODE2_NAME}",
             f"--node-ip={NODE2_IP}", "--v=1"],
        )  # fmt: skip

    def _kube_proxy(self, first: _Start) -> int:
        assert self.ns is not None
        healthz = free_port()
        config = kube_proxy_config(first.kubeconfigs["kube-proxy"], free_port(), healthz)
        config.update(
            hostnameOverride=NODE2_NAME,
            bindAddress=NODE2_IP,
            clusterCIDR=CLUSTER_NETWORK,
            nodePortAddresses=[f"{NODE2_IP}/32"],
            healthzBindAddress=f"{NODE2_IP}:{healthz}",  # reached from the host over the link
        )
        path = WORKDIR2 / "kube-proxy.yaml"
        path.write_text(yaml.safe_dump(config))
        self.child(
            "kube-proxy-2",
            [*self.ns.enter(), str(self.node.binaries.k8s("kube-proxy")), f"--config={path}"],
        )
        return healthz

    # -----------------------------------------------------------------------------------------

    def _pids(self) -> set[int]:
        """Node 2's processes: in its namespaces (components, shims, host-network pods) or its
        cgroup (every container)."""
        pids: set[int] = set()
        if self.ns is not None:
            for proc in Path("/proc").iterdir():
                if not proc.name.isdigit() or int(proc.name) == os.getpid():
                    continue
                with contextlib.suppress(OSError):
                    if (_ns_inode(proc.name, "mnt") == self.ns.mnt
                            or _ns_inode(proc.name, "net") == self.ns.net):  # fmt: skip
                        pids.add(int(proc.name))
        for hierarchy in nodehost.hierarchies():
            root = hierarchy / CGROUP_PARENT
            if root.is_dir():
                for procs in root.rglob("cgroup.procs"):
                    with contextlib.suppress(OSError, ValueError):
                        pids.update(int(p) for p in procs.read_text().split())
        return pids

    def stop(self) -> None:
        """Everything of node 2 goes: processes (outright, as node 1's), its pods and Node
        object in the API, the link and guard rules, cgroups, directories."""
        with contextlib.suppress(ValueError):
            self.node.before_stop.remove(self.stop)
        for child in reversed(self.children):
            if child.name != "namespaces":
                child.stop(grace=2.0)
        deadline = time.monotonic() + 10
        while pids := self._pids():
            if time.monotonic() > deadline:
                raise RuntimeError(f"node 2's processes still alive after SIGKILL: {sorted(pids)}")
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.1)
        for child in self.children:
            child.stop(grace=0.5)
        self.children.clear()
        self.ns = None
        if self.node.running:
            self._forget()
        subprocess.run(["ip", "link", "del", LINK_HOST], capture_output=True, check=False)
        _delete_guard_rules()
        state = nodehost.read_state()
        if state is not None and state.pop("extra_links", None) is not None:
            nodehost.write_state(state)
        for hierarchy in nodehost.hierarchies():
            root = hierarchy / CGROUP_PARENT
            if root.is_dir():
                for cg in sorted((p for p in root.rglob("*") if p.is_dir()),
                                 key=lambda p: -len(p.parts)):  # fmt: skip
                    nodehost._rmdir_cgroup(cg)
                nodehost._rmdir_cgroup(root)
        nodehost.unmount_all([str(WORKDIR2)])
        shutil.rmtree(WORKDIR2, ignore_errors=True)

    def _forget(self, timeout: float = 30) -> None:
        """Its Node object, then its pods (grace 0: no kubelet confirms them any more). The Node
        goes first: while it exists, the DaemonSet controller replaces a deleted pod there."""
        with self.node.cluster.api_client() as api:
            core = k8s.CoreV1Api(api)
            with contextlib.suppress(ApiException):
                core.delete_node(NODE2_NAME)
            selector = f"spec.nodeName={NODE2_NAME}"
            deadline = time.monotonic() + timeout
            while pods := core.list_pod_for_all_namespaces(field_selector=selector).items:
                if time.monotonic() > deadline:
                    names = [f"{p.metadata.namespace}/{p.metadata.name}" for p in pods]
                    raise RuntimeError(f"pods of node 2 still in the API: {names}")
                for pod in pods:
                    with contextlib.suppress(ApiException):
                        core.delete_namespaced_pod(
                            pod.metadata.name, pod.metadata.namespace, grace_period_seconds=0
                        )
                time.sleep(0.5)


def _delete_guard_rules() -> None:
    listed = subprocess.run(
        ["nft", "-j", "-a", "list", "chain", "inet", nodehost.GUARD_TABLE, "forward"],
        capture_output=True, text=True, check=False, timeout=30,
    )  # fmt: skip
    if listed.returncode != 0:
        return
    for item in json.loads(listed.stdout)["nftables"]:
        rule = item.get("rule")
        if rule and rule.get("comment") == GUARD_COMMENT:
            subprocess.run(
                ["nft", "delete", "rule", "inet", nodehost.GUARD_TABLE, "forward",
                 "handle", str(rule["handle"])],
                capture_output=True, check=False, timeout=30,
            )  # fmt: skip


def _ready(core: k8s.CoreV1Api) -> bool:
    node = core.read_node(NODE2_NAME)
    return any(c.type == "Ready" and c.status == "True" for c in node.status.conditions or [])


def _healthz_at(host: str, port: int) -> bool:
    import http.client

    conn = http.client.HTTPConnection(host, port, timeout=2)
    try:
        conn.request("GET", "/healthz")
        return conn.getresponse().status == 200
    finally:
        conn.close()


# ---------------------------------------------------------------------------------------------
# `python -m tests.harness.node2 --start-then-wait`: a two-node run for the killed-run test


def _main(argv: list[str]) -> int:
    from tests.harness.node import start_then_wait

    return start_then_wait(
        argv,
        "tests.harness.node2",
        lock_timeout=1200,
        more=lambda node: SecondNode(node).start(),
        pod_spec={"nodeName": NODE2_NAME},
    )


if __name__ == "__main__":
    import sys

    sys.exit(_main(sys.argv[1:]))
