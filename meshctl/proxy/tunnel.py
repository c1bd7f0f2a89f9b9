"""The I/O shell around a sans-IO ``HboneConnection``: one asyncio protocol per TLS connection.

Owns the socket side of an HBONE connection: bytes from the TLS transport go into the core, and
after *every* call into the core a write of its pending output is scheduled, when it has any
(WINDOW_UPDATEs produced outside the receive path are otherwise left queued and the tunnel
stalls; a read that only delivered DATA schedules nothing). Small
frames are written once per event-loop iteration, after every callback of that iteration has
run: what the streams of one connection produce together (HEADERS, small DATA, END_STREAM)
leaves as one TLS record and one send instead of one of each; bulk DATA, WINDOW_UPDATEs and
a closing GOAWAY go at once. Streams are delivered to a
``StreamSink`` each; the shell never interprets tunnel bytes. Invariants: the first transport
error is kept and every stream is reset with it; when the TLS transport's write buffer is full,
app sources feeding this connection are paused and resumed together.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any, Protocol, cast

from meshctl.core.wire.hbone import (
    ConnectionClosed,
    DataReceived,
    Event,
    HboneConnection,
    StreamEnded,
    StreamReset,
    TunnelOpened,
    TunnelRefused,
    TunnelRejected,
    TunnelRequested,
    TunnelSettings,
    Writable,
)
from meshctl.core.wire.hbone.frames import ErrorCode

from . import tls

log = logging.getLogger(__name__)

# The reset reason of a stream the peer never processed (REFUSED_STREAM, RFC 9113 §8.7: above the
# last stream id of its GOAWAY, or beyond its stream limit): safe to open again elsewhere.
REFUSED_REASON = f"stream reset (code {int(ErrorCode.REFUSED_STREAM)})"


class StreamSink(Protocol):
    """The owner of one tunnel stream (the app side of the relay)."""

    def tunnel_opened(self) -> None: ...
    def tunnel_refused(self, status: int) -> None: ...
    def tunnel_data(self, data: bytes | memoryview, flow: int) -> None: ...
    def tunnel_ended(self) -> None: ...
    def tunnel_reset(self, reason: str) -> None: ...
    def tunnel_writable(self) -> None: ...


class Pausable(Protocol):
    def pause_source(self) -> None: ...
    def resume_source(self) -> None: ...


READ_BUFFER = 256 * 1024  # what uvloop's TLS transport decrypts per read at most


class TunnelProtocol(asyncio.BufferedProtocol):
    """An HBONE connection over an asyncio (TLS) transport, client or server side.

    A BufferedProtocol: the TLS transport decrypts straight into one buffer per connection,
    reused for every read (trap 1 of the performance notes: a fresh 256 KiB bytes object per
    read otherwise), and the core copies out only what it keeps.
    """

    def __init__(
        self,
        *,
        client: bool,
        settings: TunnelSettings,
        on_connected: Callable[[TunnelProtocol], bool] | None = None,
        on_request: Callable[[TunnelProtocol, TunnelRequested], None] | None = None,
        on_rejected: Callable[[TunnelProtocol, TunnelRejected], None] | None = None,
        on_idle: Callable[[TunnelProtocol], None] | None = None,
        on_closed: Callable[[TunnelProtocol], None] | None = None,
    ) -> None:
        self.core = HboneConnection(client=client, settings=settings)
        self.transport: asyncio.Transport | None = None
        self.sinks: dict[int, StreamSink] = {}
        self.error: str | None = None  # the first failure, reported to every later stream
        self.write_paused = False
        self._paused_sources: set[Pausable] = set()
        self._on_connected = on_connected
        self._on_request = on_request
        self._on_rejected = on_rejected
        self._on_idle = on_idle
        self._on_closed = on_closed
        self._loop = asyncio.get_running_loop()
        self._flush_scheduled = False
        # Never empty (trap 5: a read can be asked for before pause_reading takes effect).
        self._read_buffer = memoryview(bytearray(READ_BUFFER))
        self.peer: object = None  # whatever on_connected learnt (the peer identity)
        self.connected = asyncio.get_running_loop().create_future()
        self.refused = False  # on_connected refused the peer (identity, ALPN)
        self._heard = False  # any bytes from the peer after the handshake

    # -- asyncio callbacks -------------------------------------------------------------------

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = transport = cast(asyncio.Transport, transport)
        if self._on_connected is not None and not self._on_connected(self):
            self.error = self.error or "peer refused by identity check"
            self.refused = True
            if not self.connected.done():  # the dialler learns now, not after the TLS close
                self.connected.set_exception(ConnectionError(self.error))
                self.connected.exception()
            if tls.alpn(self.extra_info("ssl_object")) == tls.ALPN_H2:
                # Tell the peer why (it speaks HTTP/2): GOAWAY with the reason as debug data.
                self.core.refuse_peer(self.error)
                self._flush_now()
            transport.close()  # TLS close_notify after what was written, then TCP FIN
            return
        self._flush()
        if not self.connected.done():
            self.connected.set_result(None)

    def get_buffer(self, sizehint: int) -> memoryview:
        return self._read_buffer

    def buffer_updated(self, nbytes: int) -> None:
        self._heard = True
        self.data_received(self._read_buffer[:nbytes])

    def data_received(self, data: bytes | memoryview) -> None:
        try:
            for ev in self.core.receive(data, self._loop.time()):
                self._dispatch(ev)
        finally:
            self._flush()  # what the read and the events' handlers queued, together

    def eof_received(self) -> bool:
        return False  # TLS close_notify / TCP FIN on the tunnel: the connection is over

    def connection_lost(self, exc: Exception | None) -> None:
        if self.error is None and not self._heard:
            # Not one HTTP/2 byte (the peer's SETTINGS come first) after our handshake: the
            # peer ended the connection at the TLS layer, as one refusing our certificate does.
            why = f": {exc}" if exc else ""
            self.error = f"peer closed the connection before speaking HTTP/2{why}"
            self.error += " (did it refuse our certificate?)" if self.core.client else ""
        self.error = self.error or (f"connection lost: {exc}" if exc else "connection closed")
        if not self.connected.done():
            self.connected.set_exception(ConnectionError(self.error))
            self.connected.exception()  # only a dialling pool waits on it; never "unretrieved"
        sinks, self.sinks = self.sinks, {}
        for sink in sinks.values():
            sink.tunnel_reset(self.error)
        for source in list(self._paused_sources):
            source.resume_source()
        self._paused_sources.clear()
        if self._on_closed is not None:
            self._on_closed(self)

    def pause_writing(self) -> None:
        self.write_paused = True

    def resume_writing(self) -> None:
        self.write_paused = False
        sources, self._paused_sources = self._paused_sources, set()
        for source in sources:
            source.resume_source()

    # -- used by stream owners ---------------------------------------------------------------

    def extra_info(self, name: str) -> Any:
        """``get_extra_info(name)`` of the TLS transport, or None before it exists."""
        return self.transport.get_extra_info(name) if self.transport is not None else None

    @property
    def flags(self) -> str:
        """The response flag for streams this connection failed: ``TLS`` when the peer was
        refused, or ended the connection before speaking HTTP/2; else ``RESET``."""
        return "TLS" if self.refused or not self._heard else "RESET"

    @property
    def usable(self) -> bool:
        t = self.transport
        return (
            t is not None and not t.is_closing() and self.error is None and not self.core.going_away
        )

    def open(self, authority: str, headers: list[tuple[str, str]], sink: StreamSink) -> int:
        sid = self.core.open(authority, headers)
        self.sinks[sid] = sink
        self._flush()
        return sid

    def attach(self, sid: int, sink: StreamSink) -> None:
        self.sinks[sid] = sink

    def respond(self, sid: int, status: int) -> None:
        if self.core.closed is not None and self.core.closed.remote:
            return
        self.core.respond(sid, status)
        if status != 200:
            self.sinks.pop(sid, None)
        self._flush()
        self._check_idle()

    def send(self, sid: int, data: bytes, source: Pausable) -> None:
        """Queue bytes; pauses ``source`` when the stream or the connection is backed up."""
        if sid not in self.sinks:
            return
        more = self.core.send(sid, data)
        self._flush()
        if not more:
            source.pause_source()  # resumed by the stream's Writable event
        elif self.write_paused:
            self._paused_sources.add(source)
            source.pause_source()

    def end(self, sid: int) -> None:
        if sid in self.sinks:
            self.core.end(sid)
            self._flush()

    def reset(self, sid: int) -> None:
        if self.sinks.pop(sid, None) is not None:
            self.core.reset(sid)
            self._flush()
            self._check_idle()

    def consumed(self, sid: int, flow: int) -> None:
        if self.core.consumed(sid, flow):
            # A WINDOW_UPDATE goes at once: the sender may be waiting for it; deferring it by
            # one loop iteration cost 15% of single-stream throughput (smaller frames, stalls).
            self._flush_now()

    def finished(self, sid: int) -> None:
        """The stream's owner is done with it (both directions ended)."""
        self.sinks.pop(sid, None)
        self._check_idle()

    def goaway(self) -> None:
        """Refuse new streams; open ones may finish (drain)."""
        self.core.go_away()
        self._flush()
        self._check_idle()

    def close(self) -> None:
        if self.transport is not None:
            self.core.close()
            self._flush_now()  # the GOAWAY goes out before the transport closes
            self.transport.close()

    # -- internals ---------------------------------------------------------------------------

    def _flush(self) -> None:
        """Write the core's output at the end of this loop iteration (once, however often
        called): ``call_soon`` runs after the callbacks already queued for this iteration.

        Bulk payloads go at once: they gain nothing from coalescing, and a bulk sender is best
        kept streaming; small frames (HEADERS, small DATA, END_STREAM) are what coalescing is
        for (-20% proxy CPU per connection in the bench).
        """
        core = self.core
        if core.bulk_output:
            self._flush_now()
        elif not self._flush_scheduled and core.has_output:
            # Nothing queued (a read that only delivered DATA to its streams): no callback at
            # all; it was two of the eight per 1 KiB round trip, each a loop handle and a call.
            self._flush_scheduled = True
            self._loop.call_soon(self._flush_now)

    def _flush_now(self) -> None:
        self._flush_scheduled = False
        out = self.core.buffers_to_send()
        if out and self.transport is not None and not self.transport.is_closing():
            if len(out) == 1:
                self.transport.write(out[0])
            else:
                self.transport.writelines(out)  # payloads by reference, never joined

    def _dispatch(self, ev: Event) -> None:  # noqa: PLR0912 (one branch per event kind)
        if isinstance(ev, DataReceived):
            sink = self.sinks.get(ev.stream_id)
            if sink is None:
                self.consumed(ev.stream_id, ev.flow)
            else:
                sink.tunnel_data(ev.data, ev.flow)
        elif isinstance(ev, TunnelRequested):
            if self._on_request is not None:
                self._on_request(self, ev)
            else:
                self.core.respond(ev.stream_id, 400)
        elif isinstance(ev, StreamEnded):
            sink = self.sinks.get(ev.stream_id)
            if sink is not None:
                sink.tunnel_ended()
        elif isinstance(ev, Writable):
            sink = self.sinks.get(ev.stream_id)
            if sink is not None:
                sink.tunnel_writable()
        elif isinstance(ev, TunnelOpened):
            sink = self.sinks.get(ev.stream_id)
            if sink is not None:
                sink.tunnel_opened()
        elif isinstance(ev, TunnelRefused):
            sink = self.sinks.pop(ev.stream_id, None)
            if sink is not None:
                sink.tunnel_refused(ev.status)
            self._check_idle()
        elif isinstance(ev, StreamReset):
            sink = self.sinks.pop(ev.stream_id, None)
            if sink is not None:
                sink.tunnel_reset(f"stream reset (code {int(ev.error_code)})")
            self._check_idle()
        elif isinstance(ev, TunnelRejected):
            if self._on_rejected is not None:
                self._on_rejected(self, ev)
        elif isinstance(ev, ConnectionClosed):
            self._closed(ev)

    def _closed(self, ev: ConnectionClosed) -> None:
        level = logging.WARNING if ev.error_code else logging.DEBUG
        log.log(level, "HBONE connection closing: %s (HTTP/2 error %d)", ev.reason, ev.error_code)
        if ev.error_code != 0:
            self.error = f"{ev.reason} (HTTP/2 error {ev.error_code})"
            self._flush_now()
            if self.transport is not None:
                self.transport.close()  # flushes the GOAWAY, then connection_lost resets streams
        else:
            self._check_idle()

    def _check_idle(self) -> None:
        if not self.sinks and self._on_idle is not None:
            self._on_idle(self)
