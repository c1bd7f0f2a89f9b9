"""What an HBONE connection reports to its I/O shell after ``receive`` (or a local call).

Each event names one stream (or the connection) and carries plain values. Fault attribution is
explicit: ``remote=True`` means the peer did it (reset, GOAWAY, protocol violation).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from meshctl.core.wire.hbone.headers import Authority


@dataclass(frozen=True, slots=True)
class TunnelRequested:
    """Server side: a well-formed CONNECT arrived; answer with ``respond(stream_id, status)``."""

    stream_id: int
    authority: Authority
    headers: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class TunnelRejected:
    """Server side: a request was answered with ``status`` by the core itself (not CONNECT: 400,
    unparsable ``:authority``: 400)."""

    stream_id: int
    status: int
    reason: str


@dataclass(frozen=True, slots=True)
class TunnelOpened:
    """Client side: the peer answered 200; bytes may flow both ways."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class TunnelRefused:
    """Client side: the peer answered with a non-2xx status (the stream is over)."""

    stream_id: int
    status: int


@dataclass(frozen=True, slots=True)
class DataReceived:
    """Tunnelled bytes. Call ``consumed(stream_id, flow)`` once they left this process."""

    stream_id: int
    data: bytes | memoryview  # a memoryview only of a buffer nobody else holds (never reused)
    flow: int  # flow-controlled length (data plus padding) to acknowledge


@dataclass(frozen=True, slots=True)
class StreamEnded:
    """The peer half-closed (END_STREAM): no more bytes will arrive on this stream."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class StreamReset:
    """The stream was aborted (RST_STREAM); ``remote`` says by whom."""

    stream_id: int
    error_code: int
    remote: bool


@dataclass(frozen=True, slots=True)
class Writable:
    """Held outbound bytes drained below the low-water mark: resume reading the app socket."""

    stream_id: int


@dataclass(frozen=True, slots=True)
class ConnectionClosed:
    """The connection is over or going away (GOAWAY sent or received, or a protocol error).

    ``remote``: the peer sent GOAWAY or broke the protocol. Streams above ``last_stream_id`` were
    not processed by the peer and may be retried elsewhere.
    """

    error_code: int
    remote: bool
    reason: str
    last_stream_id: int | None = None


Event = (
    TunnelRequested
    | TunnelRejected
    | TunnelOpened
    | TunnelRefused
    | DataReceived
    | StreamEnded
    | StreamReset
    | Writable
    | ConnectionClosed
)
