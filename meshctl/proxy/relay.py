"""Moving bytes between an app TCP socket and its peer: a tunnel stream, or another TCP socket.

Owns the two relays every traffic path ends in. ``AppStream`` joins an app socket to one HBONE
stream; ``Splice`` joins two TCP sockets (passthrough, plaintext). Invariants: bytes are
forwarded in order; half-close is forwarded per direction (TCP FIN <-> END_STREAM) and a socket
closes only once both directions ended; an abort on one side aborts the other; flow-control
credit goes back to the tunnel only for bytes the app socket accepted (its write buffer below the
high-water mark), so a slow app slows the remote sender instead of growing our memory, and
whatever credit a stream still holds goes back when it ends (the connection window is shared).
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import socket
import struct
from collections.abc import Callable
from typing import Any, cast

from .tunnel import TunnelProtocol

Counter = Callable[[int], None]


def _ignore(_: int) -> None:
    return None


class AppStream(asyncio.Protocol):
    """An app socket bridged to one tunnel stream (either side of the mesh)."""

    def __init__(
        self,
        *,
        from_app: Counter = _ignore,
        to_app: Counter = _ignore,
        on_done: Callable[[str | None], None] | None = None,
    ) -> None:
        self.transport: asyncio.Transport | None = None
        self.tunnel: TunnelProtocol | None = None
        self.sid = 0
        self._from_app = from_app
        self._to_app = to_app
        self._on_done = on_done
        self._app_eof = False  # app sent FIN -> we sent END_STREAM
        self._tunnel_eof = False  # peer sent END_STREAM -> we sent FIN
        self._write_paused = False
        self._read_paused = False
        self._owed = 0  # flow credit held back while the app socket's buffer is full
        self._done = False
        self._early: list[bytes] = []  # app bytes before the stream exists
        # Tunnel bytes that arrived before the app socket exists, with their flow credit.
        self._pending: list[tuple[bytes | memoryview, int]] = []
        self._pending_eof = False

    # -- binding -----------------------------------------------------------------------------

    def bind(self, tunnel: TunnelProtocol, sid: int) -> None:
        """Join the stream; bytes read before it existed go first."""
        self.tunnel, self.sid = tunnel, sid
        early, self._early = self._early, []
        for chunk in early:
            tunnel.send(sid, chunk, self)
        if self._app_eof:
            tunnel.end(sid)

    # -- app socket callbacks ----------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        if self._done:  # the stream died while we were connecting
            transport.abort()
            return
        pending, self._pending = self._pending, []
        for data, flow in pending:
            self.tunnel_data(data, flow)
        if self._pending_eof:
            self.tunnel_ended()

    def data_received(self, data: bytes) -> None:
        self._from_app(len(data))
        if self.tunnel is None:
            self._early.append(data)
            if sum(map(len, self._early)) > 1024 * 1024:
                self.pause_source()  # the tunnel is still being set up
            return
        self.tunnel.send(self.sid, data, self)

    def eof_received(self) -> bool:
        self._app_eof = True
        if self.tunnel is not None:
            self.tunnel.end(self.sid)
        self._maybe_close()
        return True  # keep our write side open: the other direction may still carry bytes

    def connection_lost(self, exc: Exception | None) -> None:
        self._release_credit()  # what its write buffer still held will never reach the app
        if not (self._app_eof and self._tunnel_eof) and self.tunnel is not None:
            self.tunnel.reset(self.sid)  # the app vanished mid-stream: abort, do not end
        elif self.tunnel is not None:
            self.tunnel.finished(self.sid)
        self._finish(None if self._app_eof and self._tunnel_eof else "app connection lost")

    def pause_writing(self) -> None:
        self._write_paused = True

    def resume_writing(self) -> None:
        self._write_paused = False
        owed, self._owed = self._owed, 0
        if owed and self.tunnel is not None:
            self.tunnel.consumed(self.sid, owed)

    # -- Pausable (called by the tunnel) -----------------------------------------------------

    def pause_source(self) -> None:
        if self.transport is not None and not self._read_paused:
            self._read_paused = True
            self.transport.pause_reading()

    def resume_source(self) -> None:
        if self.transport is not None and self._read_paused and not self.transport.is_closing():
            self._read_paused = False
            self.transport.resume_reading()

    # -- StreamSink (called by the tunnel) ---------------------------------------------------

    def tunnel_opened(self) -> None:
        return None

    def tunnel_refused(self, status: int) -> None:
        self._abort(f"tunnel refused with HTTP {status}")

    def tunnel_data(self, data: bytes | memoryview, flow: int) -> None:
        if self.transport is None and not self._done:
            self._pending.append((data, flow))  # credit returns once the app socket takes it
            return
        if self.transport is None or self.transport.is_closing():
            if self.tunnel is not None:
                self.tunnel.consumed(self.sid, flow)
            return
        self.transport.write(data)
        self._to_app(len(data))
        if self._write_paused:
            self._owed += flow
        elif self.tunnel is not None:
            self.tunnel.consumed(self.sid, flow)

    def tunnel_ended(self) -> None:
        if self.transport is None:
            self._pending_eof = True
            return
        self._tunnel_eof = True
        t = self.transport
        if t is not None and not t.is_closing() and t.can_write_eof():
            t.write_eof()
        self._maybe_close()

    def tunnel_reset(self, reason: str) -> None:
        self._release_credit()
        self.tunnel = None
        self._abort(reason)

    def tunnel_writable(self) -> None:
        self.resume_source()

    # -- internals ---------------------------------------------------------------------------

    def _release_credit(self) -> None:
        """Give back the flow credit held for bytes that will never be written to the app.

        The connection window is shared by every stream of the tunnel: credit kept by a stream
        that ends (reset by the peer while the app socket was full, or the app gone) would be
        lost to its siblings for good, and enough such streams stall the whole connection.
        """
        owed = self._owed + sum(flow for _, flow in self._pending)
        self._owed, self._pending = 0, []
        if owed and self.tunnel is not None:
            self.tunnel.consumed(self.sid, owed)

    def _maybe_close(self) -> None:
        if self._app_eof and self._tunnel_eof and self.transport is not None:
            self.transport.close()  # flushes what is buffered, then connection_lost

    def _abort(self, reason: str) -> None:
        if self.transport is not None:
            self.transport.abort()
        self._finish(reason)

    def _finish(self, error: str | None) -> None:
        if not self._done:
            self._done = True
            if self._on_done is not None:
                self._on_done(error)


class Splice(asyncio.Protocol):
    """One side of a TCP <-> TCP relay; ``pair`` joins two of them."""

    def __init__(
        self, counter: Counter = _ignore, on_done: Callable[[], None] | None = None
    ) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: Splice | None = None
        self._counter = counter
        self._on_done = on_done
        self._eof = False
        self._early: list[bytes] = []
        self._early_eof = False

    @staticmethod
    def pair(a: Splice, b: Splice) -> None:
        a.peer, b.peer = b, a
        for side in (a, b):
            early, side._early = side._early, []
            for chunk in early:
                side._forward(chunk)
            if side._early_eof:
                side.eof_received()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)

    def data_received(self, data: bytes) -> None:
        if self.peer is None:
            self._early.append(data)
            if self.transport is not None and sum(map(len, self._early)) > 1024 * 1024:
                self.transport.pause_reading()
            return
        self._forward(data)

    def _forward(self, data: bytes) -> None:
        self._counter(len(data))
        peer = self.peer.transport if self.peer is not None else None
        if peer is not None and not peer.is_closing():
            peer.write(data)

    def eof_received(self) -> bool:
        if self.peer is None:
            self._early_eof = True
            return True
        self._eof = True
        peer = self.peer.transport
        if peer is not None and not peer.is_closing() and peer.can_write_eof():
            peer.write_eof()
        if self.peer._eof:
            for t in (self.transport, peer):
                if t is not None:
                    t.close()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        peer = self.peer
        if peer is not None and peer.transport is not None and not (self._eof and peer._eof):
            peer.transport.abort()
        if self._on_done is not None:
            done, self._on_done = self._on_done, None
            done()

    # Backpressure: our peer's write buffer is full -> stop reading the side that fills it.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        peer = self.peer.transport if self.peer is not None else None
        if peer is not None and not peer.is_closing():
            peer.resume_reading()


class Accepted:
    """A just-accepted socket before any transport exists: routed on the raw socket first.

    No byte is read until the path picks a protocol (``hand_over``), so nothing can be read by
    the wrong protocol: the bytes wait in the kernel. (Pausing a transport from
    ``connection_made`` does not close that race: the loop may already have a read in flight.)
    """

    def __init__(self, sock: socket.socket, peer: tuple[str, int], local: tuple[str, int]) -> None:
        self.sock = sock
        self.peer = peer
        self.local = local

    async def hand_over(
        self,
        protocol: asyncio.Protocol | asyncio.BufferedProtocol,
        *,
        ssl: Any = None,
        handshake_timeout: float | None = None,
    ) -> asyncio.Transport:
        """Wrap the socket in a transport (TLS when ``ssl``) driving ``protocol``.

        With TLS, ``handshake_timeout`` also bounds the close: how long we wait for the peer's
        close_notify after sending ours (reading and dropping what it still sends meanwhile).
        """
        loop = asyncio.get_running_loop()
        tls_limits = (
            {"ssl_handshake_timeout": handshake_timeout, "ssl_shutdown_timeout": handshake_timeout}
            if ssl is not None
            else {}
        )
        transport, _ = await loop.connect_accepted_socket(
            lambda: protocol, self.sock, ssl=ssl, **tls_limits
        )
        return transport

    def refuse(self) -> None:
        """Close with a TCP RST: the client learns at once that nothing is there."""
        with contextlib.suppress(OSError):
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        self.sock.close()


async def accept_loop(listener: socket.socket, handle: Callable[[Accepted], None]) -> None:
    """Accept forever on ``listener`` (shared with other workers), handing each socket on.

    One reader stays registered for the listener's life and every wake-up accepts what is
    queued: ``loop.sock_accept`` registers and removes its reader around every accept (three
    epoll_ctl calls per connection, profiled), and takes one connection per wake-up.
    """
    loop = asyncio.get_running_loop()
    listener.setblocking(False)
    fd = listener.fileno()
    ready = asyncio.Event()
    loop.add_reader(fd, ready.set)
    try:
        while True:
            await ready.wait()
            ready.clear()
            for _ in range(_ACCEPT_BATCH):
                try:
                    sock, peer = listener.accept()
                except BlockingIOError:  # drained (or another worker was faster)
                    break
                except OSError as exc:
                    if exc.errno in (errno.EMFILE, errno.ENFILE):
                        await asyncio.sleep(0.1)  # out of descriptors: back off, do not spin
                        break
                    if exc.errno in (errno.ECONNABORTED, errno.EPROTO):
                        continue
                    raise
                sock.setblocking(False)
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                handle(Accepted(sock, (peer[0], peer[1]), sock.getsockname()[:2]))
            else:
                ready.set()  # more may be queued: take them after others had their turn
                await asyncio.sleep(0)
    finally:
        # A listener closed before this cancelled task ran has given its number away (maybe to
        # a connection's transport by now): only a still-open listener's reader is ours.
        if listener.fileno() == fd:
            loop.remove_reader(fd)


def stop_accepting(listener: socket.socket) -> None:
    """Stop the listener's ``accept_loop`` reader now and close it (its task, cancelled, finds
    the socket closed): the number is free for reuse only once no reader refers to it."""
    fd = listener.fileno()
    if fd >= 0:
        with contextlib.suppress(RuntimeError):  # no loop running: no reader to remove
            asyncio.get_running_loop().remove_reader(fd)
    listener.close()


_ACCEPT_BATCH = 64  # accepts per wake-up before other callbacks get their turn


async def adopt(sock: socket.socket, protocol: asyncio.Protocol) -> asyncio.Transport:
    """Wrap the connected ``sock`` in a transport driving ``protocol``; it owns the socket now.

    uvloop ties ``sock`` to its transport only once ``connection_made`` has run: a transport
    closed before that (an abort from ``connection_made``, or from a callback in between, e.g.
    the stream reset while we connected) closes the descriptor while ``sock`` still holds its
    number, and ``sock`` closes that number again when collected, by then maybe another
    connection's (a rapid-reset flood broke unrelated connections with EBADF this way). The
    transport's descriptor is libuv's from the start, so ``sock`` lets go of it at once.
    """
    loop = asyncio.get_running_loop()
    transport, _ = await loop.create_connection(lambda: protocol, sock=sock)
    if transport.get_extra_info("socket") is not sock:  # asyncio's own loop uses sock itself
        sock.detach()
    return transport


async def dial(
    sock: socket.socket, addr: tuple[str, int], protocol: asyncio.Protocol, timeout: float
) -> asyncio.Transport:
    """``connect`` then ``adopt``; on failure the socket is closed and the error raised."""
    try:
        await connect(sock, addr, timeout)
        return await adopt(sock, protocol)
    except (OSError, TimeoutError):
        sock.close()  # a no-op once adopt's transport owns (and closed) the descriptor
        raise


async def connect(sock: socket.socket, addr: tuple[str, int], timeout: float) -> None:
    """Connect the non-blocking ``sock`` to the numeric address ``addr`` within ``timeout`` s.

    Not ``loop.sock_connect``: uvloop resolves even a literal IP through getaddrinfo on its
    thread pool first, a thread hop per connection (7% of the inbound proxy's CPU, profiled).
    """
    err = sock.connect_ex(addr)
    if err in (errno.EINPROGRESS, errno.EAGAIN):
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        fd = sock.fileno()

        def writable() -> None:
            if not done.done():
                done.set_result(None)

        loop.add_writer(fd, writable)
        try:
            async with asyncio.timeout(timeout):
                await done
        finally:
            loop.remove_writer(fd)
        err = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    if err:
        raise OSError(err, os.strerror(err))
