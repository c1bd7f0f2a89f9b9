"""The two-pod mesh most ztunnel tests share: client pod A, server pod B, one sidecar each.

Both pods get the sidecar capture rules from ``meshctl iptables apply`` (all outbound to :15001,
all inbound but 15008/15020/15021/15090 to :15006). The sidecars are exempt as the proxy's
group in A (``--gid-owner 1337``) and as the proxy's uid in B (``--uid-owner``, with the uid
the test runs as standing in for 1337), so both exemption styles carry traffic. Talk to a pod's
:15008 directly from the node namespace: anything a pod sends is captured by its sidecar.

``dual_stack=True`` adds an IPv6 ULA /64 (random, inside the test namespaces only) on the same
bridge, each workload and the service with both families, and the IPv6 capture rules too
(``meshctl iptables apply --dual-stack``).
"""

from __future__ import annotations

import contextlib
import ipaddress
import os
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from meshctl.core.pki.identity import SpiffeId
from tests.harness.netns import Node, Pod, node_with_pods
from tests.netns.ztunnel_harness import (
    PROXY_GID,
    TD,
    Ca,
    EchoServer,
    Sidecar,
    capture,
    workload,
    write_local_config,
)

APP_PORT = 8080
SVC_PORT = 80
SVC_HOST = "echo.prod.svc.cluster.local"


@dataclass
class Mesh:
    node: Node
    a: Pod
    b: Pod
    vip: str
    ca: Ca
    tmp: Path
    config: Path
    car_a: Sidecar
    car_b: Sidecar
    echo: EchoServer
    # With dual_stack: pod A's, pod B's and the service's IPv6 addresses, and B's v6 echo.
    a_ip6: str = ""
    b_ip6: str = ""
    vip6: str = ""
    echo6: EchoServer | None = None


def local_config(
    path: Path,
    a_ip: str,
    b_ip: str,
    vip: str,
    policies: list | None = None,
    *,
    v6: tuple[str, str, str] | None = None,
) -> Path:
    """Workloads client (A) and server (B), service echo; ``v6`` adds (a, b, vip) IPv6s."""
    client = workload("client", "default", a_ip)
    server = workload("server", "prod", b_ip, services={f"prod/{SVC_HOST}": {SVC_PORT: APP_PORT}})
    vips = [f"/{vip}"]
    if v6 is not None:
        client["workloadIps"].append(v6[0])
        server["workloadIps"].append(v6[1])
        vips.append(f"/{v6[2]}")
    return write_local_config(
        path,
        workloads=[client, server],
        services=[
            {
                "name": "echo",
                "namespace": "prod",
                "hostname": SVC_HOST,
                "vips": vips,
                "ports": {SVC_PORT: APP_PORT},
            }
        ],
        policies=policies or [],
    )


def add_ipv6(node: Node) -> tuple[str, str, str]:
    """A random ULA /64 on the node's bridge: gateway ::1 on br0, pods ::10 and ::11 with a
    default route; returns (a, b, vip). ``nodad``: duplicate address detection would hold each
    address back for a second or more, and nothing else uses these addresses."""
    net = ipaddress.IPv6Network(
        f"fd00:{secrets.randbelow(1 << 16):x}:{secrets.randbelow(1 << 16):x}::/64"
    )
    gateway = net.network_address + 1
    node.ns.run(["ip", "-6", "addr", "add", f"{gateway}/64", "dev", node.bridge, "nodad"])
    ips = []
    for i, pod in enumerate(node.pods):
        ip = net.network_address + 0x10 + i
        pod.ns.run(["ip", "-6", "addr", "add", f"{ip}/64", "dev", "eth0", "nodad"])
        pod.ns.run(["ip", "-6", "route", "add", "default", "via", str(gateway)])
        ips.append(str(ip))
    return ips[0], ips[1], str(net.network_address + 0x200)  # the VIP: an address nobody owns


@contextlib.contextmanager
def two_pod_mesh(
    tmp: Path,
    *,
    start_b: bool = True,
    policies: list | None = None,
    extra_a: tuple[str, ...] = (),
    extra_b: tuple[str, ...] = (),
    binary_a: str | None = None,
    binary_b: str | None = None,
    dual_stack: bool = False,
    capture_b: tuple[str, ...] | None = None,
    env_b: dict[str, str] | None = None,
) -> Iterator[Mesh]:
    """Pods a (client) and b (server) with sidecars. ``capture_b``: b's capture flags instead
    of the default (exempt uid/gid 0, b's proxy running as root), b's proxy then running as
    Istio's TPROXY sidecar does, uid 0 with gid 1337 (exempt by the default --gid-owner)."""
    with node_with_pods(2) as node:
        a, b = node.pods
        vip = str(node.subnet.network_address + 200)  # an address nobody owns, like a ClusterIP
        v6 = add_ipv6(node) if dual_stack else None
        ca = Ca.create(tmp / "certs")
        cert_a = ca.issue("a", SpiffeId(TD, "default", "client"))
        cert_b = ca.issue("b", SpiffeId(TD, "prod", "server"))
        config = local_config(tmp / "local.yaml", a.ip, b.ip, vip, policies, v6=v6)
        car_a = Sidecar(
            a.ns,
            "default/client/client",
            cert_a,
            config,
            log_path=tmp / "a.log",
            extra=extra_a,
            binary=binary_a,
        )
        uid = str(os.getuid())
        car_b = Sidecar(
            b.ns,
            "prod/server/server",
            cert_b,
            config,
            log_path=tmp / "b.log",
            extra=extra_b,
            group=None if capture_b is None else PROXY_GID,
            binary=binary_b,
            env=env_b or {},
        )
        echo = EchoServer(b.ns, b.ip, APP_PORT)
        echo6 = EchoServer(b.ns, v6[1], APP_PORT) if v6 else None
        families = ("--dual-stack",) if v6 else ()
        capture(a.ns, *families)  # proxy uid/gid 1337: the sidecar runs with gid 1337
        flags_b = ("--proxy-uid", uid, "--proxy-gid", uid) if capture_b is None else capture_b
        capture(b.ns, *flags_b, *families)
        try:
            car_a.start()
            if start_b:
                car_b.start()
            mesh = Mesh(node, a, b, vip, ca, tmp, config, car_a, car_b, echo, echo6=echo6)
            if v6:
                mesh.a_ip6, mesh.b_ip6, mesh.vip6 = v6
            yield mesh
        finally:
            car_a.stop()
            car_b.stop()
            echo.close()
            if echo6 is not None:
                echo6.close()
