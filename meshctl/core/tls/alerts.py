"""TLS alert records (RFC 8446 §6, RFC 5246 §7.2): what the gateway sends a client whose
ClientHello it will not forward, before closing.

Owns the record's bytes and which alert answers which refusal. An alert goes only to a client
that spoke TLS records (a client that sent plaintext or an SSLv2 hello would not read one);
it is always fatal (RFC 8446 §6: every alert but close_notify and user_canceled is). The
record version echoes the client's first record (RFC 8446 §5.1 lets the first records carry
0x0301; a TLS 1.0 client must not see a version it did not offer), 0x0303 when unknown.
Invariant: pure.
"""

from __future__ import annotations

import enum

from .clienthello import Reason

_ALERT = 21  # ContentType alert
_FATAL = 2  # AlertLevel fatal
DEFAULT_VERSION = 0x0303


class Description(enum.IntEnum):
    UNEXPECTED_MESSAGE = 10
    DECODE_ERROR = 50
    INTERNAL_ERROR = 80
    UNRECOGNIZED_NAME = 112  # RFC 6066 §3: the server recognises no such name


# The alert for each refusal of the ClientHello reader; absent: no alert (the client did not
# speak TLS records).
FOR_REFUSAL = {
    Reason.NOT_HANDSHAKE: Description.UNEXPECTED_MESSAGE,
    Reason.NOT_CLIENT_HELLO: Description.UNEXPECTED_MESSAGE,
    Reason.MALFORMED: Description.DECODE_ERROR,
    Reason.TOO_LARGE: Description.DECODE_ERROR,
}


def record_version(first_bytes: bytes | bytearray) -> int:
    """The version the client's first record carries (3.x), or the default."""
    if len(first_bytes) >= 3 and first_bytes[1] == 3 and first_bytes[2] <= 3:
        return (first_bytes[1] << 8) | first_bytes[2]
    return DEFAULT_VERSION


def fatal(description: Description, version: int = DEFAULT_VERSION) -> bytes:
    """One alert record: ContentType 21, the version, length 2, level fatal, description."""
    return bytes((_ALERT, version >> 8, version & 0xFF, 0, 2, _FATAL, int(description)))
