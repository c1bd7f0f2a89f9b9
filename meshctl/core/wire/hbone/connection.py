"""A sans-IO HBONE connection: HTTP/2 CONNECT tunnels (RFC 9113 §8.5) over one HTTP/2 connection.

Owns, for either side: the HTTP/2 connection HBONE needs (framing, stream states, flow control,
SETTINGS, PING, GOAWAY; RFC 9113 §4-§6, header compression by ``hpack``), the CONNECT exchange
(client: ``open``/``TunnelOpened``; server: ``TunnelRequested``/``respond``), per-stream byte
queues, half-close, and the abuse budgets. Bytes go in through ``receive``; events come out;
bytes to write come out of ``data_to_send``/``buffers_to_send``. Invariants:
- Every call may queue output: the shell must write the output after *any* call (a
  WINDOW_UPDATE made by ``consumed`` outside the receive path stalls the tunnel if left queued).
- Outbound bytes beyond the peer's stream or connection window are held per stream and sent on
  WINDOW_UPDATE, each waiting stream in turn (the connection window is shared); END_STREAM goes
  out only after a stream's held bytes.
- Inbound windows are returned only through ``consumed`` (bytes that left the process), so a slow
  reader backpressures the peer instead of growing memory.
- Every header block the peer sends is decoded, refused streams' too (HPACK is one state for
  the connection); nothing returned or kept refers to a buffer passed to ``receive``.
- Local misuse raises ``TunnelStateError``; a stream-level fault of the peer resets that stream
  (a ``StreamReset``); a connection-level one queues GOAWAY with the RFC's error code and ends as
  ``ConnectionClosed(remote=True)``. Nothing the peer sends raises.
- A stream the peer ended (reset, refused, or gone with the connection) is an event, never an
  error: ``send``/``end``/``respond``/``reset`` on it are no-ops, because the shell may still
  hold it while it dispatches the events of the read that ended it. Only an id this connection
  never used is misuse.

Why one file, above the house's ~600 lines: this is one state machine. Every frame handler reads
and writes the same connection state (the stream table, both flow-control windows, the HPACK
decoder, the abuse budgets) and the invariants above hold across all of them at once; split by
frame type or by side, each part would reach into the others' private state, and a reader could
no longer check an invariant in one place. The frame codec (``frames``) and the events
(``events``) live beside it, as they share no state.

Why not h2: h2 builds frame objects and runs two state machines per frame, validates and logs
per header, and walks every stream to count open ones; for HBONE's short CONNECT streams that
was most of a proxy's CPU per connection. The unit tests drive this code against h2 as an
independent peer, the interop tests against Node.js's nghttp2, and a Hypothesis fuzz feeds it
arbitrary frame sequences.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

import hpack
from hpack import NeverIndexedHeaderTuple

from meshctl.core.wire.hbone import frames as f
from meshctl.core.wire.hbone.events import (
    ConnectionClosed,
    DataReceived,
    Event,
    StreamEnded,
    StreamReset,
    TunnelOpened,
    TunnelRefused,
    TunnelRejected,
    TunnelRequested,
    Writable,
)
from meshctl.core.wire.hbone.frames import ErrorCode
from meshctl.core.wire.hbone.headers import parse_authority

DEFAULT_WINDOW = 4 * 1024 * 1024  # ztunnel's HTTP2_STREAM_WINDOW_SIZE / CONNECTION_WINDOW_SIZE
DEFAULT_FRAME = 1024 * 1024  # ztunnel's HTTP2_FRAME_SIZE
_PER_STREAM = frozenset({b"forwarded"})  # header values that differ on every stream
_DEBUG_LIMIT = 512  # GOAWAY debug data we send or show: a reason, not a payload
_HEADER_LIST_LIMIT = 64 * 1024  # SETTINGS_MAX_HEADER_LIST_SIZE we announce and enforce
_HEADER_BLOCK_LIMIT = 64 * 1024  # compressed bytes of one header block (HEADERS+CONTINUATION)
_HEADER_TABLE_LIMIT = 64 * 1024  # the most HPACK table we keep for a peer that asks for more
# DATA payloads at least this large leave by reference (no copy); smaller frames are joined
# with their neighbours so a 1 KiB message stays one TLS record.
_BY_REFERENCE = 16 * 1024
# RFC 9113 §8.2.2: fields that are connection-specific in HTTP/1.1 make a message malformed.
_CONNECTION_SPECIFIC = frozenset(
    {b"connection", b"keep-alive", b"proxy-connection", b"transfer-encoding", b"upgrade"}
)
_REQUEST_PSEUDO = frozenset({b":method", b":scheme", b":authority", b":path", b":protocol"})
_BAD_VALUE_BYTES = (b"\r", b"\n", b"\0")  # §8.2.1: never valid in a field name or value
_PEER_WINDOW_START = f.DEFAULT_WINDOW


class TunnelStateError(RuntimeError):
    """The caller used a stream in a way its state forbids (a bug on our side, not the peer's)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class TunnelSettings:
    """HTTP/2 parameters and abuse budgets for one HBONE connection."""

    stream_window: int = DEFAULT_WINDOW
    connection_window: int = 4 * DEFAULT_WINDOW  # shared by up to 100 streams
    max_frame_size: int = DEFAULT_FRAME
    max_concurrent_streams: int = 100  # the pool's streams per connection; the server's limit
    # A stream holding this many unsent bytes asks its reader to pause; it resumes below low.
    high_water: int = 2 * DEFAULT_WINDOW
    low_water: int = DEFAULT_WINDOW // 2
    # Abuse budgets, as token buckets: burst and refill per second. Exceeding one sends GOAWAY
    # ENHANCE_YOUR_CALM. Peer resets cover HTTP/2 rapid reset (CVE-2023-44487); control frames
    # cover SETTINGS and PING floods (each one makes us queue an ACK).
    reset_burst: int = 200
    reset_rate: float = 100.0
    control_burst: int = 200
    control_rate: float = 100.0


@dataclass(slots=True)
class _Bucket:
    capacity: float
    rate: float
    tokens: float
    stamp: float | None = None

    def take(self, now: float) -> bool:
        if self.stamp is not None:
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


@dataclass(slots=True)
class _Stream:
    stream_id: int
    send_window: int  # what the peer lets us send on it (may go negative on a SETTINGS cut)
    recv_window: int  # what we let the peer send on it
    opened: bool = False  # 200 sent (server) or received (client)
    held: deque[bytes] = field(default_factory=deque)
    held_len: int = 0
    end_wanted: bool = False
    local_ended: bool = False
    remote_ended: bool = False
    blocked: bool = False  # told the shell to pause (held_len crossed high water)
    unacked: int = 0  # consumed bytes not yet returned to the peer by WINDOW_UPDATE


class _PeerError(Exception):
    """The peer broke the protocol for the whole connection (RFC 9113 §5.4.1)."""

    def __init__(self, code: ErrorCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code
        self.reason = reason


class _MalformedError(ValueError):
    """A header block that is not a valid HTTP message (RFC 9113 §8.1.1)."""


class HboneConnection:
    """One HTTP/2 connection carrying HBONE tunnels; ``client=True`` for the initiating side."""

    def __init__(self, *, client: bool, settings: TunnelSettings | None = None) -> None:
        self.client = client
        self.settings = s = settings or TunnelSettings()
        self._streams: dict[int, _Stream] = {}
        self._closed: ConnectionClosed | None = None
        self._going_away = False
        self._resets = _Bucket(s.reset_burst, s.reset_rate, s.reset_burst)
        self._control = _Bucket(s.control_burst, s.control_rate, s.control_burst)
        # Output: frames joined in ``_small``; a large DATA payload ends the current join and
        # goes into ``_out`` by reference, so the order of all frames is kept.
        self._small = bytearray()
        self._out: list[bytes] = []
        # HPACK (RFC 7541): literals without Huffman coding (optional, §5.2): our header blocks
        # are a few short values and pure-Python Huffman coding was half the cost of encoding.
        self._encoder = hpack.Encoder()
        self._decoder = hpack.Decoder(max_header_list_size=_HEADER_LIST_LIMIT)
        # Stream ids (§5.1.1): ours odd on the client, the peer's odd on the server.
        self._next_id = 1 if client else 2
        self._highest_in = 0  # the highest stream id the peer opened
        # What the peer allows us (its SETTINGS) and what we allow it (ours, in force at once:
        # they only raise the defaults, so a peer that has not seen them yet stays within).
        self._peer_stream_window = _PEER_WINDOW_START
        self._peer_max_frame = f.DEFAULT_FRAME
        self._peer_max_streams = 2**31
        self._send_window = f.DEFAULT_WINDOW  # the connection's, shared by all streams
        self._recv_window = s.connection_window
        self._recv_unacked = 0
        # Input state: the client preface (server side), a frame header split by a read, a
        # frame split by a read, a header block awaiting CONTINUATION.
        self._preface_left = 0 if client else len(f.PREFACE)
        self._settings_seen = False  # the peer's first frame must be SETTINGS (§3.4)
        self._head = bytearray()
        self._frame: bytearray | None = None
        self._fill = 0
        self._block: tuple[int, bool, bytearray] | None = None  # (stream, END_STREAM, bytes)
        self._events: list[Event] = []
        self._now = 0.0
        # Our preface: SETTINGS, then the connection window above the default (§6.9.2).
        local = {
            f.INITIAL_WINDOW_SIZE: s.stream_window,
            f.MAX_FRAME_SIZE: s.max_frame_size,
            f.MAX_CONCURRENT_STREAMS: s.max_concurrent_streams,
            f.ENABLE_PUSH: 0,
            f.MAX_HEADER_LIST_SIZE: _HEADER_LIST_LIMIT,
        }
        if client:
            self._small += f.PREFACE
        self._small += f.pack_settings(local)
        extra = s.connection_window - f.DEFAULT_WINDOW
        if extra > 0:
            self._small += f.pack_window_update(0, extra)

    # -- introspection ------------------------------------------------------------------------

    @property
    def closed(self) -> ConnectionClosed | None:
        """Why the connection ended, or None while it is usable."""
        return self._closed

    @property
    def going_away(self) -> bool:
        return self._going_away

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    def can_open(self) -> bool:
        """Whether a new tunnel fits: not closing, ids left, under both sides' stream limits."""
        if self._closed is not None or self._going_away or not self.client:
            return False
        limit = min(self._peer_max_streams, self.settings.max_concurrent_streams)
        return len(self._streams) < limit and self._next_id <= f.STREAM_MASK

    @property
    def bulk_output(self) -> bool:
        """Whether large DATA payloads (>= 16 KiB, kept by reference) wait in the output."""
        return bool(self._out)

    @property
    def has_output(self) -> bool:
        """Whether anything waits to be written (``buffers_to_send`` would return bytes)."""
        return bool(self._small or self._out)

    def held_bytes(self, stream_id: int) -> int:
        stream = self._streams.get(stream_id)
        return stream.held_len if stream else 0

    # -- output ------------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        return b"".join(self.buffers_to_send())

    def buffers_to_send(self) -> list[bytes]:
        """What ``data_to_send`` returns, as a list for ``writelines`` (payloads not copied)."""
        if self._small:
            self._out.append(bytes(self._small))
            self._small.clear()
        out, self._out = self._out, []
        return out

    # -- client side -------------------------------------------------------------------------

    def open(self, authority: str, headers: Iterable[tuple[str, str]] = ()) -> int:
        """Send ``CONNECT authority`` with ``headers``; returns the new stream id."""
        if not self.client:
            raise TunnelStateError("only the client side opens tunnels")
        if not self.can_open():
            raise TunnelStateError("connection cannot take another stream")
        parse_authority(authority)  # refuse to send what our own server would reject
        stream_id = self._next_id
        self._next_id += 2
        request: list[Any] = [(b":method", b"CONNECT"), (b":authority", authority.encode("ascii"))]
        for k, v in headers:
            name, value = k.lower().encode("ascii"), v.encode("latin-1")
            # A value new for every stream (the client's port) would only churn the HPACK
            # table, evicting the values that do repeat (authority, baggage): send it literal.
            request.append(
                NeverIndexedHeaderTuple(name, value) if name in _PER_STREAM else (name, value)
            )
        self._streams[stream_id] = _Stream(
            stream_id, self._peer_stream_window, self.settings.stream_window
        )
        self._send_headers(stream_id, request, end_stream=False)
        return stream_id

    # -- server side -------------------------------------------------------------------------

    def respond(self, stream_id: int, status: int) -> None:
        """Answer a ``TunnelRequested``: 200 opens the tunnel; any other status ends the stream."""
        if self.client:
            raise TunnelStateError("only the server side answers tunnels")
        stream = self._live(stream_id)
        if stream is None:
            return  # the peer reset it (or the connection ended) before our answer
        if stream.opened:
            raise TunnelStateError(f"stream {stream_id} cannot be answered again")
        headers = [(b":status", str(status).encode("ascii"))]
        if status == 200:
            self._send_headers(stream_id, headers, end_stream=False)
            stream.opened = True
            self._flush(stream)
        else:
            self._send_headers(stream_id, headers, end_stream=True)
            self._forget(stream_id)

    # -- both sides --------------------------------------------------------------------------

    def send(self, stream_id: int, data: bytes) -> bool:
        """Queue tunnel bytes; False means "pause the source until ``Writable``".

        Bytes for a stream that is over (the peer reset it) are dropped: there is nobody to
        read them, and the shell learns of the reset from the events it is dispatching.
        """
        stream = self._live(stream_id)
        if stream is None:
            return True
        if stream.end_wanted:
            raise TunnelStateError(f"stream {stream_id} was half-closed; no more data")
        if data:
            stream.held.append(data)
            stream.held_len += len(data)
            if stream.opened:
                self._flush(stream)
        if stream.held_len >= self.settings.high_water:
            stream.blocked = True
            return False
        return True

    def end(self, stream_id: int) -> None:
        """Half-close our direction; END_STREAM follows any held bytes."""
        stream = self._live(stream_id)
        if stream is None:
            return
        stream.end_wanted = True
        if stream.opened:
            self._flush(stream)

    def reset(self, stream_id: int, error_code: int = ErrorCode.CANCEL) -> None:
        """Abort the stream (e.g. the app socket failed); unknown or finished streams are fine."""
        if self._streams.pop(stream_id, None) is None or self._closed is not None:
            return
        self._small += f.pack_rst_stream(stream_id, error_code)

    def consumed(self, stream_id: int, flow: int) -> bool:
        """Return ``flow`` bytes of window: they left this process (written to the app socket).

        A WINDOW_UPDATE goes out once half a window is consumed (for the connection and for the
        stream); True when this call queued one, which a sender may be waiting for.
        """
        if not flow or self._closed is not None:
            return False
        queued = self._give_back(flow)
        stream = self._streams.get(stream_id)
        if stream is not None and not stream.remote_ended:
            stream.unacked += flow
            if stream.unacked >= self.settings.stream_window // 2:
                self._small += f.pack_window_update(stream_id, stream.unacked)
                stream.recv_window += stream.unacked
                stream.unacked = 0
                queued = True
        return queued

    def close(
        self, error_code: int = ErrorCode.NO_ERROR, reason: str = "closed locally", debug: str = ""
    ) -> None:
        """Send GOAWAY and end the connection: every stream is over.

        ``debug`` goes out as the GOAWAY's debug data (RFC 9113 §6.8): what the peer's logs can
        show of why we closed.
        """
        if self._closed is None:
            data = debug.encode("utf-8", "replace")[:_DEBUG_LIMIT]
            self._small += f.pack_goaway(self._highest_in, error_code, data)
            self._closed = ConnectionClosed(error_code=error_code, remote=False, reason=reason)
        self._streams.clear()

    def refuse_peer(self, reason: str) -> None:
        """End the connection because of who the peer is (its certificate's identity).

        GOAWAY INADEQUATE_SECURITY (RFC 9113 §7: the peer's security does not meet our
        requirements) with ``reason`` as debug data, before any stream: the peer's logs then
        say which identity was refused and which was expected, instead of an EOF.
        """
        self.close(ErrorCode.INADEQUATE_SECURITY, reason, debug=reason)

    def go_away(self) -> None:
        """Graceful GOAWAY (RFC 9113 §6.8): open streams finish, new ones are refused."""
        if self._going_away or self._closed is not None:
            return
        self._going_away = True
        self._small += f.pack_goaway(self._highest_in, ErrorCode.NO_ERROR)

    def receive(self, data: bytes | bytearray | memoryview, now: float) -> list[Event]:
        """Feed bytes read from the socket at time ``now`` (seconds, monotonic).

        ``data`` may be a view of a buffer the caller reuses for the next read: nothing
        returned or kept refers to it.
        """
        if self._closed is not None:
            return []
        self._now = now
        # Events made by local calls since the last read (a Writable after ``respond``) come
        # first; the list is handed over and a fresh one collects until the next read.
        events = self._events
        try:
            with memoryview(data) as view:
                self._split(view)
        except _PeerError as exc:
            self._peer_error(exc.code, exc.reason)
        self._events = []
        return events

    # -- input: frames out of reads ------------------------------------------------------------

    def _split(self, view: memoryview) -> None:
        """Cut ``view`` into frames (RFC 9113 §4.1) and handle each; keeps partial ones."""
        pos, end = 0, len(view)
        if self._preface_left:
            take = min(self._preface_left, end)
            start = len(f.PREFACE) - self._preface_left
            if view[:take] != f.PREFACE[start : start + take]:
                raise _PeerError(ErrorCode.PROTOCOL_ERROR, "invalid HTTP/2 connection preface")
            self._preface_left -= take
            pos = take
        while pos < end and self._closed is None:
            if self._frame is not None:  # complete the frame a previous read started
                take = min(len(self._frame) - self._fill, end - pos)
                self._frame[self._fill : self._fill + take] = view[pos : pos + take]
                self._fill += take
                pos += take
                if self._fill < len(self._frame):
                    return
                frame, self._frame = self._frame, None
                self._one(memoryview(frame), owned=True)
                continue
            if self._head or end - pos < f.HEADER_SIZE:
                take = min(f.HEADER_SIZE - len(self._head), end - pos)
                self._head += view[pos : pos + take]
                pos += take
                if len(self._head) < f.HEADER_SIZE:
                    return
                header, self._head = bytes(self._head), bytearray()
                if self._length(header):
                    self._start_frame(header)
                else:  # a header-only frame (SETTINGS ACK, empty DATA): complete already
                    self._one(memoryview(header), owned=True)
                continue
            stop = pos + f.HEADER_SIZE + self._length(view[pos : pos + 3])
            if stop > end:
                self._start_frame(bytes(view[pos : pos + f.HEADER_SIZE]))
                pos += f.HEADER_SIZE
                continue
            self._one(view[pos:stop], owned=False)
            pos = stop

    def _length(self, raw: bytes | memoryview) -> int:
        length = (raw[0] << 16) | (raw[1] << 8) | raw[2]
        if length > self.settings.max_frame_size:  # refused before buffering any of it
            msg = f"received a frame of {length} bytes; the limit is {self.settings.max_frame_size}"
            raise _PeerError(ErrorCode.FRAME_SIZE_ERROR, msg)
        return length

    def _start_frame(self, header: bytes) -> None:
        """A frame whose payload continues in later reads: one buffer of its full size."""
        self._frame = bytearray(f.HEADER_SIZE + self._length(header))
        self._frame[: f.HEADER_SIZE] = header
        self._fill = f.HEADER_SIZE

    def _one(self, frame: memoryview, *, owned: bool) -> None:  # noqa: PLR0912 (one per type)
        """Handle one whole frame; ``owned``: ``frame`` is ours alone (its payload may stay)."""
        kind, flags = frame[3], frame[4]
        sid = int.from_bytes(frame[5:9], "big") & f.STREAM_MASK
        payload = frame[f.HEADER_SIZE :]
        if not self._settings_seen:
            if kind != f.SETTINGS or flags & f.ACK:
                raise _PeerError(ErrorCode.PROTOCOL_ERROR, "the peer's preface is not SETTINGS")
            self._settings_seen = True
        if self._block is not None and (kind != f.CONTINUATION or sid != self._block[0]):
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, "header block interrupted (§6.10)")
        if kind == f.DATA:
            self._data(sid, flags, payload, owned)
        elif kind == f.HEADERS:
            self._headers(sid, flags, payload)
        elif kind == f.WINDOW_UPDATE:
            self._window_update(sid, payload)
        elif kind == f.RST_STREAM:
            self._rst_stream(sid, payload)
        elif kind == f.SETTINGS:
            self._settings(sid, flags, payload)
        elif kind == f.PING:
            self._ping(sid, flags, payload)
        elif kind == f.GOAWAY:
            self._goaway(sid, payload)
        elif kind == f.CONTINUATION:
            self._continuation(sid, flags, payload)
        elif kind == f.PRIORITY:
            self._priority(sid, payload)
        elif kind == f.PUSH_PROMISE:
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, "PUSH_PROMISE, but push is disabled")
        # Any other type is an extension: ignored (§4.1, §5.5).

    # -- input: per frame type -----------------------------------------------------------------

    def _data(self, sid: int, flags: int, payload: memoryview, owned: bool) -> None:
        if not sid:
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, "DATA on stream 0")
        flow = len(payload)
        data = _unpad(payload, flags) if flags & f.PADDED else payload
        if flow > self._recv_window:
            raise _PeerError(ErrorCode.FLOW_CONTROL_ERROR, "DATA beyond the connection window")
        self._recv_window -= flow
        stream = self._streams.get(sid)
        if stream is None or stream.remote_ended:
            if self._idle(sid):
                raise _PeerError(ErrorCode.PROTOCOL_ERROR, f"DATA on idle stream {sid}")
            # Late data for a stream that is over: give the window back so others keep flowing.
            self._give_back(flow)
            if stream is not None:  # after its END_STREAM: the peer's stream error (§5.1)
                self._stream_error(stream.stream_id, ErrorCode.STREAM_CLOSED)
            return
        if flow > stream.recv_window:
            self._give_back(flow)
            self._stream_error(sid, ErrorCode.FLOW_CONTROL_ERROR)
            return
        stream.recv_window -= flow
        if self.client and not stream.opened:  # §8.5: tunnel bytes only after the 2xx
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR)
            return
        if flow:
            kept = data if owned else data.tobytes()
            self._events.append(DataReceived(sid, kept, flow))
        if flags & f.END_STREAM:
            self._remote_end(stream)

    def _headers(self, sid: int, flags: int, payload: memoryview) -> None:
        if not sid:
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, "HEADERS on stream 0")
        block = _unpad(payload, flags) if flags & f.PADDED else payload
        if flags & f.PRIORITY_FLAG:
            if len(block) < 5:
                raise _PeerError(ErrorCode.FRAME_SIZE_ERROR, "HEADERS too short for its priority")
            depends = int.from_bytes(block[:4], "big") & f.STREAM_MASK
            block = block[5:]
            if depends == sid:
                self._decode(bytes(block))  # keep HPACK in step before refusing the stream
                if not self.client and sid % 2:
                    self._highest_in = max(self._highest_in, sid)  # it opened, then failed
                self._stream_error(sid, ErrorCode.PROTOCOL_ERROR)
                return
        if flags & f.END_HEADERS:
            self._header_block(sid, bool(flags & f.END_STREAM), bytes(block))
        else:
            self._block = (sid, bool(flags & f.END_STREAM), bytearray(block))

    def _continuation(self, sid: int, flags: int, payload: memoryview) -> None:
        if self._block is None:
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, "CONTINUATION without HEADERS")
        _, end_stream, block = self._block
        block += payload
        if len(block) > _HEADER_BLOCK_LIMIT:
            raise _PeerError(ErrorCode.ENHANCE_YOUR_CALM, "header block over 64 KiB")
        if flags & f.END_HEADERS:
            self._block = None
            self._header_block(sid, end_stream, bytes(block))

    def _header_block(self, sid: int, end_stream: bool, block: bytes) -> None:
        headers = self._decode(block)
        if not sid % 2 or (self.client and self._idle(sid)):
            # Even ids are server-initiated: push, which we disabled. A client never hears of
            # a stream it did not open.
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, f"HEADERS on stream {sid}")
        stream = self._streams.get(sid)
        if self.client:
            if stream is not None:
                self._response(stream, headers, end_stream)
            return  # a stream we finished: its late answer or trailers need nothing
        if stream is not None:  # trailers (§8.1): they must end the stream
            if not end_stream or stream.remote_ended:
                self._stream_error(sid, ErrorCode.PROTOCOL_ERROR)
            else:
                self._remote_end(stream)
            return
        if sid <= self._highest_in:
            return  # a stream that is over (we answered or reset it)
        self._highest_in = sid
        if self._going_away or len(self._streams) >= self.settings.max_concurrent_streams:
            # After our GOAWAY, or beyond our limit: the peer may retry (§8.7, §5.1.2).
            self._small += f.pack_rst_stream(sid, ErrorCode.REFUSED_STREAM)
            return
        self._request(sid, headers, end_stream)

    def _decode(self, block: bytes) -> list[tuple[bytes, bytes]]:
        try:
            return list(self._decoder.decode(block, raw=True))
        except (hpack.HPACKError, ValueError, IndexError, TypeError) as exc:
            raise _PeerError(ErrorCode.COMPRESSION_ERROR, f"header block: {exc}") from exc

    def _request(self, sid: int, headers: list[tuple[bytes, bytes]], end_stream: bool) -> None:
        try:
            pseudo, extra = _split_headers(headers, request=True)
        except _MalformedError as exc:
            self._reject(sid, f"malformed request: {exc}")
            return
        method = pseudo.get(b":method", b"").decode("latin-1")
        if method != "CONNECT":
            self._reject(sid, f"method {method!r} is not CONNECT")
            return
        if b":scheme" in pseudo or b":path" in pseudo or b":protocol" in pseudo:
            # RFC 9113 §8.5: a CONNECT has neither; extended CONNECT (RFC 8441) is not HBONE.
            self._reject(sid, "CONNECT with :scheme, :path or :protocol")
            return
        try:
            authority = parse_authority(pseudo.get(b":authority", b"").decode("latin-1"))
        except ValueError as exc:
            self._reject(sid, str(exc))
            return
        stream = self._streams[sid] = _Stream(
            sid, self._peer_stream_window, self.settings.stream_window
        )
        self._events.append(TunnelRequested(sid, authority, extra))
        if end_stream:
            self._remote_end(stream)

    def _reject(self, sid: int, reason: str) -> None:
        """Answer 400 and end our side; the verdict is reported (and counted) by the shell."""
        self._send_headers(sid, [(b":status", b"400")], end_stream=True)
        self._events.append(TunnelRejected(sid, 400, reason))

    def _response(
        self, stream: _Stream, headers: list[tuple[bytes, bytes]], end_stream: bool
    ) -> None:
        sid = stream.stream_id
        try:
            pseudo, _ = _split_headers(headers, request=False)
        except _MalformedError:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR)
            return
        status = int(pseudo[b":status"])
        if stream.opened:  # trailers after the tunnel opened: they must end the stream
            if end_stream and not stream.remote_ended:
                self._remote_end(stream)
            else:
                self._stream_error(sid, ErrorCode.PROTOCOL_ERROR)
            return
        if 100 <= status < 200:
            if end_stream or status == 101:  # §8.1: no END_STREAM on 1xx; no 101 in HTTP/2
                self._stream_error(sid, ErrorCode.PROTOCOL_ERROR)
            return  # informational: the final answer follows
        if 200 <= status < 300:
            stream.opened = True
            self._events.append(TunnelOpened(sid))
            self._flush(stream)
            if end_stream:
                self._remote_end(stream)
            return
        # Refused. The answer is complete with END_STREAM: ending our side closes the stream.
        # Left half-closed it would count against both sides' concurrent-stream limits for as
        # long as the connection lives (a pooled one would fill up with refused streams).
        self._forget(sid)
        if end_stream:
            self._small += f.frame_header(0, f.DATA, f.END_STREAM, sid)
        else:
            self._small += f.pack_rst_stream(sid, ErrorCode.CANCEL)
        self._events.append(TunnelRefused(sid, status))

    def _rst_stream(self, sid: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise _PeerError(ErrorCode.FRAME_SIZE_ERROR, "RST_STREAM of the wrong size")
        if not sid or self._idle(sid):
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, f"RST_STREAM on idle stream {sid}")
        code = f.unpack_u32(payload)
        if not self._resets.take(self._now):
            raise _PeerError(
                ErrorCode.ENHANCE_YOUR_CALM, "too many streams reset by the peer (rapid reset)"
            )
        if self._streams.pop(sid, None) is not None:
            self._events.append(StreamReset(sid, code, remote=True))

    def _window_update(self, sid: int, payload: memoryview) -> None:
        if len(payload) != 4:
            raise _PeerError(ErrorCode.FRAME_SIZE_ERROR, "WINDOW_UPDATE of the wrong size")
        increment = f.unpack_u32(payload) & f.STREAM_MASK
        if not sid:
            if not increment:
                raise _PeerError(ErrorCode.PROTOCOL_ERROR, "WINDOW_UPDATE of 0 (§6.9)")
            self._send_window += increment
            if self._send_window > f.MAX_WINDOW:
                raise _PeerError(ErrorCode.FLOW_CONTROL_ERROR, "connection window over 2^31-1")
            self._flush_all()
            return
        if self._idle(sid):
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, f"WINDOW_UPDATE on idle stream {sid}")
        stream = self._streams.get(sid)
        if stream is None:
            return  # a stream that is over
        if not increment:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR)
            return
        stream.send_window += increment
        if stream.send_window > f.MAX_WINDOW:
            self._stream_error(sid, ErrorCode.FLOW_CONTROL_ERROR)
            return
        self._flush(stream)

    def _settings(self, sid: int, flags: int, payload: memoryview) -> None:
        if sid:
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, "SETTINGS on a stream")
        if flags & f.ACK:
            if payload:
                raise _PeerError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS ACK with a payload")
            return
        if len(payload) % 6:
            raise _PeerError(ErrorCode.FRAME_SIZE_ERROR, "SETTINGS not a multiple of 6 bytes")
        if not self._control.take(self._now):
            raise _PeerError(
                ErrorCode.ENHANCE_YOUR_CALM, "too many SETTINGS/PING frames from the peer"
            )
        grew = False
        for key, value in f.unpack_settings(payload):
            grew = self._apply_setting(key, value) or grew
        self._small += f.SETTINGS_ACK
        if grew:
            self._flush_all()  # a larger INITIAL_WINDOW_SIZE reopens held streams

    def _apply_setting(self, key: int, value: int) -> bool:
        """Apply one of the peer's settings (§6.5.2); True when stream windows grew."""
        if key == f.INITIAL_WINDOW_SIZE:
            if value > f.MAX_WINDOW:
                raise _PeerError(ErrorCode.FLOW_CONTROL_ERROR, "INITIAL_WINDOW_SIZE over 2^31-1")
            delta = value - self._peer_stream_window  # §6.9.2: it applies to open streams
            self._peer_stream_window = value
            for stream in self._streams.values():
                stream.send_window += delta
                if stream.send_window > f.MAX_WINDOW:
                    raise _PeerError(ErrorCode.FLOW_CONTROL_ERROR, "stream window over 2^31-1")
            return delta > 0
        if key == f.MAX_FRAME_SIZE:
            if not f.DEFAULT_FRAME <= value <= f.MAX_FRAME_LIMIT:
                raise _PeerError(ErrorCode.PROTOCOL_ERROR, f"MAX_FRAME_SIZE {value}")
            self._peer_max_frame = value
        elif key == f.MAX_CONCURRENT_STREAMS:
            self._peer_max_streams = value
        elif key == f.HEADER_TABLE_SIZE:
            self._encoder.header_table_size = min(value, _HEADER_TABLE_LIMIT)
        elif key == f.ENABLE_PUSH and value > 1:
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, f"ENABLE_PUSH {value}")
        # MAX_HEADER_LIST_SIZE: our header blocks are far below any sane value; unknown
        # identifiers are ignored (§6.5.2).
        return False

    def _ping(self, sid: int, flags: int, payload: memoryview) -> None:
        if sid:
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, "PING on a stream")
        if len(payload) != 8:
            raise _PeerError(ErrorCode.FRAME_SIZE_ERROR, "PING of the wrong size")
        if flags & f.ACK:
            return
        if not self._control.take(self._now):
            raise _PeerError(
                ErrorCode.ENHANCE_YOUR_CALM, "too many SETTINGS/PING frames from the peer"
            )
        self._small += f.pack_ping(bytes(payload), ack=True)

    def _goaway(self, sid: int, payload: memoryview) -> None:
        if sid:
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, "GOAWAY on a stream")
        if len(payload) < 8:
            raise _PeerError(ErrorCode.FRAME_SIZE_ERROR, "GOAWAY too short")
        last, code, debug_data = f.unpack_goaway(payload)
        debug = debug_data[:_DEBUG_LIMIT].decode("utf-8", "replace")
        closed = ConnectionClosed(
            error_code=code,
            remote=True,
            reason=f"peer sent GOAWAY: {debug}" if debug else "peer sent GOAWAY",
            last_stream_id=last,
        )
        self._events.append(closed)
        if code != ErrorCode.NO_ERROR:
            self._closed = closed
            self._streams.clear()
            return
        # Graceful (§6.8): streams up to last_stream_id may finish; this side opens no more.
        # last_stream_id counts the streams *we* opened (the peer's own need no word: a client's
        # GOAWAY says 0 with every one of its tunnels still open); ours above it were never
        # processed by the peer: report them reset.
        self._going_away = True
        ours = 1 if self.client else 0
        for stream_id in [s for s in self._streams if s > last and s % 2 == ours]:
            self._forget(stream_id)
            self._events.append(StreamReset(stream_id, ErrorCode.REFUSED_STREAM, remote=True))

    def _priority(self, sid: int, payload: memoryview) -> None:
        # Deprecated by RFC 9113 (§5.3.2) but still parsed: its errors are still errors.
        if not sid:
            raise _PeerError(ErrorCode.PROTOCOL_ERROR, "PRIORITY on stream 0")
        if self._idle(sid):
            return  # no RST_STREAM for an idle stream (§6.4); nothing else to do with it
        if len(payload) != 5:
            self._stream_error(sid, ErrorCode.FRAME_SIZE_ERROR)
        elif int.from_bytes(payload[:4], "big") & f.STREAM_MASK == sid:
            self._stream_error(sid, ErrorCode.PROTOCOL_ERROR)

    # -- internals ---------------------------------------------------------------------------

    def _idle(self, sid: int) -> bool:
        """A stream id never used on this connection (RFC 9113 §5.1: the idle state)."""
        if self.client:
            return not sid % 2 or sid >= self._next_id
        return not sid % 2 or sid > self._highest_in

    def _live(self, stream_id: int) -> _Stream | None:
        """The open stream ``stream_id``; None when it is over (the peer ended it, or the
        connection ended). An id this connection never used is the caller's bug."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            return stream
        if not stream_id or self._idle(stream_id):
            raise TunnelStateError(f"stream {stream_id} was never opened on this connection")
        return None

    def _send_headers(self, sid: int, headers: list[Any], *, end_stream: bool) -> None:
        block = self._encoder.encode(headers, huffman=False)
        limit = self._peer_max_frame
        first, rest = block[:limit], block[limit:]
        flags = (f.END_STREAM if end_stream else 0) | (0 if rest else f.END_HEADERS)
        self._small += f.frame_header(len(first), f.HEADERS, flags, sid)
        self._small += first
        while rest:  # §6.10: the rest of a large block in CONTINUATION frames
            piece, rest = rest[:limit], rest[limit:]
            self._small += f.frame_header(
                len(piece), f.CONTINUATION, 0 if rest else f.END_HEADERS, sid
            )
            self._small += piece

    def _write_data(self, sid: int, chunk: bytes, end_stream: bool) -> None:
        header = f.frame_header(len(chunk), f.DATA, f.END_STREAM if end_stream else 0, sid)
        if len(chunk) >= _BY_REFERENCE:
            self._small += header
            self._out.append(bytes(self._small))
            self._small.clear()
            self._out.append(chunk)  # by reference: the payload is never copied here
        else:
            self._small += header
            self._small += chunk

    def _flush_all(self) -> None:
        # Each waiting stream in turn; the shared connection window decides how far each
        # gets, and the rest waits for the next WINDOW_UPDATE.
        for stream in [s for s in self._streams.values() if s.held or s.end_wanted]:
            self._flush(stream)

    def _flush(self, stream: _Stream) -> None:
        """Send what the windows allow of ``stream``'s held bytes (then END_STREAM if wanted)."""
        if not stream.opened or self._closed is not None or stream.local_ended:
            return
        sid = stream.stream_id
        held = stream.held
        while held:
            window = min(stream.send_window, self._send_window, self._peer_max_frame)
            if window <= 0:
                break
            chunk = held[0]
            if len(chunk) <= window:
                held.popleft()
            else:
                held[0] = chunk[window:]
                chunk = chunk[:window]
            n = len(chunk)
            stream.held_len -= n
            stream.send_window -= n
            self._send_window -= n
            last = not held and stream.end_wanted
            self._write_data(sid, chunk, last)  # END_STREAM rides on the last DATA frame
            if last:
                self._local_end(stream)
        if not held and stream.end_wanted and not stream.local_ended:
            self._small += f.frame_header(0, f.DATA, f.END_STREAM, sid)
            self._local_end(stream)
        if stream.blocked and stream.held_len <= self.settings.low_water:
            stream.blocked = False
            self._events.append(Writable(sid))

    def _give_back(self, flow: int) -> bool:
        """Return ``flow`` bytes of connection window; True when a WINDOW_UPDATE was queued."""
        self._recv_unacked += flow
        if self._recv_unacked < self.settings.connection_window // 2:
            return False
        self._small += f.pack_window_update(0, self._recv_unacked)
        self._recv_window += self._recv_unacked
        self._recv_unacked = 0
        return True

    def _local_end(self, stream: _Stream) -> None:
        stream.local_ended = True
        if stream.remote_ended:
            self._streams.pop(stream.stream_id, None)

    def _remote_end(self, stream: _Stream) -> None:
        stream.remote_ended = True
        self._events.append(StreamEnded(stream.stream_id))
        if stream.local_ended:
            self._streams.pop(stream.stream_id, None)

    def _stream_error(self, sid: int, code: ErrorCode) -> None:
        """The peer broke the rules for one stream (§5.4.2): reset it; the connection goes on."""
        self._small += f.pack_rst_stream(sid, code)
        if self._streams.pop(sid, None) is not None:
            self._events.append(StreamReset(sid, code, remote=False))

    def _forget(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)

    def _peer_error(self, code: ErrorCode, reason: str) -> None:
        """The peer broke the protocol (§5.4.1): GOAWAY with the code, the connection is over."""
        if self._closed is None:
            debug = reason.encode("utf-8", "replace")[:_DEBUG_LIMIT]
            self._small += f.pack_goaway(self._highest_in, code, debug)
            prefix = "" if code == ErrorCode.ENHANCE_YOUR_CALM else "protocol error by peer: "
            self._closed = ConnectionClosed(error_code=code, remote=True, reason=prefix + reason)
            self._events.append(self._closed)
        self._streams.clear()
        self._block = None


