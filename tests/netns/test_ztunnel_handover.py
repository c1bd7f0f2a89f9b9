"""The node proxy's rollout as a handover (docs/ztunnel.md): two node proxies in turn serve the
same pods, driven by the node agent's real ZDS server, and no connection is lost.

Proxy A serves a client pod and a server pod; a client sends short echo connections through the
pods' capture without pause while proxy B (in a namespace of its own, as the next DaemonSet pod)
starts, gets the agent's snapshot, binds every pod's listeners beside A's (SO_REUSEPORT) and
becomes ready; then A gets SIGTERM, stops accepting and drains. Every connection must succeed
with its bytes intact, and one opened through A before the handover must outlive A's listeners.
Also the kernel facts the handover relies on, alone: connections queued on a listener that
closes move to the other listener of its group when the pod has ``tcp_migrate_req``.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import os
import signal
import socket
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from meshctl_plugins.cni.zdsserver import SnapshotEntry, ZdsServer

from meshctl.core.wire import zds
from meshctl.net.inpod import MIGRATE_SYSCTL, InPod
from tests.harness.netns import Netns, NetnsFactory, Pod, node_with_pods
from tests.harness.wait import eventually
from tests.netns.ambient_harness import (
    APP_PORT,
    NodeProxy,
    ambient_capture,
    pod_records,
    write_ca_dir,
)
from tests.netns.ztunnel_harness import (
    Ca,
    EchoServer,
    family_of,
    http_get,
    write_local_config,
)

pytestmark = pytest.mark.netns


class Agent:
    """The node agent's ZDS server on a thread of its own, its snapshot: the given pods."""

    def __init__(self, path: Path, pods: list[tuple[str, Pod, dict]]) -> None:
        self.fds = [os.open(pod.ns.path, os.O_RDONLY | os.O_CLOEXEC) for _, pod, _ in pods]
        self.entries = [
            SnapshotEntry(uid, zds.WorkloadInfo(r["name"], r["namespace"], r["serviceAccount"]), fd)
            for (uid, _, r), fd in zip(pods, self.fds, strict=True)
        ]
        self.acks: list[tuple[str, bool]] = []
        self.loop = asyncio.new_event_loop()
        self.server = ZdsServer(str(path))
        self._thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self._thread.start()
        self._call(self._start())

    async def _start(self) -> None:
        ready = asyncio.Event()
        ready.set()
        self.server.start(
            snapshot=lambda: list(self.entries),
            on_snapshot=lambda uid, ack: self.acks.append((uid, ack.ok)),
            ready=ready,
        )

    def _call(self, coro: object) -> object:
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(10)  # type: ignore[arg-type]

    @property
    def synced(self) -> int:
        """Node proxies that have their snapshot."""
        return self.server.connected

    def close(self) -> None:
        self._call(self.server.close())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(5)
        self.loop.close()
        for fd in self.fds:
            os.close(fd)


class Traffic:
    """Short echo connections from the client pod to the server pod, back to back, on a thread."""

    def __init__(self, client: Netns, server: tuple[str, int]) -> None:
        self.client, self.server = client, server
        self.ok = 0
        self.failures: list[str] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        n = 0
        while not self._stop.is_set():
            n += 1
            payload = f"request {n} ".encode() * 50
            started = time.monotonic()
            try:
                reply = _roundtrip(self.client, self.server, payload, timeout=2)
            except OSError as exc:
                self.failures.append(f"#{n} after {time.monotonic() - started:.2f}s: {exc!r}")
                continue
            if reply != hashlib.sha256(payload).digest() + payload:
                self.failures.append(f"#{n}: wrong bytes ({len(reply)} bytes back)")
            else:
                self.ok += 1

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)


def _roundtrip(ns: Netns, addr: tuple[str, int], payload: bytes, timeout: float) -> bytes:
    with ns.socket(family_of(addr[0])) as s:
        s.settimeout(timeout)
        s.connect(addr)
        s.sendall(b"E" + payload)
        s.shutdown(socket.SHUT_WR)
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


@contextlib.contextmanager
def proxy(ns: Netns, tmp: Path, name: str, config: Path, socket_path: Path) -> Iterator[NodeProxy]:
    node_proxy = NodeProxy(
        ns,
        "",
        tmp,
        config,
        log_path=tmp / f"proxy-{name}.log",
        # As the DaemonSet's: longer than the long-lived connection below lasts.
        extra=("--drain-deadline", "20s"),
        group=None,
        socket_path=socket_path,
        ca_dir=tmp / "ca",
    )
    node_proxy.start(wait_ready=False)
    try:
        yield node_proxy
    finally:
        node_proxy.stop()


def ready(ns: Netns) -> bool:
    try:
        return http_get(ns, 15021, "/healthz/ready", timeout=1)[0] == 200
    except OSError:
        return False


