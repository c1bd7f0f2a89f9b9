"""HTTP/2 wire layouts the HBONE connection reads and writes (RFC 9113 §4 and §6).

Owns the numbers (frame types, flags, error codes, settings identifiers) and the byte layouts:
the 9-byte frame header and the fixed-size payloads (RST_STREAM, WINDOW_UPDATE, PING, GOAWAY,
SETTINGS entries). Pure functions over bytes; header compression is ``hpack``'s. Invariant:
every ``pack_*`` output is one well-formed frame; every ``unpack_*`` takes a payload whose
length the caller has checked.
"""

from __future__ import annotations

import struct
from enum import IntEnum

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # RFC 9113 §3.4: the client's first bytes
HEADER = struct.Struct(">HBBBL")  # 24-bit length (as 16 + 8 bits), type, flags, stream id
HEADER_SIZE = HEADER.size  # 9
_U32 = struct.Struct(">L")
_GOAWAY = struct.Struct(">LL")
_SETTING = struct.Struct(">HL")

# Frame types (RFC 9113 §6).
DATA = 0x0
HEADERS = 0x1
PRIORITY = 0x2
RST_STREAM = 0x3
SETTINGS = 0x4
PUSH_PROMISE = 0x5
PING = 0x6
GOAWAY = 0x7
WINDOW_UPDATE = 0x8
CONTINUATION = 0x9

# Flags.
END_STREAM = 0x1
ACK = 0x1  # SETTINGS, PING
END_HEADERS = 0x4
PADDED = 0x8
PRIORITY_FLAG = 0x20

# Settings (RFC 9113 §6.5.2).
HEADER_TABLE_SIZE = 0x1
ENABLE_PUSH = 0x2
MAX_CONCURRENT_STREAMS = 0x3
INITIAL_WINDOW_SIZE = 0x4
MAX_FRAME_SIZE = 0x5
MAX_HEADER_LIST_SIZE = 0x6

DEFAULT_WINDOW = 65535  # RFC 9113 §6.9.2: every window starts here
DEFAULT_FRAME = 16384  # §4.2: the largest frame until the peer allows more
MAX_WINDOW = 2**31 - 1  # §6.9.1
MAX_FRAME_LIMIT = 2**24 - 1  # §6.5.2: the largest SETTINGS_MAX_FRAME_SIZE
STREAM_MASK = 0x7FFFFFFF  # the reserved bit is ignored on receipt (§4.1)


class ErrorCode(IntEnum):
    """RFC 9113 §7; equal to the plain integers on the wire (and to h2's ``ErrorCodes``)."""

    NO_ERROR = 0x0
    PROTOCOL_ERROR = 0x1
    INTERNAL_ERROR = 0x2
    FLOW_CONTROL_ERROR = 0x3
    SETTINGS_TIMEOUT = 0x4
    STREAM_CLOSED = 0x5
    FRAME_SIZE_ERROR = 0x6
    REFUSED_STREAM = 0x7
    CANCEL = 0x8
    COMPRESSION_ERROR = 0x9
    CONNECT_ERROR = 0xA
    ENHANCE_YOUR_CALM = 0xB
    INADEQUATE_SECURITY = 0xC
    HTTP_1_1_REQUIRED = 0xD


def frame_header(length: int, kind: int, flags: int, stream_id: int) -> bytes:
    return HEADER.pack(length >> 8, length & 0xFF, kind, flags, stream_id)


def pack_rst_stream(stream_id: int, code: int) -> bytes:
    return frame_header(4, RST_STREAM, 0, stream_id) + _U32.pack(code)


def pack_window_update(stream_id: int, increment: int) -> bytes:
    return frame_header(4, WINDOW_UPDATE, 0, stream_id) + _U32.pack(increment)


def pack_ping(opaque: bytes, *, ack: bool) -> bytes:
    return frame_header(8, PING, ACK if ack else 0, 0) + opaque


def pack_goaway(last_stream_id: int, code: int, debug: bytes = b"") -> bytes:
    payload = _GOAWAY.pack(last_stream_id, code) + debug
    return frame_header(len(payload), GOAWAY, 0, 0) + payload


def pack_settings(values: dict[int, int]) -> bytes:
    payload = b"".join(_SETTING.pack(k, v) for k, v in values.items())
    return frame_header(len(payload), SETTINGS, 0, 0) + payload


SETTINGS_ACK = frame_header(0, SETTINGS, ACK, 0)


def unpack_u32(payload: bytes | memoryview) -> int:
    """The 32-bit value of a RST_STREAM or WINDOW_UPDATE payload (4 bytes)."""
    return int(_U32.unpack(payload)[0])


def unpack_goaway(payload: bytes | memoryview) -> tuple[int, int, bytes]:
    """(last stream id, error code, debug data) of a GOAWAY payload (8 bytes or more)."""
    last, code = _GOAWAY.unpack(payload[:8])
    return last & STREAM_MASK, code, bytes(payload[8:])


def unpack_settings(payload: bytes | memoryview) -> list[tuple[int, int]]:
    """The (identifier, value) pairs of a SETTINGS payload (a multiple of 6 bytes)."""
    return [(k, v) for k, v in _SETTING.iter_unpack(payload)]
