"""The node agent's ZDS server: the node proxy connects here and is told which pods to serve.

Owns istio-cni's side of ZDS (shared notes istio-protos.md §7): listen on the SOCK_SEQPACKET
socket, read each proxy's hello, send it the snapshot (an ``add`` with the netns descriptor per
captured pod, or a ``keep`` when the descriptor is not at hand, then ``snapshot_sent``), then
steady-state ``add``/``del``. Invariants: one request at a time per connection, each answered by
an ack before the next (a missing or malformed answer drops the connection); adds go to the
newest connection, deletes to all (a restarting proxy overlaps its predecessor, and the next
proxy of a rollout overlaps the draining one): a proxy takes adds and deletes from the moment its
snapshot's list is taken, so a pod enrolled or removed while the snapshot is on its way is never
missed by the new proxy nor handed to it after its removal; no snapshot is
sent before the agent's own view of the node is complete (``ready``); every packet fits 1024
bytes; a connection that closes or speaks out of turn is dropped and never takes anything else
down. The agent sees the node proxies through ``NodeProxies``, so its reconciler can run against
a stand-in (tests/unit/plugins/cni).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from meshctl.core.wire import zds
from meshctl.net import zds as wire

log = logging.getLogger(__name__)

ACK_TIMEOUT = 5.0  # Istio's read/write deadline per message
_KEEPALIVE = 1.0


class ProxyUnavailableError(Exception):
    """The pod could not be handed to a node proxy (none connected, refused, timed out)."""


@dataclass(frozen=True, slots=True)
class SnapshotEntry:
    uid: str
    info: zds.WorkloadInfo
    fd: int | None  # None: send keep


Snapshot = Callable[[], list[SnapshotEntry]]
OnSnapshot = Callable[[str, zds.Ack], None]


class NodeProxies(Protocol):
    """The node proxies as the agent sees them (``ZdsServer``; a test's stand-in)."""

    changed: asyncio.Event  # set whenever a proxy becomes synced or goes away

    @property
    def connected(self) -> int:
        """Proxies that have their snapshot and take adds."""

    def start(self, *, snapshot: Snapshot, on_snapshot: OnSnapshot, ready: asyncio.Event) -> None:
        """Take proxies; each gets ``snapshot()`` once ``ready`` is set, each pod's answer
        going to ``on_snapshot``."""

    async def close(self) -> None: ...

    async def add(self, uid: str, info: zds.WorkloadInfo, fd: int) -> None:
        """Hand a pod to a proxy; ``ProxyUnavailableError`` unless one acknowledged it."""

    async def delete(self, uid: str) -> None:
        """Tell every proxy to stop serving ``uid`` (best effort)."""


@dataclass(eq=False)
class _Proxy:
    conn: wire.Connection
    number: int
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)
    synced: bool = False
    closed: bool = False
    # From the moment its snapshot's list is taken: it takes adds and deletes (interleaved with
    # the snapshot's requests); a pod deleted meanwhile is left out of what remains to send.
    snapshotting: bool = False
    deleted: set[str] = field(default_factory=set)

    @property
    def current(self) -> bool:
        """Takes adds and deletes: synced, or its snapshot is on its way."""
        return (self.synced or self.snapshotting) and not self.closed

    async def request(self, request: zds.Request, fds: tuple[int, ...] = ()) -> zds.Ack:
        async with self.lock:
            if self.closed:
                raise ConnectionResetError(errno.ECONNRESET, "node proxy connection closed")
            await self.conn.send(wire.encode_request(request), fds, timeout=ACK_TIMEOUT)
            packet = await self.conn.recv(ACK_TIMEOUT)
            wire.close_all(packet.fds)  # a proxy never sends descriptors
            return wire.decode_response(packet.data)

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.conn.close()


