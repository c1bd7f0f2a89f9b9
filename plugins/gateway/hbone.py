"""The gateway's way into the mesh: an HTTP/1.1 connection to a meshed endpoint carried in an
HBONE stream (HTTP/2 CONNECT to ``address:port`` through the workload's port 15008, mTLS with
the gateway's own SPIFFE certificate (``identity.py``), the peer's identity checked), on the
shared proxy kit's pool (``meshctl.proxy.pool``: one TLS connection per destination, many
streams).

Owns ``HboneStream`` (one CONNECT stream as the upstream client's reader and ``Writer``) and
``HboneDialer``. Invariants: a stream the peer refuses (non-200) or a peer whose certificate
does not carry the endpoint's identity is a connect failure (the forwarder tries the next
endpoint, 503 when none is left); flow-control credit goes back as the client reads.
"""

from __future__ import annotations

import asyncio
import socket
from collections.abc import Callable

from meshctl.core.pki.identity import SpiffeId
from meshctl.core.wire import channel
from meshctl.core.wire.hbone import TunnelSettings
from meshctl.proxy import tls
from meshctl.proxy.pool import DialError, Pool
from meshctl.proxy.tunnel import TunnelProtocol

from .upstream import Writer

HBONE_PORT = 15008


class _CreditReader(asyncio.StreamReader):
    """A reader that gives the tunnel its flow-control credit back as bytes are read, so a slow
    client slows the backend instead of growing our buffer."""

    def __init__(self, stream: HboneStream) -> None:
        super().__init__(limit=2**16)
        self._stream = stream

    async def read(self, n: int = -1) -> bytes:
        data = await super().read(n)
        self._stream.credit(len(data))
        return data


class HboneStream:
    """One CONNECT stream: a ``StreamSink`` for the tunnel, a reader and a ``Writer`` for us."""

    def __init__(self, tunnel: TunnelProtocol) -> None:
        self.tunnel = tunnel
        self.sid = 0
        self.owed = 0  # flow-control bytes received and not yet given back
        self.reader: asyncio.StreamReader = _CreditReader(self)
        self.opened: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._writable = asyncio.Event()
        self._writable.set()
        self.ended = False

    # --- the tunnel's side (StreamSink, Pausable) ----------------------------------------------

    def tunnel_opened(self) -> None:
        if not self.opened.done():
            self.opened.set_result(None)

    def tunnel_refused(self, status: int) -> None:
        self.ended = True
        if not self.opened.done():
            self.opened.set_exception(ConnectionRefusedError(f"HBONE CONNECT answered {status}"))

    def tunnel_data(self, data: bytes | memoryview, flow: int) -> None:
        self.reader.feed_data(bytes(data))
        self.owed += len(data)
        if flow > len(data):  # padding: nobody reads it, its credit goes back now
            self.tunnel.consumed(self.sid, flow - len(data))

    def credit(self, read: int) -> None:
        """``read`` bytes left the reader: that much credit goes back to the tunnel."""
        give = min(self.owed, read)
        if give > 0 and not self.ended:
            self.owed -= give
            self.tunnel.consumed(self.sid, give)

    def tunnel_ended(self) -> None:
        self.reader.feed_eof()

    def tunnel_reset(self, reason: str) -> None:
        self.ended = True
        error = ConnectionResetError(f"HBONE stream reset: {reason}")
        if not self.opened.done():
            self.opened.set_exception(error)
        self.reader.set_exception(error)
        self._writable.set()

    def tunnel_writable(self) -> None:
        self._writable.set()

    def pause_source(self) -> None:
        self._writable.clear()

    def resume_source(self) -> None:
        self._writable.set()

    # --- ours (Writer) -------------------------------------------------------------------------

    def write(self, data: bytes) -> None:
        if self.ended:
            raise ConnectionResetError("HBONE stream ended")
        self.tunnel.send(self.sid, data, self)

    def writelines(self, data: list[bytes]) -> None:
        self.write(b"".join(data))

    async def drain(self) -> None:
        await self._writable.wait()
        if self.ended:
            raise ConnectionResetError("HBONE stream ended")

    def write_eof(self) -> None:
        """Half-close: END_STREAM on our side; the backend's bytes keep coming."""
        if not self.ended:
            self.tunnel.end(self.sid)

    def is_closing(self) -> bool:
        return self.ended or not self.tunnel.usable

    def close(self) -> None:
        if not self.ended:
            if self.owed:  # unread bytes: the connection's shared window gets them back
                self.tunnel.consumed(self.sid, self.owed)
                self.owed = 0
            self.ended = True
            self.tunnel.end(self.sid)
            self.tunnel.finished(self.sid)

    def abort(self) -> None:
        if not self.ended:
            self.ended = True
            self.tunnel.reset(self.sid)


class HboneDialer:
    """Dials endpoints through HBONE as ``identity`` with the certificate ``certs`` gives (a
    new generation makes new contexts: new connections use it, pooled ones keep theirs)."""

    def __init__(
        self,
        *,
        identity: SpiffeId,
        certs: Callable[[], channel.Certs | None],
        connect_timeout: float = 5.0,
        handshake_timeout: float = 5.0,
    ) -> None:
        self.identity = identity
        self.certs = certs
        self._contexts: tls.TlsContexts | None = None
        self.connect_timeout = connect_timeout
        self.pool = Pool(
            contexts=self.contexts,
            settings=TunnelSettings(),
            max_streams=100,
            idle_timeout=300.0,
            connect_timeout=connect_timeout,
            handshake_timeout=handshake_timeout,
            new_socket=_new_socket,
        )

    def contexts(self) -> tls.TlsContexts:
        certs = self.certs()
        if certs is None:
            raise DialError(
                f"no certificate for {self.identity} yet (the CA has not answered)", "TLS"
            )
        if self._contexts is None or self._contexts.generation != certs.generation:
            self._contexts = tls.build(certs)
        return self._contexts

    def for_peer(self, identity: str) -> HboneDial:
        return HboneDial(self, SpiffeId.parse(identity))


class HboneDial:
    """The ``Dialer`` for endpoints of one identity."""

    def __init__(self, dialer: HboneDialer, peer: SpiffeId) -> None:
        self.dialer, self.peer = dialer, peer

    async def __call__(self, host: str, port: int) -> tuple[asyncio.StreamReader, Writer]:
        tunnel = await self.dialer.pool.connection(
            (self.dialer.identity, self.peer, (host, HBONE_PORT))
        )
        stream = HboneStream(tunnel)
        authority = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        stream.sid = tunnel.open(authority, [], stream)
        await asyncio.wait_for(asyncio.shield(stream.opened), self.dialer.connect_timeout)
        return stream.reader, stream


def _new_socket(address: str) -> socket.socket:
    family = socket.AF_INET6 if ":" in address else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setblocking(False)
    return sock
