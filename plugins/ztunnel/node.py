"""Node (ambient) mode of ``meshctl ztunnel run``: the pods the node agent hands over, served.

Owns the supervisor's side of in-pod mode: the ZDS client (connect to the agent's socket, hello,
one answer per request, ztunnel's rules from ``meshctl.core.wire.zds``), the registry of served pods
(each pod's netns descriptor and the listeners opened inside it, marked with the in-pod mark),
and what every data-plane worker is told about them (``PodAdd`` with the descriptors, ``PodDelete``,
``PodsSynced``). Invariants: a pod's listeners are owned here, so a restarting worker loses no
capture (connections wait in the backlog) and a restarted proxy re-creates them from the agent's
snapshot; an add is acknowledged only once its listeners are open and handed to the workers; a
pod whose netns is not a network namespace, has vanished or cannot be entered is refused with a
NACK naming the cause, and no other pod is touched; an agent that goes away leaves every pod
served (readiness turns false until the next snapshot). The kernel side of a pod (is it a netns,
which one, its listeners) is ``PodNetns``, so the pod handling runs in tests against a stand-in.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Protocol

from meshctl.core.backoff import Backoff
from meshctl.core.pki.identity import IdentityError, SpiffeId
from meshctl.core.wire import channel, zds
from meshctl.errors import MeshctlError
from meshctl.net import zds as wire
from meshctl.net.inpod import InPod
from meshctl.process import Feed, PodFeed
from meshctl.proxy.file_sources import LocalConfigSource
from meshctl.proxy.identities import Identities

log = logging.getLogger(__name__)

_RECONNECT = Backoff(first=0.05, cap=5.0)


@dataclass(slots=True)
class ServedPod:
    uid: str
    info: zds.WorkloadInfo
    identity: SpiffeId
    netns_fd: int
    netns_id: tuple[int, int]
    listeners: dict[str, socket.socket] = field(default_factory=dict)

    def message(self) -> tuple[channel.PodAdd, tuple[int, ...]]:
        roles = tuple(self.listeners)
        add = channel.PodAdd(
            uid=self.uid,
            name=self.info.name,
            namespace=self.info.namespace,
            service_account=self.info.service_account,
            netns=f"net:[{self.netns_id[1]}]",
            roles=("netns", *roles),
        )
        return add, (self.netns_fd, *(self.listeners[r].fileno() for r in roles))

    def close_listeners(self) -> None:
        for sock in self.listeners.values():
            sock.close()

    def close(self) -> None:
        self.close_listeners()
        with contextlib.suppress(OSError):
            os.close(self.netns_fd)


class PodNetns(Protocol):
    """What serving a pod needs of the kernel (``KernelNetns``; a test's stand-in)."""

    def is_netns(self, fd: int) -> bool: ...

    def netns_id(self, fd: int) -> tuple[int, int]: ...

    def listeners(
        self, fd: int, ports: Mapping[str, int], *, mark: int
    ) -> dict[str, socket.socket]:
        """The pod's listening sockets, opened inside the netns of ``fd`` (``MeshctlError``)."""

    def close(self) -> None: ...


class KernelNetns:
    """``PodNetns`` on the kernel: ``NS_GET_NSTYPE``, the namespace's inode, ``setns``."""

    def __init__(self) -> None:
        self._inpod = InPod()

    def is_netns(self, fd: int) -> bool:
        return wire.is_netns(fd)

    def netns_id(self, fd: int) -> tuple[int, int]:
        return wire.netns_id(fd)

    def listeners(
        self, fd: int, ports: Mapping[str, int], *, mark: int
    ) -> dict[str, socket.socket]:
        return self._inpod.listeners(fd, ports, mark=mark)

    def close(self) -> None:
        self._inpod.close()


class Pods(PodFeed):
    """The pods this node proxy serves, and what a new data plane must be told about them."""

    def __init__(
        self,
        *,
        ports: dict[str, int],
        mark: int,
        trust_domain: str,
        identities: Identities,
        netns: PodNetns | None = None,
    ) -> None:
        self.ports = ports
        self.mark = mark
        self.trust_domain = trust_domain
        self.identities = identities
        self.pods: dict[str, ServedPod] = {}
        self.synced = False
        self.reason = "waiting for the node agent's snapshot"
        self.draining = False
        self.send: Callable[[channel.Message, tuple[int, ...]], None] = lambda m, f: None
        self._netns = netns or KernelNetns()

    def current(self) -> list[tuple[channel.Message, tuple[int, ...]]]:
        out: list[tuple[channel.Message, tuple[int, ...]]] = [
            p.message() for p in self.pods.values()
        ]
        out.append((channel.PodsSynced(synced=self.synced, reason=self.reason), ()))
        return out

    def add(self, request: zds.Add, fd: int) -> zds.Ack:
        """Serve the pod of ``request`` in the netns of ``fd`` (ours now); the ZDS answer."""
        info = request.info or zds.WorkloadInfo("", "", "")  # ProxySession refuses None
        if self.draining:
            os.close(fd)
            return self._refuse(request.uid, info, "this node proxy is shutting down")
        try:
            identity = SpiffeId(self.trust_domain, info.namespace, info.service_account)
        except IdentityError as exc:
            os.close(fd)
            return self._refuse(request.uid, info, f"bad workload info: {exc}")
        if not self._netns.is_netns(fd):
            os.close(fd)
            return self._refuse(request.uid, info, "the descriptor is not a network namespace")
        netns_id = self._netns.netns_id(fd)
        existing = self.pods.get(request.uid)
        if existing is not None:
            if existing.netns_id == netns_id:
                os.close(fd)  # the same pod again (a snapshot after a reconnect): nothing to do
                return zds.Ack()
            log.info("pod %s (%s) has a new netns; replacing its proxy", info, request.uid)
            self.delete(request.uid)
        try:
            listeners = self._netns.listeners(fd, self.ports, mark=self.mark)
        except MeshctlError as exc:
            os.close(fd)
            return self._refuse(request.uid, info, exc.message)
        pod = ServedPod(request.uid, info, identity, fd, netns_id, listeners)
        self.pods[request.uid] = pod
        self.identities.acquire(identity)
        message, fds = pod.message()
        self.send(message, fds)
        log.info(
            "pod %s (%s) enrolled: %s in %s",
            info,
            request.uid,
            ", ".join(f"{r}:{self.ports.get(r.removesuffix('6'))}" for r in listeners),
            message.netns,
        )
        return zds.Ack()

    def delete(self, uid: str) -> bool:
        pod = self.pods.pop(uid, None)
        if pod is None:
            return False
        self.send(channel.PodDelete(uid=uid), ())
        pod.close()  # our copies; each worker closes its own
        self.identities.release(pod.identity)
        log.info("pod %s (%s) removed", pod.info, uid)
        return True

    def set_synced(self, synced: bool, reason: str = "") -> None:
        if (synced, reason) == (self.synced, self.reason):
            return
        self.synced, self.reason = synced, reason or self.reason
        self.send(channel.PodsSynced(synced=synced, reason=reason), ())

    def stop_listening(self) -> None:
        """The drain began: our listener copies go (the workers close theirs), so the pods'
        new connections reach the next node proxy, which holds the same ports (SO_REUSEPORT)."""
        self.draining = True
        for pod in self.pods.values():
            pod.close_listeners()
        log.info("stopped accepting for %d pods; draining", len(self.pods))

    def close(self) -> None:
        for pod in self.pods.values():
            pod.close()
        self.pods.clear()
        self._netns.close()

    def _refuse(self, uid: str, info: zds.WorkloadInfo, reason: str) -> zds.Ack:
        log.error("pod %s (%s) refused: %s", info, uid, reason)
        return zds.Ack(error=f"failure to start proxy : {reason}")


class NodeFeed(Feed):
    """A new data plane gets every pod identity's certificate and the workloads."""

    def __init__(self, config: LocalConfigSource, identities: Identities) -> None:
        self._config = config
        self._identities = identities

    def current(self) -> list[channel.Message]:
        return [*self._identities.current(), self._config.workloads]

    def changes(self) -> list[channel.Message]:
        return self._config.changes()


class ZdsClient:
    """Keeps a connection to the node agent and applies what it sends to ``pods``."""

    def __init__(self, path: str, pods: Pods, *, read_timeout: float | None = None) -> None:
        self.path = path
        self.pods = pods
        self.stopped = asyncio.Event()
        self._read_timeout = read_timeout
        self.connections = 0

    async def run(self) -> None:
        failures = 0
        while not self.stopped.is_set():
            try:
                conn = await wire.Connection.connect(self.path)
            except (OSError, TimeoutError) as exc:
                failures += 1
                delay = _RECONNECT.delay(failures)
                if failures == 1 or failures % 20 == 0:
                    log.warning(
                        "cannot reach the node agent at %s (%s); retrying",
                        self.path,
                        exc.strerror if isinstance(exc, OSError) and exc.strerror else exc,
                    )
                self.pods.set_synced(False, f"node agent unreachable at {self.path}")
                await asyncio.sleep(delay)
                continue
            failures = 0
            self.connections += 1
            try:
                await self._serve(conn)
            except (OSError, TimeoutError, zds.ZdsError) as exc:
                log.warning("node agent connection lost: %s; reconnecting", exc)
            finally:
                conn.close()
            if not self.stopped.is_set():
                self.pods.set_synced(False, "node agent disconnected; reconnecting")
                await asyncio.sleep(_RECONNECT.first)

    async def _serve(self, conn: wire.Connection) -> None:
        await conn.send(wire.encode_hello(zds.VERSION_V1))
        log.info("connected to the node agent at %s", self.path)
        session = zds.ProxySession()
        while True:
            packet = await conn.recv(self._read_timeout)
            try:
                request = wire.decode_request(packet.data)
            except zds.ZdsError as exc:
                wire.close_all(packet.fds)
                # Garbage: refuse it and start over on a new connection (ztunnel drops it too).
                await conn.send(wire.encode_response(zds.Ack(error=str(exc))))
                raise
            verdict = session.receive(request, len(packet.fds), running=self.pods.pods)
            if verdict.fault is not None:
                wire.close_all(packet.fds)
                await conn.send(wire.encode_response(zds.Ack(error=verdict.reason)))
                if verdict.fault is zds.Fault.STOP:
                    log.error(
                        "node agent protocol error: %s; in-pod manager stopped", verdict.reason
                    )
                    self.pods.set_synced(False, f"protocol error: {verdict.reason}")
                    self.stopped.set()
                    return
                raise zds.ZdsError(verdict.reason)
            ack = self._act(request, verdict, packet.fds)
            await conn.send(wire.encode_response(ack))

    def _act(self, request: zds.Request, verdict: zds.Verdict, fds: list[int]) -> zds.Ack:
        if isinstance(request, zds.Add):
            return self.pods.add(request, fds[0])
        if isinstance(request, zds.Delete):
            if not self.pods.delete(request.uid):
                log.debug("delete of unknown pod %s", request.uid)
            return zds.Ack()
        if isinstance(request, zds.SnapshotSent):
            for uid in sorted(verdict.remove):
                self.pods.delete(uid)
            log.info("node agent snapshot applied: %d pods served", len(self.pods.pods))
            self.pods.set_synced(True)
        return zds.Ack()
