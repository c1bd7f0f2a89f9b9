"""The descriptor channel: one ``meshctl.core.wire.channel`` frame per SOCK_SEQPACKET packet,
with the descriptors it carries attached as SCM_RIGHTS.

Owns both ends of the second channel a supervisor opens to each data-plane child (node mode: pods
with their netns and listeners; the gateway: its listener sockets). Invariants: a packet holds
exactly one frame; a received descriptor is either handed to the callback with its message or
closed here (a truncated or malformed packet, or a callback that refused it with
``ChannelError``), never leaked; EOF or a broken socket stops the reading for good (the main
channel says why the supervisor went away).
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Callable, Sequence

from meshctl.core.wire import channel

log = logging.getLogger(__name__)

PACKET = 64 * 1024
MAX_FDS = 16


def send(sock: socket.socket, message: channel.Message, fds: Sequence[int] = ()) -> None:
    """One packet: ``message`` and ``fds`` (OSError, TimeoutError included, to the caller)."""
    data = channel.encode(message)
    if fds:
        rights = array.array("i", fds)
        sock.sendmsg([data], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)])
    else:
        sock.send(data)


def close_fds(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


def _message(data: bytes, flags: int) -> channel.Message:
    if flags & (socket.MSG_TRUNC | socket.MSG_CTRUNC):
        raise channel.ChannelError("truncated descriptor-channel packet")
    messages = channel.Decoder().feed(data)
    if len(messages) != 1:
        raise channel.ChannelError("a descriptor-channel packet holds exactly one frame")
    return messages[0]


class Receiver:
    """The child's end on the running event loop: ``on_message(message, fds)`` per packet; the
    callback owns the descriptors unless it raises ``ChannelError`` (they are closed here)."""

    def __init__(
        self, fd: int, on_message: Callable[[channel.Message, list[int]], None], what: str
    ) -> None:
        self._sock: socket.socket | None = socket.socket(fileno=fd)
        self._sock.setblocking(False)
        self._on_message = on_message
        self._what = what
        asyncio.get_running_loop().add_reader(fd, self._read)

    def _read(self) -> None:
        while self._sock is not None:
            try:
                data, fds, flags, _ = socket.recv_fds(self._sock, PACKET, MAX_FDS)
            except BlockingIOError:
                return
            except OSError as exc:
                log.error("%s channel broken: %s", self._what, exc)  # noqa: TRY400 (expected; no traceback)
                self.close()
                return
            if not data:
                self.close()  # the supervisor went away; the main channel says so
                return
            try:
                self._on_message(_message(data, flags), fds)
            except channel.ChannelError as exc:
                log.error("%s channel: %s", self._what, exc)  # noqa: TRY400 (expected; no traceback)
                close_fds(fds)

    def close(self) -> None:
        if self._sock is not None:
            with contextlib.suppress(ValueError, OSError):
                asyncio.get_running_loop().remove_reader(self._sock.fileno())
            self._sock.close()
            self._sock = None
