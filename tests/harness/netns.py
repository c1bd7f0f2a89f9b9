"""Throwaway network namespaces for tests: single namespaces, veth pairs, a node with pods.

Invariants: every name is unique per test (a random suffix); every link lives inside a namespace
this module created, never on the host; everything is removed at the end even when the test
fails (deleting a namespace deletes its links; processes left inside are killed first).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
import signal
import socket
import subprocess
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pyroute2 import NetNS, netns

NAME_PREFIX = "mt"  # every test namespace is called mt-<role>-<hex>
RUN_DIR = "/run/netns"


def unique_name(role: str) -> str:
    """``mt-<role>-<6 hex>``, short enough for interface names too (IFNAMSIZ is 16)."""
    return f"{NAME_PREFIX}-{role[:5]}-{secrets.token_hex(3)}"


@dataclass(frozen=True, slots=True)
class Netns:
    """A named network namespace (``/run/netns/<name>``) with helpers to work inside it."""

    name: str

    @property
    def path(self) -> str:
        return f"{RUN_DIR}/{self.name}"

    def run(
        self, argv: Sequence[str], *, check: bool = True, timeout: float = 30, **kwargs: Any
    ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside the namespace and wait (text mode, output captured)."""
        return subprocess.run(
            ["ip", "netns", "exec", self.name, *argv],
            check=check,
            timeout=timeout,
            capture_output=True,
            text=True,
            **kwargs,
        )

    def popen(self, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start ``argv`` inside the namespace; the caller owns the process."""
        return subprocess.Popen(["ip", "netns", "exec", self.name, *argv], **kwargs)

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Switch the calling thread into the namespace for the block (sockets made here stay)."""
        netns.pushns(self.name)
        try:
            yield
        finally:
            netns.popns()

    def socket(self, family: int = socket.AF_INET, kind: int = socket.SOCK_STREAM) -> socket.socket:
        """A socket that belongs to this namespace, usable from any thread of this process."""
        with self.entered():
            return socket.socket(family, kind)

    @contextlib.contextmanager
    def ipr(self) -> Iterator[Any]:
        """A pyroute2 rtnetlink handle bound to the namespace."""
        with NetNS(self.name) as handle:
            yield handle

    def link_names(self) -> set[str]:
        with self.ipr() as ipr:
            return {link.get_attr("IFLA_IFNAME") for link in ipr.get_links()}


def create(role: str = "ns") -> Netns:
    """A new namespace with ``lo`` up."""
    ns = Netns(unique_name(role))
    netns.create(ns.name)
    try:
        with ns.ipr() as ipr:
            ipr.link("set", index=ipr.link_lookup(ifname="lo")[0], state="up")
    except Exception:
        destroy(ns)
        raise
    return ns


def destroy(ns: Netns) -> None:
    """Kill whatever still runs inside ``ns`` and delete it; a missing namespace is fine."""
    with contextlib.suppress(OSError, FileNotFoundError):
        for pid in netns.ns_pids().get(ns.name, []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(OSError, FileNotFoundError):
        netns.remove(ns.name)


def exists(name: str) -> bool:
    return name in netns.listnetns()


def host_link_names() -> set[str]:
    """Interface names in the test process's own (host) namespace."""
    return {p.name for p in Path("/sys/class/net").iterdir()}


class NetnsFactory:
    """Creates namespaces on demand and removes all of them on ``close`` (in reverse order)."""

    def __init__(self) -> None:
        self.created: list[Netns] = []

    def __call__(self, role: str = "ns") -> Netns:
        ns = create(role)
        self.created.append(ns)
        return ns

    def close(self) -> None:
        while self.created:
            destroy(self.created.pop())


def veth_pair(
    a: Netns, b: Netns, *, a_addr: str, b_addr: str, a_name: str = "eth0", b_name: str = "eth0"
) -> None:
    """Join ``a`` and ``b`` with a veth pair; addresses are CIDRs like ``10.1.0.1/30``."""
    tmp = f"v{secrets.token_hex(4)}"
    with a.ipr() as ipr:
        ipr.link("add", ifname=a_name, kind="veth", peer={"ifname": tmp, "net_ns_fd": b.name})
    with b.ipr() as ipr:
        idx = ipr.link_lookup(ifname=tmp)[0]
        ipr.link("set", index=idx, ifname=b_name)
    for ns, name, addr in ((a, a_name, a_addr), (b, b_name, b_addr)):
        _address_up(ns, name, addr)


def _address_up(ns: Netns, ifname: str, cidr: str) -> None:
    iface = ipaddress.ip_interface(cidr)
    with ns.ipr() as ipr:
        idx = ipr.link_lookup(ifname=ifname)[0]
        ipr.addr("add", index=idx, address=str(iface.ip), prefixlen=iface.network.prefixlen)
        ipr.link("set", index=idx, state="up")


@dataclass(frozen=True, slots=True)
class Pod:
    """A pod namespace attached to the node's bridge."""

    ns: Netns
    ip: str
    host_veth: str  # the veth end inside the node namespace


@dataclass(slots=True)
class Node:
    """A node namespace with a Linux bridge and pods plugged into it, like a CNI bridge setup."""

    ns: Netns
    bridge: str
    subnet: ipaddress.IPv4Network
    gateway: str
    pods: list[Pod] = field(default_factory=list)
    _factory: NetnsFactory = field(default_factory=NetnsFactory)

    def add_pod(self, role: str = "pod") -> Pod:
        """A new pod namespace with ``eth0`` on the bridge, the next free address, default route."""
        pod_ns = self._factory(role)
        ip = str(self.subnet.network_address + 10 + len(self.pods))
        host_veth = f"vh{secrets.token_hex(4)}"
        with pod_ns.ipr() as ipr:
            ipr.link(
                "add",
                ifname="eth0",
                kind="veth",
                peer={"ifname": host_veth, "net_ns_fd": self.ns.name},
            )
        with self.ns.ipr() as ipr:
            bridge_idx = ipr.link_lookup(ifname=self.bridge)[0]
            idx = ipr.link_lookup(ifname=host_veth)[0]
            ipr.link("set", index=idx, master=bridge_idx, state="up")
        _address_up(pod_ns, "eth0", f"{ip}/{self.subnet.prefixlen}")
        with pod_ns.ipr() as ipr:
            ipr.route("add", dst="default", gateway=self.gateway)
        pod = Pod(ns=pod_ns, ip=ip, host_veth=host_veth)
        self.pods.append(pod)
        return pod

    def namespaces(self) -> list[Netns]:
        return [self.ns, *(p.ns for p in self.pods)]

    def close(self) -> None:
        self._factory.close()


def random_subnet() -> ipaddress.IPv4Network:
    """A /24 in 10.200.0.0/16 for one test; it exists only inside that test's namespaces."""
    return ipaddress.IPv4Network(f"10.200.{secrets.randbelow(256)}.0/24")


@contextlib.contextmanager
def node_with_pods(pods: int = 2, *, subnet: ipaddress.IPv4Network | None = None) -> Iterator[Node]:
    """A node namespace with bridge ``br0`` (gateway .1) and ``pods`` pod namespaces on it."""
    factory = NetnsFactory()
    try:
        node_ns = factory("node")
        net = subnet or random_subnet()
        gateway = str(net.network_address + 1)
        with node_ns.ipr() as ipr:
            ipr.link("add", ifname="br0", kind="bridge")
        _address_up(node_ns, "br0", f"{gateway}/{net.prefixlen}")
        node = Node(ns=node_ns, bridge="br0", subnet=net, gateway=gateway, _factory=factory)
        for i in range(pods):
            node.add_pod(f"pod{i}")
        yield node
    finally:
        factory.close()
