"""A sans-IO HBONE connection: HTTP/2 CONNECT tunnels (RFC 9113 §8.5) over one h2 connection.

Owns, for either side: the CONNECT exchange (client: ``open``/``TunnelOpened``; server:
``TunnelRequested``/``respond``), per-stream byte queues with flow control, half-close, and the
abuse budgets. Bytes go in through ``receive``; events come out; bytes to write come out of
``data_to_send``. Invariants:
- Every call may queue output: the shell must call ``data_to_send`` after *any* call (a
  WINDOW_UPDATE made by ``consumed`` outside the receive path stalls the tunnel if left queued).
- Outbound bytes beyond the peer's stream or connection window are held per stream and sent on
  WINDOW_UPDATE, round-robin across streams (the connection window is shared); END_STREAM goes
  out only after a stream's held bytes.
- Inbound windows are returned only through ``consumed`` (bytes that left the process), so a slow
  reader backpressures the peer instead of growing memory.
- Local misuse raises ``TunnelStateError``; peer misbehaviour becomes
  ``ConnectionClosed(remote=True)`` after a GOAWAY is queued, never an exception.
- A stream the peer ended (reset, refused, or gone with the connection) is an event, never an
  error: ``send``/``end``/``respond``/``reset`` on it are no-ops, because the shell may still
  hold it while it dispatches the events of the read that ended it. Only an id this connection
  never used is misuse.
"""

from __future__ import annotations

import contextlib
import struct
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import h2.config
import h2.connection
import h2.events
import h2.exceptions
import hpack
from h2.errors import ErrorCodes
from h2.settings import SettingCodes
from hpack import NeverIndexedHeaderTuple
from hyperframe.frame import DataFrame, Frame, GoAwayFrame