def test_a_rollout_of_the_node_proxy_loses_no_connection(  # noqa: PLR0915 (one handover, in order)
    tmp_path: Path, netns_factory: NetnsFactory
) -> None:
    with node_with_pods(2) as node:
        client, server = node.pods
        records = pod_records(node.pods, [("default", "client"), ("prod", "server")], "")
        config = write_local_config(tmp_path / "local.yaml", workloads=records)
        write_ca_dir(Ca.create(tmp_path / "certs"), tmp_path / "ca")
        for pod in node.pods:
            ambient_capture(pod)
        echo = EchoServer(server.ns, server.ip, APP_PORT)
        sock_path = tmp_path / "ztunnel.sock"
        agent = Agent(
            sock_path,
            [(f"uid-{i}", p, r) for i, (p, r) in enumerate(zip(node.pods, records, strict=True))],
        )
        try:
            with proxy(node.ns, tmp_path, "a", config, sock_path) as a:
                a.wait_ready()
                eventually("A has the snapshot", lambda: agent.synced == 1)
                target = (server.ip, APP_PORT)
                assert _roundtrip(client.ns, target, b"warm", timeout=5)[32:] == b"warm"

                # A long-lived connection through A: bytes keep flowing across the handover.
                long = client.ns.socket(family_of(server.ip))
                long.settimeout(30)
                long.connect(target)
                sent = b"E"
                long.sendall(sent)
                traffic = Traffic(client.ns, target)
                time.sleep(1)

                with proxy(netns_factory("zb"), tmp_path, "b", config, sock_path) as b:
                    eventually("B has the snapshot", lambda: agent.synced == 2, timeout=30)
                    eventually("B ready", lambda: ready(b.ns), timeout=30)
                    assert ready(a.ns), "A must still serve until it is told to stop"
                    assert agent.acks[-2:] == [("uid-0", True), ("uid-1", True)], agent.acks
                    time.sleep(1)  # both proxies hold the pods' listeners and take connections
                    handover = time.monotonic()
                    a.proc.send_signal(signal.SIGTERM)
                    chunk = b"across the handover " * 100
                    # Longer than a client waits (2 s): a connection left on A's listener while
                    # A drains would fail.
                    for _ in range(15):
                        time.sleep(0.3)
                        long.sendall(chunk)
                        sent += chunk
                    long.shutdown(socket.SHUT_WR)
                    reply = b""
                    while data := long.recv(65536):
                        reply += data
                    long.close()
                    intact = reply == hashlib.sha256(sent[1:]).digest() + sent[1:]
                    assert intact, (
                        f"the long-lived connection through A: {len(reply)} bytes back for "
                        f"{len(sent) - 1} sent\nA: {a.log_text(3000)}"
                    )
                    assert a.proc.wait(30) == 0, a.log_text()
                    drained = time.monotonic() - handover
                    time.sleep(1)  # B alone
                    traffic.stop()
                    print(
                        f"\nhandover: {traffic.ok} connections, {len(traffic.failures)} failed; "
                        f"A drained in {drained:.1f}s"
                    )
                    assert not traffic.failures, (
                        f"{len(traffic.failures)} of {traffic.ok + len(traffic.failures)} "
                        f"connections failed: {traffic.failures[:5]}\nA: {a.log_text(3000)}\n"
                        f"B: {b.log_text(3000)}"
                    )
                    assert traffic.ok > 20, traffic.ok
                    assert "stopped accepting for 2 pods" in a.log_text(None)
                    assert _roundtrip(client.ns, target, b"after", timeout=5)[32:] == b"after"
        finally:
            agent.close()
            echo.close()


def test_connections_queued_on_a_closing_listener_move_to_its_successor() -> None:
    """What A's last close relies on: pod listeners share the port (SO_REUSEPORT) and the pod
    has tcp_migrate_req, so connections A never accepted are accepted from B's listener."""
    with node_with_pods(1) as node:
        (pod,) = node.pods
        inpod = InPod()
        fd = os.open(pod.ns.path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            old = inpod.listeners(fd, {"inbound": 15008}, mark=0)["inbound"]
            setting = Path("/proc/sys", *MIGRATE_SYSCTL.split("."))
            with pod.ns.entered():
                assert setting.read_text().strip() == "1"
            clients = []
            for _ in range(5):
                c = pod.ns.socket()
                c.connect(("127.0.0.1", 15008))  # handshake done by the kernel: queued on old
                c.sendall(b"queued")
                clients.append(c)
            new = inpod.listeners(fd, {"inbound": 15008}, mark=0)["inbound"]  # beside the old
            old.close()  # never accepted: its queue moves to new
            new.settimeout(5)
            for _ in clients:
                conn, _ = new.accept()
                with conn:
                    assert conn.recv(10) == b"queued"
            new.close()
            for c in clients:
                c.close()
        finally:
            os.close(fd)
            inpod.close()
