"""ZDS on the wire: protobuf packets on a SOCK_SEQPACKET unix socket, netns fds as SCM_RIGHTS.

Owns the codec between ``meshctl.core.wire.zds`` records and Istio's ``istio.workload.zds`` messages
(``meshctl.proto.zds_pb2``), one message per packet without a length prefix, and the socket I/O
both ends use: a bounded receive (``MAX_PACKET`` bytes, ``MSG_CMSG_CLOEXEC``; a truncated packet
or truncated control data is an error), sends with at most one descriptor, and the check that a
descriptor really is a network namespace. Invariants: every descriptor received is either
returned to the caller or closed here, also when the packet is refused; unknown protobuf fields
are tolerated (protobuf skips them), a packet that does not parse is a ``ZdsError``.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import errno
import fcntl
import os
import socket
from dataclasses import dataclass

from google.protobuf.message import DecodeError

from meshctl.core.wire.zds import (
    MAX_PACKET,
    Ack,
    Add,
    Delete,
    Keep,
    Request,
    SnapshotSent,
    WorkloadInfo,
    ZdsError,
)
from meshctl.proto import zds_pb2

_MAX_FDS = 8  # room to see (and close) what a misbehaving peer attached; the protocol allows one
_NS_GET_NSTYPE = 0xB703  # _IO(0xb7, 0x3), linux/nsfs.h (kernel 4.11+)
_CLONE_NEWNET = 0x40000000


# -- codec ---------------------------------------------------------------------------------------


def encode_hello(version: int) -> bytes:
    return zds_pb2.ZdsHello(version=version).SerializeToString()  # type: ignore[arg-type]


def decode_hello(data: bytes) -> int:
    """The version a ``ZdsHello`` announces."""
    try:
        hello = zds_pb2.ZdsHello.FromString(data)
    except DecodeError as exc:
        raise ZdsError(f"hello is not a ZdsHello: {exc}") from exc
    return int(hello.version)


def encode_request(request: Request) -> bytes:
    message = zds_pb2.WorkloadRequest()
    if isinstance(request, Add):
        message.add.uid = request.uid
        if request.info is not None:
            message.add.workload_info.name = request.info.name
            message.add.workload_info.namespace = request.info.namespace
            message.add.workload_info.service_account = request.info.service_account
    elif isinstance(request, Keep):
        message.keep.uid = request.uid
    elif isinstance(request, Delete):
        getattr(message, "del").uid = request.uid  # ``del`` is a Python keyword
    else:
        message.snapshot_sent.SetInParent()
    data = message.SerializeToString()
    if len(data) > MAX_PACKET:
        raise ZdsError(f"request of {len(data)} bytes exceeds the {MAX_PACKET}-byte packet limit")
    return data


def decode_request(data: bytes) -> Request:
    try:
        message = zds_pb2.WorkloadRequest.FromString(data)
    except DecodeError as exc:
        raise ZdsError(f"not a WorkloadRequest: {exc}") from exc
    kind = message.WhichOneof("payload")
    if kind == "add":
        info = None
        if message.add.HasField("workload_info"):
            w = message.add.workload_info
            info = WorkloadInfo(w.name, w.namespace, w.service_account)
        return Add(message.add.uid, info)
    if kind == "keep":
        return Keep(message.keep.uid)
    if kind == "del":
        return Delete(getattr(message, "del").uid)
    if kind == "snapshot_sent":
        return SnapshotSent()
    raise ZdsError("WorkloadRequest without a payload")


def encode_response(ack: Ack) -> bytes:
    # A refusal's text is cut so the answer fits one packet whatever the reason said.
    error = ack.error.encode()[: MAX_PACKET - 16].decode(errors="ignore")
    return zds_pb2.WorkloadResponse(ack=zds_pb2.Ack(error=error)).SerializeToString()


def decode_response(data: bytes) -> Ack:
    try:
        message = zds_pb2.WorkloadResponse.FromString(data)
    except DecodeError as exc:
        raise ZdsError(f"not a WorkloadResponse: {exc}") from exc
    if message.WhichOneof("payload") != "ack":
        raise ZdsError("WorkloadResponse without an ack")
    return Ack(message.ack.error)


# -- descriptors ---------------------------------------------------------------------------------


def is_netns(fd: int) -> bool:
    """Whether ``fd`` refers to a network namespace (``NS_GET_NSTYPE`` says CLONE_NEWNET)."""
    try:
        return fcntl.ioctl(fd, _NS_GET_NSTYPE) == _CLONE_NEWNET
    except OSError:
        return False  # ENOTTY: not a namespace file at all


def netns_id(fd: int) -> tuple[int, int]:
    """The namespace's identity (device, inode): equal for two descriptors of one namespace."""
    st = os.fstat(fd)
    return (st.st_dev, st.st_ino)


def close_all(fds: list[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


# -- socket I/O ----------------------------------------------------------------------------------


@dataclass(slots=True)
class Packet:
    data: bytes
    fds: list[int]  # the caller owns these now


class Connection:
    """One ZDS connection on a non-blocking SOCK_SEQPACKET socket, for asyncio code."""

    def __init__(self, sock: socket.socket) -> None:
        sock.setblocking(False)
        self.sock = sock

    @classmethod
    async def connect(cls, path: str, timeout: float = 5.0) -> Connection:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET | socket.SOCK_CLOEXEC)
        try:
            sock.setblocking(False)
            async with asyncio.timeout(timeout):
                await asyncio.get_running_loop().sock_connect(sock, path)
        except BaseException:
            sock.close()
            raise
        return cls(sock)

    async def recv(self, timeout: float | None = None) -> Packet:
        """The next packet; ``ConnectionError`` when the peer closed, ``ZdsError`` if truncated."""
        async with asyncio.timeout(timeout):
            while True:
                try:
                    return _recv(self.sock)
                except BlockingIOError:
                    await _wait(self.sock, writable=False)

    async def send(self, data: bytes, fds: tuple[int, ...] = (), timeout: float = 5.0) -> None:
        async with asyncio.timeout(timeout):
            while True:
                try:
                    _send(self.sock, data, fds)
                except BlockingIOError:
                    await _wait(self.sock, writable=True)
                else:
                    return

    def close(self) -> None:
        self.sock.close()


def _recv(sock: socket.socket) -> Packet:
    data, ancdata, flags, _ = sock.recvmsg(
        MAX_PACKET, socket.CMSG_SPACE(_MAX_FDS * 4), socket.MSG_CMSG_CLOEXEC
    )
    fds: list[int] = []
    for level, kind, payload in ancdata:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            usable = len(payload) - len(payload) % 4
            fds.extend(array.array("i", payload[:usable]))
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        close_all(fds)
        what = "packet" if flags & socket.MSG_TRUNC else "control data"
        raise ZdsError(f"received a truncated {what} (a ZDS packet is at most {MAX_PACKET} bytes)")
    if not data and not fds:
        raise ConnectionResetError(errno.ECONNRESET, "peer closed the ZDS connection")
    return Packet(data, fds)


def _send(sock: socket.socket, data: bytes, fds: tuple[int, ...]) -> None:
    if fds:
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))])
    else:
        sock.send(data)


async def _wait(sock: socket.socket, *, writable: bool) -> None:
    loop = asyncio.get_running_loop()
    ready = loop.create_future()
    fd = sock.fileno()
    add, remove = (
        (loop.add_writer, loop.remove_writer) if writable else (loop.add_reader, loop.remove_reader)
    )

    def wake() -> None:
        if not ready.done():
            ready.set_result(None)

    add(fd, wake)
    try:
        await ready
    finally:
        remove(fd)