def _unpad(payload: memoryview, flags: int) -> memoryview:
    """The content of a PADDED frame (RFC 9113 §6.1, §6.2): pad length, content, padding."""
    if not payload:
        raise _PeerError(ErrorCode.FRAME_SIZE_ERROR, "PADDED frame without a pad length")
    pad = payload[0]
    if pad >= len(payload):
        raise _PeerError(ErrorCode.PROTOCOL_ERROR, "padding as long as the frame")
    return payload[1 : len(payload) - pad]


def _split_headers(
    headers: list[tuple[bytes, bytes]], *, request: bool
) -> tuple[dict[bytes, bytes], dict[str, str]]:
    """(pseudo-headers, other fields as text) of a header list; ``_MalformedError`` if malformed."""
    pseudo: dict[bytes, bytes] = {}
    extra: dict[str, str] = {}
    for name, value in headers:
        if not name or any(bad in name or bad in value for bad in _BAD_VALUE_BYTES):
            raise _MalformedError("a field with an invalid character")
        if name[:1] == b":":
            if extra:
                raise _MalformedError(f"{name!r} after a regular field")
            allowed = _REQUEST_PSEUDO if request else frozenset({b":status"})
            if name not in allowed or name in pseudo:
                raise _MalformedError(f"pseudo-header {name!r}")
            pseudo[name] = value
            continue
        if name != name.lower() or name in _CONNECTION_SPECIFIC:
            raise _MalformedError(f"field {name!r}")
        if name == b"te" and value != b"trailers":
            raise _MalformedError("te other than trailers")
        if value[:1] in (b" ", b"\t") or value[-1:] in (b" ", b"\t"):
            raise _MalformedError(f"field {name!r} with surrounding whitespace")
        extra[name.decode("latin-1")] = value.decode("latin-1")
    if request and b":method" not in pseudo:
        raise _MalformedError("no :method")
    status = pseudo.get(b":status", b"")
    if not request and (len(status) != 3 or not status.isdigit()):
        raise _MalformedError(f"bad :status {status!r}")
    return pseudo, extra
