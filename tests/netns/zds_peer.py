"""Independent ZDS peers, written here from Istio's zds.proto and its socket rules alone.

Neither peer imports meshctl's ZDS code (``meshctl.core.wire.zds``, ``meshctl.net.zds``): only the
generated protobuf classes (the schema itself) and the standard library, blocking sockets, so a
shared mistake cannot hide. ``AgentPeer`` plays istio-cni's node agent (the server: it accepts
the node proxy, reads its hello, sends adds with a netns descriptor, keeps, deletes and the
snapshot marker, and reads one ack per request); ``ProxyPeer`` plays ztunnel (connects, says
hello, answers every request, remembers the descriptors it was given).
"""

from __future__ import annotations

import contextlib
import os
import socket
import threading
from dataclasses import dataclass, field
from pathlib import Path

from meshctl.proto import zds_pb2

PACKET = 1024  # ztunnel's receive buffer


class AgentPeer:
    """The node agent's side: a SOCK_SEQPACKET listener and the connected node proxy."""

    def __init__(self, path: Path) -> None:
        self.path = path
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.listener.bind(str(path))
        self.listener.listen(4)
        self.conn: socket.socket | None = None
        self.hello_version: int | None = None

    def accept(self, timeout: float = 20) -> None:
        """Wait for the node proxy and read its hello."""
        self.listener.settimeout(timeout)
        conn, _ = self.listener.accept()
        conn.settimeout(timeout)
        data = conn.recv(PACKET)
        self.hello_version = zds_pb2.ZdsHello.FromString(data).version
        self.conn = conn

    def request(self, message: zds_pb2.WorkloadRequest, fds: tuple[int, ...] = ()) -> str:
        """Send one request, return the ack's error text ("" = acknowledged)."""
        return self.raw(message.SerializeToString(), fds)

    def raw(self, data: bytes, fds: tuple[int, ...] = ()) -> str:
        assert self.conn is not None
        if fds:
            socket.send_fds(self.conn, [data], list(fds))
        else:
            self.conn.send(data)
        answer = self.conn.recv(PACKET)
        if not answer:
            raise ConnectionError("node proxy closed the connection")
        response = zds_pb2.WorkloadResponse.FromString(answer)
        assert response.WhichOneof("payload") == "ack"
        return response.ack.error

    def add(self, uid: str, netns_path: str, name: str, namespace: str, sa: str) -> str:
        fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            info = zds_pb2.WorkloadInfo(name=name, namespace=namespace, service_account=sa)
            add = zds_pb2.AddWorkload(uid=uid, workload_info=info)
            return self.request(zds_pb2.WorkloadRequest(add=add), (fd,))
        finally:
            os.close(fd)  # the proxy holds its own copy now

    def keep(self, uid: str) -> str:
        return self.request(zds_pb2.WorkloadRequest(keep=zds_pb2.KeepWorkload(uid=uid)))

    def delete(self, uid: str) -> str:
        return self.request(zds_pb2.WorkloadRequest(**{"del": zds_pb2.DelWorkload(uid=uid)}))

    def snapshot_sent(self) -> str:
        return self.request(zds_pb2.WorkloadRequest(snapshot_sent=zds_pb2.SnapshotSent()))

    def drop(self) -> None:
        if self.conn is not None:
            self.conn.close()
            self.conn = None

    def close(self) -> None:
        self.drop()
        self.listener.close()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()


@dataclass
class Received:
    kind: str
    uid: str
    info: tuple[str, str, str] | None = None
    netns_inode: int | None = None


@dataclass
class ProxyPeer:
    """ztunnel's side: connects, says hello, acks (or refuses) every request on a thread."""

    path: Path
    refuse: dict[str, str] = field(default_factory=dict)  # uid -> NACK text for its add
    hold: dict[str, threading.Event] = field(default_factory=dict)  # uid -> ack its add when set
    received: list[Received] = field(default_factory=list)
    fds: dict[str, int] = field(default_factory=dict)  # uid -> the netns descriptor it holds
    snapshots: int = 0
    _sock: socket.socket | None = None
    _thread: threading.Thread | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> ProxyPeer:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        sock.connect(str(self.path))
        sock.send(zds_pb2.ZdsHello(version=zds_pb2.V1).SerializeToString())
        self._sock = sock
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()
        return self

    def _serve(self) -> None:
        assert self._sock is not None
        while True:
            try:
                data, fds, flags, _ = socket.recv_fds(self._sock, PACKET, 4)
            except OSError:
                return
            if not data:
                return
            assert not flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC), "truncated ZDS packet"
            assert len(data) <= PACKET
            request = zds_pb2.WorkloadRequest.FromString(data)
            kind = request.WhichOneof("payload")
            error = ""
            held: threading.Event | None = None
            with self._lock:
                if kind == "add":
                    assert len(fds) == 1, f"add with {len(fds)} descriptors"
                    add = request.add
                    info = add.workload_info
                    inode = os.fstat(fds[0]).st_ino
                    old = self.fds.pop(add.uid, None)
                    if old is not None:
                        os.close(old)
                    self.fds[add.uid] = fds[0]
                    self.received.append(
                        Received(
                            "add", add.uid, (info.namespace, info.name, info.service_account), inode
                        )
                    )
                    error = self.refuse.get(add.uid, "")
                    held = self.hold.get(add.uid)
                else:
                    assert not fds, f"{kind} carried {len(fds)} descriptors"
                    uid = getattr(request, kind).uid if kind in ("keep", "del") else ""
                    self.received.append(Received(kind or "?", uid))
                    if kind == "del":
                        old = self.fds.pop(uid, None)
                        if old is not None:
                            os.close(old)
                    if kind == "snapshot_sent":
                        self.snapshots += 1
            if held is not None:
                held.wait(30)  # the test decides when this add is answered
            response = zds_pb2.WorkloadResponse(ack=zds_pb2.Ack(error=error))
            try:
                self._sock.send(response.SerializeToString())
            except OSError:
                return

    def kinds(self) -> list[str]:
        with self._lock:
            return [r.kind for r in self.received]

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(OSError):
                self._sock.shutdown(socket.SHUT_RDWR)
            self._sock.close()
        if self._thread is not None:
            self._thread.join(5)
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