class ZdsServer:
    """Serves node proxies on ``path``; ``snapshot()`` lists the captured pods when one comes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._snapshot: Snapshot = list
        self._on_snapshot: OnSnapshot = lambda uid, ack: None
        self._ready = asyncio.Event()
        self._listener: socket.socket | None = None
        self._proxies: list[_Proxy] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._accepting: asyncio.Task[None] | None = None
        self._count = 0
        self.changed = asyncio.Event()  # set whenever a proxy becomes synced or goes away

    @property
    def connected(self) -> int:
        return sum(1 for p in self._proxies if p.synced and not p.closed)

    def start(self, *, snapshot: Snapshot, on_snapshot: OnSnapshot, ready: asyncio.Event) -> None:
        self._snapshot, self._on_snapshot, self._ready = snapshot, on_snapshot, ready
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a stale socket of an agent that died
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.bind(self.path)
            path.chmod(0o600)  # only root (the node proxy) may connect
            sock.listen(8)
            sock.setblocking(False)
        except OSError:
            sock.close()
            raise
        self._listener = sock
        self._accepting = asyncio.ensure_future(self._accept())
        log.info("ZDS server listening on %s", self.path)

    async def close(self) -> None:
        if self._accepting is not None:
            self._accepting.cancel()
        for task in list(self._tasks):
            task.cancel()
        for proxy in self._proxies:
            proxy.close()
        if self._listener is not None:
            self._listener.close()
            with contextlib.suppress(FileNotFoundError):
                Path(self.path).unlink()

    async def add(self, uid: str, info: zds.WorkloadInfo, fd: int) -> None:
        """Hand a pod to the newest proxy (synced, or getting its snapshot: the list it gets
        was taken before this pod was captured); ``ProxyUnavailableError`` unless it acked."""
        proxy = next((p for p in reversed(self._proxies) if p.current), None)
        if proxy is None:
            raise ProxyUnavailableError(f"no node proxy connected on {self.path}")
        try:
            ack = await proxy.request(zds.Add(uid, info), (fd,))
        except (OSError, TimeoutError, zds.ZdsError) as exc:
            self._drop(proxy, f"add {uid}: {exc or 'timed out'}")
            raise ProxyUnavailableError(f"node proxy did not answer: {exc or 'timeout'}") from exc
        if not ack.ok:
            raise ProxyUnavailableError(f"node proxy refused the pod: {ack.error}")

    async def delete(self, uid: str) -> None:
        """Tell every connected proxy to stop serving ``uid`` (best effort); one getting its
        snapshot also skips the pod if it is still in what remains to send (the caller closes
        the pod's netns descriptor once this returns)."""
        for proxy in [p for p in self._proxies if p.current]:
            if not proxy.synced:
                proxy.deleted.add(uid)
            try:
                ack = await proxy.request(zds.Delete(uid))
            except (OSError, TimeoutError, zds.ZdsError) as exc:
                self._drop(proxy, f"del {uid}: {exc or 'timed out'}")
                continue
            if not ack.ok:
                log.warning("node proxy %d refused to delete %s: %s", proxy.number, uid, ack.error)

    async def _accept(self) -> None:
        listener = self._listener
        if listener is None:
            return
        loop = asyncio.get_running_loop()
        while True:
            sock, _ = await loop.sock_accept(listener)
            self._count += 1
            proxy = _Proxy(wire.Connection(sock), self._count)
            self._proxies.append(proxy)
            task = asyncio.ensure_future(self._serve(proxy))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)
            # Istio limits accepts to 5/s: a proxy in a reconnect loop must not starve us.
            await asyncio.sleep(0.2)

    async def _serve(self, proxy: _Proxy) -> None:
        try:
            version = await _hello(proxy)
            log.info("node proxy %d connected (ZDS version %d)", proxy.number, version)
            await self._ready.wait()
            await self._send_snapshot(proxy)
            proxy.synced = True
            self.changed.set()
            await self._watch(proxy)
        except (OSError, TimeoutError, zds.ZdsError) as exc:
            self._drop(proxy, str(exc) or type(exc).__name__)
        finally:
            self._drop(proxy, "")

    async def _send_snapshot(self, proxy: _Proxy) -> None:
        entries = self._snapshot()
        proxy.snapshotting = True  # no await since the list: every later add and delete is ours
        for entry in entries:
            if entry.uid in proxy.deleted:
                continue  # deleted since the list was taken: its descriptor is closed (or soon)
            request: zds.Request = zds.Keep(entry.uid)
            fds: tuple[int, ...] = ()
            if entry.fd is not None:
                request, fds = zds.Add(entry.uid, entry.info), (entry.fd,)
            ack = await proxy.request(request, fds)
            if not ack.ok:
                log.error(
                    "node proxy %d refused pod %s (%s): %s",
                    proxy.number,
                    entry.info,
                    entry.uid,
                    ack.error,
                )
            self._on_snapshot(entry.uid, ack)
        ack = await proxy.request(zds.SnapshotSent())
        if not ack.ok:
            raise zds.ZdsError(f"snapshot_sent refused: {ack.error}")
        proxy.deleted.clear()
        log.info("node proxy %d has the snapshot (%d pods)", proxy.number, len(entries))

    async def _watch(self, proxy: _Proxy) -> None:
        """A proxy speaks only when asked: anything readable while idle is its end (or a
        protocol error). Istio checks the same way, with a short read."""
        while not proxy.closed:
            await asyncio.sleep(_KEEPALIVE)
            if proxy.lock.locked():
                continue
            try:
                data = proxy.conn.sock.recv(zds.MAX_PACKET, socket.MSG_PEEK | socket.MSG_DONTWAIT)
            except BlockingIOError:
                continue
            if not data:
                raise ConnectionResetError(errno.ECONNRESET, "node proxy closed the connection")
            raise zds.ZdsError("node proxy sent a message nobody asked for")

    def _drop(self, proxy: _Proxy, reason: str) -> None:
        if proxy.closed:
            return
        proxy.close()
        with contextlib.suppress(ValueError):
            self._proxies.remove(proxy)
        if reason:
            log.warning("node proxy %d dropped: %s", proxy.number, reason)
        else:
            log.info("node proxy %d disconnected", proxy.number)
        self.changed.set()


async def _hello(proxy: _Proxy) -> int:
    packet = await proxy.conn.recv(ACK_TIMEOUT)
    wire.close_all(packet.fds)
    version = wire.decode_hello(packet.data)
    if version != zds.VERSION_V1:
        raise zds.ZdsError(f"hello with unsupported version {version}")
    return version
