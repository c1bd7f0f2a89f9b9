"""Pooled HBONE client connections, keyed by (source identity, destination identity, address).

Owns dialling (TCP, TLS 1.3 + ALPN h2, the peer identity check) and sharing connections: a new
stream goes to an established connection with room (up to ``max_streams``, or the peer's lower
SETTINGS_MAX_CONCURRENT_STREAMS), else to a dial in progress with room, else to a new dial. A
connection with no streams is released after ``idle_timeout``. Invariants: a dial that fails
(including a peer whose certificate does not carry the expected identity) fails every stream
waiting on it, once; nothing retries it, so a bad peer cannot make us loop; a connection that
got GOAWAY or failed leaves the pool at once.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass, field

from meshctl.core.pki.identity import IdentityError, SpiffeId, peer_identity
from meshctl.core.wire.hbone import TunnelSettings

from . import tls
from .relay import connect
from .tunnel import TunnelProtocol

log = logging.getLogger(__name__)

PoolKey = tuple[SpiffeId, SpiffeId, tuple[str, int]]


class DialError(ConnectionError):
    """A pooled connection could not be set up; ``flags`` is the metric's response flag."""

    def __init__(self, message: str, flags: str) -> None:
        super().__init__(message)
        self.flags = flags


@dataclass(slots=True)
class _Dial:
    task: asyncio.Task[TunnelProtocol]
    reserved: int = 1


@dataclass(slots=True)
class _Entry:
    conns: list[TunnelProtocol] = field(default_factory=list)
    dials: list[_Dial] = field(default_factory=list)


