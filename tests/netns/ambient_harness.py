"""The ambient mesh the netns tests share: a node proxy in a node namespace, pods on its bridge.

Helpers, not fixtures: ``NodeProxy`` (``meshctl ztunnel run --mode node`` in the node namespace,
its pods handed over by whichever ZDS peer the test runs), the in-pod capture rules installed by
``meshctl iptables apply --mode ambient`` (what the node agent applies; the pods themselves never
get NET_ADMIN), and ``ambient_node``: a node with pods, their workload records, a development CA
for pod certificates, and an echo server in the server pod.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from meshctl.core.pki import certs
from tests.harness.netns import Node, Pod, node_with_pods
from tests.netns.zds_peer import AgentPeer
from tests.netns.ztunnel_harness import (
    Ca,
    EchoServer,
    Sidecar,
    http_get,
    meshctl_argv,
    workload,
    write_local_config,
)

APP_PORT = 8080
SVC_PORT = 80
SVC_HOST = "echo.prod.svc.cluster.local"


def ambient_capture(pod: Pod, *flags: str) -> None:
    """The in-pod rules, installed from outside the pod as the node agent does."""
    argv = meshctl_argv("iptables", "apply", "--mode", "ambient", "--netns", pod.ns.name, *flags)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"ambient rules in {pod.ns.name}: {done.stderr}"


def write_ca_dir(ca: Ca, folder: Path) -> Path:
    """The CA as ``meshctl ztunnel certs`` leaves it (ca-cert.pem, ca-key.pem)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / certs.CA_CERT_FILE).write_bytes(ca.root.cert_pem)
    key = folder / certs.CA_KEY_FILE
    key.touch(mode=0o600)
    key.write_bytes(ca.root.key_pem)
    return folder


@dataclass
class NodeProxy(Sidecar):
    """``meshctl ztunnel run --mode node`` in the node namespace (root: it enters pods)."""

    socket_path: Path = Path("/nonexistent")
    ca_dir: Path = Path("/nonexistent")

    def run_args(self) -> list[str]:
        return [
            "--mode",
            "node",
            "--inpod-uds",
            str(self.socket_path),
            "--ca-dir",
            str(self.ca_dir),
            *(("--local-config", str(self.local_config)) if self.local_config else ()),
            *self.extra,
        ]

    def config_dump(self) -> dict:
        # Generous: the dump of a proxy with many pods on a loaded 2-core machine is not instant.
        return json.loads(http_get(self.ns, 15000, "/config_dump", timeout=20)[1])

    def metrics(self) -> str:
        return http_get(self.ns, 15020, "/stats/prometheus", timeout=20)[1]

    def kill(self) -> None:
        """SIGKILL the whole proxy: supervisor, fork server, data planes (no drain, no cleanup)."""
        assert self.proc is not None
        server = self.fork_server_pid()
        pids = [
            self.supervisor_pid(),
            *([server] if server else []),
            *self.dataplane_pids(self._workers()),
        ]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        self.proc.wait(10)

    def _workers(self) -> int:
        if "--workers" in self.extra:
            return int(self.extra[self.extra.index("--workers") + 1])
        return 1


@dataclass
class AmbientNode:
    node: Node
    pods: list[Pod]
    tmp: Path
    ca: Ca
    ca_dir: Path
    config: Path
    proxy: NodeProxy
    agent: AgentPeer
    echo: EchoServer
    records: list[dict] = field(default_factory=list)

    @property
    def client(self) -> Pod:
        return self.pods[0]

    @property
    def server(self) -> Pod:
        return self.pods[1]

    @property
    def vip(self) -> str:
        return str(self.node.subnet.network_address + 200)

    def enroll(self, *indexes: int) -> None:
        """Hand pods to the proxy as the agent would: add each, then the snapshot marker."""
        for i in indexes:
            rec = self.records[i]
            ack = self.agent.add(
                f"uid-{i}",
                self.pods[i].ns.path,
                rec["name"],
                rec["namespace"],
                rec["serviceAccount"],
            )
            assert ack == "", ack
        assert self.agent.snapshot_sent() == ""

    def restart_proxy(self) -> float:
        """A new node proxy after the old one died; returns when its agent connection is up."""
        self.proxy.stop()
        self.agent.drop()
        started = time.monotonic()
        self.proxy.start(wait_ready=False)
        self.agent.accept()
        return started


def pod_records(pods: list[Pod], names: list[tuple[str, str]], vip: str) -> list[dict]:
    out = []
    for i, (pod, (ns, name)) in enumerate(zip(pods, names, strict=True)):
        services = {f"prod/{SVC_HOST}": {SVC_PORT: APP_PORT}} if i == 1 else None
        out.append(workload(name, ns, pod.ip, services=services))
    return out


@contextlib.contextmanager
def ambient_node(
    tmp: Path,
    *,
    pods: int = 2,
    names: list[tuple[str, str]] | None = None,
    policies: list | None = None,
    enroll: tuple[int, ...] = (0, 1),
    extra: tuple[str, ...] = (),
    capture: tuple[int, ...] | None = None,
) -> Iterator[AmbientNode]:
    """A node with ``pods`` pods (0: client in default, 1: server in prod with service echo),
    the in-pod rules in the ``capture`` pods (default: the enrolled ones), the node proxy
    started and the ``enroll`` pods handed to it by an independent ZDS agent peer."""
    names = names or [("default", "client"), ("prod", "server")] + [
        ("default", f"pod{i}") for i in range(2, pods)
    ]
    with node_with_pods(pods) as node:
        vip = str(node.subnet.network_address + 200)
        records = pod_records(node.pods, names[:pods], vip)
        config = write_local_config(
            tmp / "local.yaml",
            workloads=records,
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
        ca = Ca.create(tmp / "certs")
        ca_dir = write_ca_dir(ca, tmp / "ca")
        for i in enroll if capture is None else capture:
            ambient_capture(node.pods[i])
        agent = AgentPeer(tmp / "ztunnel.sock")
        proxy = NodeProxy(
            node.ns,
            "",
            tmp,
            config,
            log_path=tmp / "proxy.log",
            extra=extra,
            group=None,
            socket_path=agent.path,
            ca_dir=ca_dir,
        )
        echo = EchoServer(node.pods[1].ns, node.pods[1].ip, APP_PORT)
        mesh = AmbientNode(node, node.pods, tmp, ca, ca_dir, config, proxy, agent, echo, records)
        try:
            proxy.start(wait_ready=False)
            agent.accept()
            mesh.enroll(*enroll)
            proxy.wait_ready()
            yield mesh
        finally:
            proxy.stop()
            agent.close()
            echo.close()