from meshctl.core.hbone.events import (
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
from meshctl.core.hbone.headers import parse_authority

if TYPE_CHECKING:
    from h2._typing import Buffer  # what h2's receive_data declares (PEP 688)

DEFAULT_WINDOW = 4 * 1024 * 1024  # ztunnel's HTTP2_STREAM_WINDOW_SIZE / CONNECTION_WINDOW_SIZE
DEFAULT_FRAME = 1024 * 1024  # ztunnel's HTTP2_FRAME_SIZE
_H2_DEFAULT_WINDOW = 65535  # RFC 9113 §6.9.2: every window starts here
_PER_STREAM = frozenset({b"forwarded"})  # header values that differ on every stream
_STREAM_MARGIN = 8  # below the stream limit by more than this, can_open trusts its own count
_DEBUG_LIMIT = 512  # GOAWAY debug data we send or show: a reason, not a payload


_FRAME_HEADER = struct.Struct(">HBBBL")  # RFC 9113 §4.1: 24-bit length, type, flags, stream
_DATA = 0x0
_END_STREAM = 0x1
_PADDED = 0x8
_Bytes = bytes | bytearray | memoryview
# DATA payloads at least this large leave by reference (no copy); smaller frames are joined
# with their neighbours so a 1 KiB message stays one TLS record.
_BY_REFERENCE = 16 * 1024


class _LiteralEncoder(hpack.Encoder):
    """HPACK without Huffman-coding literals (optional in RFC 7541 §5.2): our header blocks are a
    few short values, and pure-Python Huffman coding was half the cost of encoding them."""

    def encode(self, headers: Any, huffman: bool = False) -> bytes:
        return super().encode(headers, huffman=False)


class _H2(h2.connection.H2Connection):
    """h2, except that DATA payloads are not copied on the way out nor (much) on the way in.

    Out: h2 serialises every frame into one bytearray and ``data_to_send`` copies it out again:
    for bulk transfer that is three copies of each payload byte, the largest Python-level cost
    of the sending proxy in the profile. Large payloads are queued by reference instead. Frames
    keep their order: bytes h2 queued by itself (the preface) and joined small frames are
    flushed into the list before each payload.

    In: h2's ``FrameBuffer`` appends every read to a bytearray, slices each frame out of it and
    copies the payload again (four copies of a 1 MiB DATA frame). ``receive_data`` splits
    frames itself (RFC 9113 §4.1): an unpadded DATA frame goes straight to h2's frame handler
    (flow control and stream state stay h2's) with its payload copied once from the read (or,
    for a frame that spans reads, written once into a buffer of the frame's size, which then
    *is* the payload); every other frame is fed whole to h2's own ``receive_data``, which keeps
    its checks (preface, header blocks and CONTINUATION, padding, frame validation). The caller
    may pass a buffer it reuses: nothing is kept that points into it.
    """

    def __init__(self, config: h2.config.H2Configuration) -> None:
        super().__init__(config=config)
        self.encoder = _LiteralEncoder()
        self._buffers: list[bytes] = []
        self._head = bytearray()  # the first bytes (< 9) of a frame header split by a read
        self._frame: bytearray | None = None  # a frame split by a read: header + payload
        self._fill = 0  # bytes of ``_frame`` received so far

    def receive_data(self, data: Buffer) -> list[h2.events.Event]:
        fb = self.incoming_buffer
        if fb._preamble_len or fb._data:  # h2 holds part of a frame: its turn
            return super().receive_data(data)
        events: list[h2.events.Event] = []
        with memoryview(data) as view:
            pos, end = 0, len(view)
            while pos < end:
                if self._frame is not None:  # complete the frame a previous read started
                    take = min(len(self._frame) - self._fill, end - pos)
                    self._frame[self._fill : self._fill + take] = view[pos : pos + take]
                    self._fill += take
                    pos += take
                    if self._fill < len(self._frame):
                        break
                    frame, self._frame = self._frame, None
                    events += self._one_frame(memoryview(frame), owned=True)
                    continue
                if self._head or end - pos < _FRAME_HEADER.size:
                    take = min(_FRAME_HEADER.size - len(self._head), end - pos)
                    self._head += view[pos : pos + take]
                    pos += take
                    if len(self._head) < _FRAME_HEADER.size:
                        break
                    header, self._head = bytes(self._head), bytearray()
                    if self._length(header[:3]):
                        self._start_frame(header)
                    else:  # a header-only frame (SETTINGS ACK, empty DATA): complete already
                        events += self._one_frame(memoryview(header), owned=True)
                    continue
                length = self._length(view[pos : pos + 3])
                stop = pos + _FRAME_HEADER.size + length
                if stop > end:
                    self._start_frame(bytes(view[pos : pos + _FRAME_HEADER.size]))
                    pos += _FRAME_HEADER.size
                    continue
                events += self._one_frame(view[pos:stop], owned=False)
                pos = stop
        return events

    def _length(self, raw: _Bytes) -> int:
        length = int.from_bytes(raw, "big")
        if length > self.max_inbound_frame_size:  # refused before buffering any of it
            self._terminate_connection(ErrorCodes.FRAME_SIZE_ERROR)
            msg = f"received a frame of {length} bytes; the limit is {self.max_inbound_frame_size}"
            raise h2.exceptions.FrameTooLargeError(msg)
        return length

    def _start_frame(self, header: bytes) -> None:
        """A frame whose payload continues in later reads: one buffer of its full size."""
        length = self._length(header[:3])
        self._frame = bytearray(_FRAME_HEADER.size + length)
        self._frame[: _FRAME_HEADER.size] = header
        self._fill = _FRAME_HEADER.size

    def _one_frame(self, frame: memoryview, *, owned: bool) -> list[h2.events.Event]:
        """Handle one whole frame; ``owned``: ``frame`` is ours alone (its payload may stay)."""
        kind, flags = frame[3], frame[4]
        sid = int.from_bytes(frame[5:9], "big") & 0x7FFFFFFF
        if kind != _DATA or not sid or flags & _PADDED or self.incoming_buffer._headers_buffer:
            return super().receive_data(frame)  # h2 copies what it keeps
        data = DataFrame(sid)
        data.data = frame[_FRAME_HEADER.size :] if owned else frame[_FRAME_HEADER.size :].tobytes()
        if flags & _END_STREAM:
            data.flags.add("END_STREAM")
        try:
            return self._receive_frame(data)
        except h2.exceptions.ProtocolError as exc:  # what h2's receive_data does with it
            self._terminate_connection(exc.error_code)
            raise

    def _prepare_for_sending(self, frames: list[Frame]) -> None:
        limit = self.max_outbound_frame_size
        for f in frames:
            if isinstance(f, DataFrame) and len(f.data) >= _BY_REFERENCE and not f.pad_length:
                size = len(f.data)
                if size > limit:
                    raise h2.exceptions.FrameTooLargeError(f"DATA of {size} > {limit}")
                flags = _END_STREAM if "END_STREAM" in f.flags else 0
                sid = f.stream_id & 0x7FFFFFFF
                self._data_to_send += _FRAME_HEADER.pack(size >> 8, size & 0xFF, _DATA, flags, sid)
                self._buffers.append(bytes(self._data_to_send))
                self._data_to_send = bytearray()
                self._buffers.append(bytes(f.data))  # already bytes: no copy
            else:
                self._data_to_send += f.serialize()

    def buffers_to_send(self) -> list[bytes]:
        if self._data_to_send:
            self._buffers.append(bytes(self._data_to_send))
            self._data_to_send = bytearray()
        out, self._buffers = self._buffers, []
        return out

    def data_to_send(self, amount: int | None = None) -> bytes:
        if amount is not None:
            raise NotImplementedError("partial reads of the output are not used by HBONE")
        return b"".join(self.buffers_to_send())

    def clear_outbound_data_buffer(self) -> None:
        super().clear_outbound_data_buffer()
        self._buffers = []

    def _receive_goaway_frame(self, frame: GoAwayFrame) -> tuple[list[Frame], list[Any]]:
        """h2 drops everything queued for output on any GOAWAY. After a graceful one the open
        streams go on (``HboneConnection`` reopens the state machine), so what they queued
        before the frame was read still has to leave; only an error GOAWAY discards it."""
        if frame.error_code != ErrorCodes.NO_ERROR:
            return super()._receive_goaway_frame(frame)
        queued, buffers = self._data_to_send, self._buffers
        result = super()._receive_goaway_frame(frame)
        self._data_to_send, self._buffers = queued, buffers
        return result


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
    opened: bool = False  # 200 sent (server) or received (client)
    held: deque[bytes] = field(default_factory=deque)
    held_len: int = 0
    end_wanted: bool = False
    local_ended: bool = False
    remote_ended: bool = False
    blocked: bool = False  # told the shell to pause (held_len crossed high water)
    gone: bool = False  # h2 closed it under us; its StreamReset is on the way


class HboneConnection:
    """One HTTP/2 connection carrying HBONE tunnels; ``client=True`` for the initiating side."""

    def __init__(self, *, client: bool, settings: TunnelSettings | None = None) -> None:
        self.client = client
        self.settings = settings or TunnelSettings()
        # Outbound header checks off: we only ever send the fixed CONNECT/status headers built here
        # (h2's per-header validation and normalisation were ~4% of a new connection's CPU).
        # Inbound headers stay validated: a peer's malformed request must still fail.
        config = h2.config.H2Configuration(
            client_side=client,
            header_encoding=None,
            validate_outbound_headers=False,
            normalize_outbound_headers=False,
        )
        self._h2 = _H2(config)
        self._streams: dict[int, _Stream] = {}
        self._closed: ConnectionClosed | None = None
        self._going_away = False
        # Stream resets found outside ``receive`` (h2 had closed a stream we still held): they
        # are reported first by the next ``receive``.
        self._late: list[Event] = []
        self._receiving = False  # inside receive's event loop
        self._gone: list[_Stream] = []  # streams h2 closed under us during this receive
        self._extra_out = b""  # frames written here rather than by h2 (graceful GOAWAY)
        self._resets = _Bucket(
            self.settings.reset_burst, self.settings.reset_rate, self.settings.reset_burst
        )
        self._control = _Bucket(
            self.settings.control_burst, self.settings.control_rate, self.settings.control_burst
        )
        self._h2.initiate_connection()
        # Our settings go out as an update, not as constructor values: h2 applies an update's
        # MAX_FRAME_SIZE and INITIAL_WINDOW_SIZE to its inbound checks when the peer ACKs it,
        # whereas constructor values leave the inbound frame limit at 16 KiB (a trap).
        self._h2.update_settings(
            {
                SettingCodes.INITIAL_WINDOW_SIZE: self.settings.stream_window,
                SettingCodes.MAX_FRAME_SIZE: self.settings.max_frame_size,
                SettingCodes.MAX_CONCURRENT_STREAMS: self.settings.max_concurrent_streams,
                SettingCodes.ENABLE_PUSH: 0,
            }
        )
        extra = self.settings.connection_window - _H2_DEFAULT_WINDOW
        if extra > 0:
            self._h2.increment_flow_control_window(extra)

    # -- introspection ------------------------------------------------------------------------

    @property
    def closed(self) -> ConnectionClosed | None:
        """Why the connection ended, or None while it is usable."""
        return self._closed

    @property
    def active_streams(self) -> int:
        return len(self._streams)

    def can_open(self) -> bool:
        """Whether a new tunnel fits: not closing, and under both sides' stream limits."""
        if self._closed is not None or self._going_away or not self.client:
            return False
        peer_limit = self._h2.remote_settings.max_concurrent_streams
        limit = min(peer_limit, self.settings.max_concurrent_streams)
        # Our own live streams are the open ones (every way a stream ends closes it in h2 too):
        # well under the limit that answers without h2's count, which walks every stream (a
        # visible share of a new connection's cost); near it, h2's exact count decides.
        if len(self._streams) + _STREAM_MARGIN < limit:
            return True
        return self._h2.open_outbound_streams < limit

    @property
    def bulk_output(self) -> bool:
        """Whether large DATA payloads (>= 16 KiB, kept by reference) wait in the output."""
        return bool(self._h2._buffers)  # our own subclass's queue

    def held_bytes(self, stream_id: int) -> int:
        stream = self._streams.get(stream_id)
        return stream.held_len if stream else 0

    # -- output ------------------------------------------------------------------------------

    def data_to_send(self) -> bytes:
        return b"".join(self.buffers_to_send())

    def buffers_to_send(self) -> list[bytes]:
        """What ``data_to_send`` returns, as a list for ``writelines`` (payloads not copied)."""
        out = self._h2.buffers_to_send()
        if self._extra_out:
            out.insert(0, self._extra_out)
            self._extra_out = b""
        return out

    # -- client side -------------------------------------------------------------------------

    def open(self, authority: str, headers: Iterable[tuple[str, str]] = ()) -> int:
        """Send ``CONNECT authority`` with ``headers``; returns the new stream id."""
        if not self.client:
            raise TunnelStateError("only the client side opens tunnels")
        if not self.can_open():
            raise TunnelStateError("connection cannot take another stream")
        parse_authority(authority)  # refuse to send what our own server would reject
        stream_id = self._h2.get_next_available_stream_id()
        request: list[tuple[bytes, bytes]] = [
            (b":method", b"CONNECT"),
            (b":authority", authority.encode("ascii")),
        ]
        for k, v in headers:
            name, value = k.lower().encode("ascii"), v.encode("latin-1")
            # A value new for every stream (the client's port) would only churn the HPACK
            # table, evicting the values that do repeat (authority, baggage): send it literal.
            header = NeverIndexedHeaderTuple(name, value) if name in _PER_STREAM else (name, value)
            request.append(header)
        self._h2.send_headers(stream_id, request)
        self._streams[stream_id] = _Stream(stream_id)
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
        try:
            if status == 200:
                self._h2.send_headers(stream_id, headers)
                stream.opened = True
                self._late += self._flush(stream)
            else:
                self._h2.send_headers(stream_id, headers, end_stream=True)
                self._forget(stream_id)
        except h2.exceptions.StreamClosedError:
            self._late += self._lost(stream)

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
                self._late += self._flush(stream)
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
            self._late += self._flush(stream)

    def reset(self, stream_id: int, error_code: int = ErrorCodes.CANCEL) -> None:
        """Abort the stream (e.g. the app socket failed); unknown or finished streams are fine."""
        if stream_id not in self._streams:
            return
        self._forget(stream_id)
        if self._closed is not None:
            return  # the connection is over: every stream ended with it
        # The peer may have closed it first; then there is nothing to tell it.
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self._h2.reset_stream(stream_id, error_code)

    def consumed(self, stream_id: int, flow: int) -> bool:
        """Return ``flow`` bytes of window: they left this process (written to the app socket).

        True when that queued a WINDOW_UPDATE (h2 sends one per half window consumed), which
        a sender may be waiting for.
        """
        if not flow or self._closed is not None:
            return False
        before = len(self._h2._data_to_send)  # our own subclass's queue
        self._h2.acknowledge_received_data(flow, stream_id)
        return len(self._h2._data_to_send) > before

    def close(
        self, error_code: int = ErrorCodes.NO_ERROR, reason: str = "closed locally", debug: str = ""
    ) -> None:
        """Send GOAWAY and end the connection: every stream is over (h2 refuses all frames).

        ``debug`` goes out as the GOAWAY's debug data (RFC 9113 §6.8): what the peer's logs can
        show of why we closed.
        """
        if self._closed is None:
            data = debug.encode("utf-8", "replace")[:_DEBUG_LIMIT] or None
            self._h2.close_connection(error_code, additional_data=data)
            self._closed = ConnectionClosed(error_code=error_code, remote=False, reason=reason)
        self._streams.clear()

    def refuse_peer(self, reason: str) -> None:
        """End the connection because of who the peer is (its certificate's identity).

        GOAWAY INADEQUATE_SECURITY (RFC 9113 §7: the peer's security does not meet our
        requirements) with ``reason`` as debug data, before any stream: the peer's logs then
        say which identity was refused and which was expected, instead of an EOF.
        """
        self.close(ErrorCodes.INADEQUATE_SECURITY, reason, debug=reason)

    def go_away(self) -> None:
        """Graceful GOAWAY (RFC 9113 §6.8): open streams finish, new ones are refused.

        h2's ``close_connection`` would also close the state machine and fail every open
        stream, so the frame is written here and h2 keeps serving the streams already open.
        """
        if self._going_away or self._closed is not None:
            return
        self._going_away = True
        last = self._h2.highest_inbound_stream_id
        frame = GoAwayFrame(stream_id=0, last_stream_id=last, error_code=ErrorCodes.NO_ERROR)
        self._extra_out += self._h2.data_to_send() + frame.serialize()

    @property
    def going_away(self) -> bool:
        return self._going_away

    def receive(self, data: bytes | bytearray | memoryview, now: float) -> list[Event]:
        """Feed bytes read from the socket at time ``now`` (seconds, monotonic).

        ``data`` may be a view of a buffer the caller reuses for the next read: nothing
        returned or kept refers to it.
        """
        if self._closed is not None and self._closed.remote:
            return []
        events, self._late = self._late, []
        try:
            raw = self._h2.receive_data(data)
        except h2.exceptions.ProtocolError as exc:
            # h2 queued a GOAWAY with the right code already; the peer broke the protocol.
            code = getattr(exc, "error_code", ErrorCodes.PROTOCOL_ERROR)
            return [*events, *self._terminate(int(code), f"protocol error by peer: {exc}")]
        self._receiving = True
        try:
            for ev in raw:
                events.extend(self._handle(ev, now))
                if self._closed is not None and self._closed.remote:
                    break
        finally:
            self._receiving = False
        if self._gone:
            gone, self._gone = self._gone, []
            for stream in gone:
                if stream.stream_id in self._streams:
                    self._forget(stream.stream_id)
                    events.append(StreamReset(stream.stream_id, ErrorCodes.STREAM_CLOSED, True))
        return events

    # -- internals ---------------------------------------------------------------------------

    def _handle(self, ev: h2.events.Event, now: float) -> list[Event]:  # noqa: PLR0911, PLR0912
        if isinstance(ev, h2.events.DataReceived):
            sid = ev.stream_id
            stream = self._streams.get(sid)
            if stream is None:
                # Late data for a stream we reset: give the window back so others keep flowing.
                self._h2.acknowledge_received_data(ev.flow_controlled_length, sid)
                return []
            if not ev.flow_controlled_length:
                return []  # an empty DATA frame carrying END_STREAM; h2 reports the end next
            # h2 reports END_STREAM as its own StreamEnded event after this one.
            return [DataReceived(sid, ev.data, ev.flow_controlled_length)]
        if isinstance(ev, h2.events.WindowUpdated):
            if ev.stream_id:
                stream = self._streams.get(ev.stream_id)
                return self._flush(stream) if stream else []
            return self._flush_all()
        if isinstance(ev, h2.events.RequestReceived):
            return self._request(ev)
        if isinstance(ev, h2.events.ResponseReceived):
            return self._response(ev)
        if isinstance(ev, h2.events.StreamEnded):
            stream = self._streams.get(ev.stream_id)
            return [self._remote_end(stream)] if stream else []
        if isinstance(ev, h2.events.StreamReset):
            if ev.stream_id in self._streams:
                self._forget(ev.stream_id)
                if ev.remote_reset and not self._resets.take(now):
                    return self._calm("too many streams reset by the peer (rapid reset)")
                return [StreamReset(ev.stream_id, int(ev.error_code or 0), ev.remote_reset)]
            if ev.remote_reset and not self._resets.take(now):
                return self._calm("too many streams reset by the peer (rapid reset)")
            return []
        if isinstance(ev, h2.events.RemoteSettingsChanged | h2.events.PingReceived):
            if not self._control.take(now):
                return self._calm("too many SETTINGS/PING frames from the peer")
            if isinstance(ev, h2.events.RemoteSettingsChanged):
                return self._flush_all()  # a larger INITIAL_WINDOW_SIZE reopens held streams
            return []
        if isinstance(ev, h2.events.ConnectionTerminated):
            debug = (ev.additional_data or b"")[:_DEBUG_LIMIT].decode("utf-8", "replace")
            closed = ConnectionClosed(
                error_code=int(ev.error_code or 0),
                remote=True,
                reason=f"peer sent GOAWAY: {debug}" if debug else "peer sent GOAWAY",
                last_stream_id=ev.last_stream_id,
            )
            if closed.error_code == ErrorCodes.NO_ERROR:
                # A graceful GOAWAY: streams up to last_stream_id may finish (RFC 9113 §6.8).
                # h2 moves its state machine to CLOSED on any GOAWAY, which would fail them, so
                # it goes back to OPEN and this side only stops opening streams.
                state = h2.connection.ConnectionState
                self._h2.state_machine.state = (
                    state.CLIENT_OPEN if self.client else state.SERVER_OPEN
                )
                self._going_away = True
                last = ev.last_stream_id if ev.last_stream_id is not None else 2**31
                events: list[Event] = [closed]
                for sid in [s for s in self._streams if s > last]:
                    self._forget(sid)  # never processed by the peer: report them reset
                    events.append(StreamReset(sid, ErrorCodes.REFUSED_STREAM, remote=True))
                # A WINDOW_UPDATE read before the GOAWAY (in this same read) could not be used
                # while h2 thought the connection closed: use it now.
                return events + self._flush_all()
            self._closed = closed
            self._streams.clear()
            return [closed]
        if isinstance(ev, h2.events.TrailersReceived | h2.events.InformationalResponseReceived):
            return []  # CONNECT tunnels carry neither; ignore rather than fail the stream
        return []

    def _request(self, ev: h2.events.RequestReceived) -> list[Event]:
        sid = ev.stream_id
        headers = {k.decode("latin-1"): v.decode("latin-1") for k, v in (ev.headers or [])}
        method = headers.get(":method", "")
        if self._going_away:
            # After our GOAWAY: the peer must retry elsewhere (RFC 9113 §8.7, REFUSED_STREAM).
            with contextlib.suppress(h2.exceptions.StreamClosedError):  # reset by the peer
                self._h2.reset_stream(sid, ErrorCodes.REFUSED_STREAM)
            return []
        if method != "CONNECT":
            return [self._reject(sid, 400, f"method {method!r} is not CONNECT")]
        try:
            authority = parse_authority(headers.get(":authority", ""))
        except ValueError as exc:
            return [self._reject(sid, 400, str(exc))]
        self._streams[sid] = _Stream(sid)
        extra = {k: v for k, v in headers.items() if not k.startswith(":")}
        return [TunnelRequested(sid, authority, extra)]

    def _reject(self, stream_id: int, status: int, reason: str) -> TunnelRejected:
        # Reported even when the peer reset the request in the same read (nothing to send then):
        # the verdict stands and is counted.
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            self._h2.send_headers(stream_id, [(b":status", str(status).encode())], end_stream=True)
        return TunnelRejected(stream_id, status, reason)

    def _response(self, ev: h2.events.ResponseReceived) -> list[Event]:
        stream = self._streams.get(ev.stream_id)
        if stream is None:
            return []
        status_text = dict(ev.headers or []).get(b":status", b"0")
        status = int(status_text) if status_text.isdigit() else 0
        if 200 <= status < 300:
            stream.opened = True
            return [TunnelOpened(ev.stream_id), *self._flush(stream)]
        self._forget(ev.stream_id)
        with contextlib.suppress(h2.exceptions.StreamClosedError):
            if ev.stream_ended is None:
                self._h2.reset_stream(ev.stream_id, ErrorCodes.CANCEL)
            else:
                # The answer is complete; ending our side closes the stream. Left half-closed,
                # it would count against both sides' concurrent-stream limits for as long as
                # the connection lives (a pooled one would fill up with refused streams).
                self._h2.end_stream(ev.stream_id)
        return [TunnelRefused(ev.stream_id, status)]

    def _remote_end(self, stream: _Stream) -> Event:
        stream.remote_ended = True
        self._maybe_finished(stream)
        return StreamEnded(stream.stream_id)

    def _flush_all(self) -> list[Event]:
        out: list[Event] = []
        # Round-robin by giving each waiting stream one pass; the shared connection window
        # decides how far each gets, and the rest waits for the next WINDOW_UPDATE.
        for stream in [s for s in self._streams.values() if s.held or s.end_wanted]:
            out.extend(self._flush(stream))
        return out

    def _flush(self, stream: _Stream) -> list[Event]:
        """Send what the windows allow of ``stream``'s held bytes (then END_STREAM if wanted).

        h2 may have closed the stream already: the peer's RST_STREAM is read in the same batch
        as the WINDOW_UPDATE that brought us here, and h2 applies every frame of a read before
        we see its events. That ends the stream (an event), never the connection.
        """
        if not stream.opened or stream.gone or self._closed is not None:
            return []
        sid = stream.stream_id
        h2c = self._h2
        try:
            while stream.held:
                window = min(h2c.local_flow_control_window(sid), h2c.max_outbound_frame_size)
                if window <= 0:
                    break
                chunk = stream.held[0]
                if len(chunk) <= window:
                    h2c.send_data(sid, chunk)
                    stream.held.popleft()
                else:
                    h2c.send_data(sid, chunk[:window])
                    stream.held[0] = chunk[window:]
                    chunk = chunk[:window]
                stream.held_len -= len(chunk)
            if not stream.held and stream.end_wanted and not stream.local_ended:
                h2c.end_stream(sid)
                stream.local_ended = True
                self._maybe_finished(stream)
        except h2.exceptions.StreamClosedError:
            return self._lost(stream)
        except h2.exceptions.ProtocolError:
            if h2c.state_machine.state is not h2.connection.ConnectionState.CLOSED:
                raise
            # A GOAWAY in this same read closed h2's side: a graceful one reopens it and
            # flushes again, an error one ends the connection. The bytes stay held meanwhile.
            return []
        if stream.blocked and stream.held_len <= self.settings.low_water:
            stream.blocked = False
            return [Writable(sid)]
        return []

    def _lost(self, stream: _Stream) -> list[Event]:
        """h2 closed ``stream`` under us (the peer reset it): its held bytes have nowhere to go.

        Inside ``receive`` h2's own StreamReset event for it follows in the same batch and
        reports it with the peer's error code; a stream no such event ended by the end of the
        batch, or one found outside ``receive``, is reported here as STREAM_CLOSED.
        """
        stream.held.clear()
        stream.held_len = 0
        stream.gone = True
        if self._receiving:
            self._gone.append(stream)
            return []
        self._forget(stream.stream_id)
        return [StreamReset(stream.stream_id, ErrorCodes.STREAM_CLOSED, remote=True)]

    def _maybe_finished(self, stream: _Stream) -> None:
        if stream.local_ended and stream.remote_ended:
            self._streams.pop(stream.stream_id, None)

    def _forget(self, stream_id: int) -> None:
        self._streams.pop(stream_id, None)

    def _live(self, stream_id: int) -> _Stream | None:
        """The open stream ``stream_id``; None when it is over (the peer ended it, or the
        connection ended). An id this connection never used is the caller's bug."""
        stream = self._streams.get(stream_id)
        if stream is not None:
            return stream
        h2c = self._h2
        used = h2c.highest_outbound_stream_id if self.client else h2c.highest_inbound_stream_id
        if not stream_id or stream_id > (used or 0):
            raise TunnelStateError(f"stream {stream_id} was never opened on this connection")
        return None

    def _calm(self, reason: str) -> list[Event]:
        self._h2.close_connection(ErrorCodes.ENHANCE_YOUR_CALM)
        self._closed = ConnectionClosed(
            error_code=ErrorCodes.ENHANCE_YOUR_CALM, remote=True, reason=reason
        )
        return [self._closed]

    def _terminate(self, code: int, reason: str) -> list[Event]:
        self._closed = ConnectionClosed(error_code=code, remote=True, reason=reason)
        return [self._closed]