class Pool:
    """HBONE connections shared by outbound streams."""

    def __init__(
        self,
        *,
        contexts: Callable[[], tls.TlsContexts],
        settings: TunnelSettings,
        max_streams: int,
        idle_timeout: float,
        connect_timeout: float,
        handshake_timeout: float,
        new_socket: Callable[[str], socket.socket],
    ) -> None:
        self._contexts = contexts
        self._settings = settings
        self._max_streams = max_streams
        self._idle_timeout = idle_timeout
        self._connect_timeout = connect_timeout
        self._handshake_timeout = handshake_timeout
        self._new_socket = new_socket  # a non-blocking TCP socket for an address (marked)
        self._entries: dict[PoolKey, _Entry] = {}
        self._idle: dict[TunnelProtocol, asyncio.TimerHandle] = {}

    @property
    def connections(self) -> int:
        return sum(len(e.conns) for e in self._entries.values())

    async def connection(self, key: PoolKey) -> TunnelProtocol:
        """A connection with room for one more stream to ``key``; raises ``DialError``."""
        while True:
            entry = self._entries.setdefault(key, _Entry())
            for conn in entry.conns:
                if conn.usable and conn.core.can_open():
                    self._busy(conn)
                    return conn
            dial = next((d for d in entry.dials if d.reserved < self._max_streams), None)
            if dial is None:
                dial = _Dial(asyncio.ensure_future(self._dial(key)))
                entry.dials.append(dial)
            else:
                dial.reserved += 1
            try:
                conn = await asyncio.shield(dial.task)
            except DialError:
                raise
            except Exception as exc:  # unexpected: surface as a dial failure, once
                raise DialError(f"dial failed: {exc}", "CONNECT") from exc
            finally:
                if dial in entry.dials and dial.task.done():
                    entry.dials.remove(dial)
            if conn.usable and conn.core.can_open():
                self._busy(conn)
                return conn
            if not conn.usable:
                # It died between its handshake and our first stream. In TLS 1.3 that is how a
                # peer refuses our certificate (our side of the handshake completes first):
                # fail the streams that waited for it, never dial the same peer again for them.
                _, _, addr = key
                raise DialError(f"{addr[0]}:{addr[1]}: {conn.error or 'closed'}", conn.flags)
            # The peer allows fewer streams than we reserved: go round and dial another.

    async def _dial(self, key: PoolKey) -> TunnelProtocol:
        _, dst_id, addr = key
        loop = asyncio.get_running_loop()
        ctx = self._contexts().client
        entry = self._entries[key]

        def on_connected(proto: TunnelProtocol) -> bool:
            obj = proto.extra_info("ssl_object")
            if tls.alpn(obj) != tls.ALPN_H2:
                proto.error = f"{addr[0]}:{addr[1]} did not negotiate ALPN h2"
                return False
            try:
                proto.peer = peer_identity(tls.uri_sans(obj), trust_domain=None, expected=[dst_id])
            except IdentityError as exc:
                # Also the GOAWAY's debug data: the server's logs name both identities.
                proto.error = f"server identity refused: {exc}"
                return False
            return True

        def on_closed(proto: TunnelProtocol) -> None:
            self._remove(key, proto)

        sock = self._new_socket(addr[0])
        try:
            await connect(sock, addr, self._connect_timeout)
        except (OSError, TimeoutError) as exc:
            sock.close()
            hint = "is the destination's proxy listening, or a NetworkPolicy blocking port 15008?"
            raise DialError(
                f"cannot reach {addr[0]}:{addr[1]}: {exc or 'timeout'}; {hint}", "CONNECT"
            ) from exc

        def factory() -> TunnelProtocol:
            return TunnelProtocol(
                client=True,
                settings=self._settings,
                on_connected=on_connected,
                on_idle=lambda p: self._idle_later(key, p),
                on_closed=on_closed,
            )

        try:
            _, proto = await asyncio.wait_for(
                loop.create_connection(
                    factory,
                    sock=sock,
                    ssl=ctx,
                    server_hostname="",  # no SNI: HBONE peers are identified by SAN alone
                    ssl_handshake_timeout=self._handshake_timeout,
                    ssl_shutdown_timeout=self._handshake_timeout,  # waiting for close_notify
                ),
                self._handshake_timeout + 1,
            )
        except (OSError, ssl.SSLError, TimeoutError) as exc:
            sock.close()
            raise DialError(
                f"TLS with {addr[0]}:{addr[1]} failed: {exc or 'timeout'}", "TLS"
            ) from exc
        try:
            await proto.connected
        except ConnectionError as exc:
            raise DialError(f"{addr[0]}:{addr[1]}: {proto.error or exc}", "TLS") from exc
        entry.conns.append(proto)
        log.debug("pooled HBONE connection to %s:%d (%s)", addr[0], addr[1], dst_id)
        return proto

    def _busy(self, conn: TunnelProtocol) -> None:
        timer = self._idle.pop(conn, None)
        if timer is not None:
            timer.cancel()

    def _idle_later(self, key: PoolKey, conn: TunnelProtocol) -> None:
        if conn.core.closed is not None or conn.core.going_away:
            self._remove(key, conn)
            conn.close()
            return
        if conn in self._idle:
            return
        loop = asyncio.get_running_loop()
        self._idle[conn] = loop.call_later(self._idle_timeout, self._release, key, conn)

    def _release(self, key: PoolKey, conn: TunnelProtocol) -> None:
        self._idle.pop(conn, None)
        if not conn.sinks:
            self._remove(key, conn)
            conn.close()

    def _remove(self, key: PoolKey, conn: TunnelProtocol) -> None:
        entry = self._entries.get(key)
        if entry is not None and conn in entry.conns:
            entry.conns.remove(conn)
            if not entry.conns and not entry.dials:
                del self._entries[key]
        timer = self._idle.pop(conn, None)
        if timer is not None:
            timer.cancel()

    def drain(self) -> None:
        """GOAWAY every pooled connection; open streams finish, idle ones close."""
        for key, entry in list(self._entries.items()):
            for conn in list(entry.conns):
                self._remove(key, conn)
                if conn.sinks:
                    conn.goaway()
                else:
                    conn.close()
