"""The two-pod mesh most ztunnel tests share: client pod A, server pod B, one sidecar each.

Both pods get the sidecar capture rules from ``meshctl iptables apply`` (all outbound to :15001,
all inbound but 15008/15020/15021/15090 to :15006). The sidecars are exempt as the proxy's
group in A (``--gid-owner 1337``) and as the proxy's uid in B (``--uid-owner``, with the uid
the test runs as standing in for 1337), so both exemption styles carry traffic. Talk to a pod's
:15008 directly from the node namespace: anything a pod sends is captured by its sidecar.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from meshctl.core.identity import SpiffeId
from tests.harness.netns import Node, Pod, node_with_pods
from tests.netns.ztunnel_harness import (
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


def local_config(path: Path, a_ip: str, b_ip: str, vip: str, policies: list | None = None) -> Path:
    return write_local_config(
        path,
        workloads=[
            workload("client", "default", a_ip),
            workload(
                "server",
                "prod",
                b_ip,
                services={f"prod/{SVC_HOST}": {SVC_PORT: APP_PORT}},
            ),
        ],
        services=[
            {
                "name": "echo",
                "namespace": "prod",
                "hostname": SVC_HOST,
                "vips": [f"/{vip}"],
                "ports": {SVC_PORT: APP_PORT},
            }
        ],
        policies=policies or [],
    )


@contextlib.contextmanager
def two_pod_mesh(
    tmp: Path,
    *,
    start_b: bool = True,
    policies: list | None = None,
    extra_a: tuple[str, ...] = (),
    extra_b: tuple[str, ...] = (),
) -> Iterator[Mesh]:
    with node_with_pods(2) as node:
        a, b = node.pods
        vip = str(node.subnet.network_address + 200)  # an address nobody owns, like a ClusterIP
        ca = Ca.create(tmp / "certs")
        cert_a = ca.issue("a", SpiffeId(TD, "default", "client"))
        cert_b = ca.issue("b", SpiffeId(TD, "prod", "server"))
        config = local_config(tmp / "local.yaml", a.ip, b.ip, vip, policies)
        car_a = Sidecar(
            a.ns, "default/client/client", cert_a, config, log_path=tmp / "a.log", extra=extra_a
        )
        uid = str(os.getuid())
        car_b = Sidecar(
            b.ns,
            "prod/server/server",
            cert_b,
            config,
            log_path=tmp / "b.log",
            extra=extra_b,
            group=None,
        )
        echo = EchoServer(b.ns, b.ip, APP_PORT)
        capture(a.ns)  # proxy uid/gid 1337: the sidecar runs with gid 1337
        capture(b.ns, "--proxy-uid", uid, "--proxy-gid", uid)
        try:
            car_a.start()
            if start_b:
                car_b.start()
            yield Mesh(node, a, b, vip, ca, tmp, config, car_a, car_b, echo)
        finally:
            car_a.stop()
            car_b.stop()
            echo.close()
