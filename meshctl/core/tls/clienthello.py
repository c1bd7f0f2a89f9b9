"""A sans-IO reader of the TLS ClientHello (RFC 8446 §4.1.2, RFC 5246 §7.4.1.2): the facts TLS
passthrough routes on (SNI per RFC 6066 §3, ALPN per RFC 7301, the versions offered), read
without terminating TLS.

Bytes go in through ``ClientHelloReader.feed`` as they arrive; each call answers ``NEED_MORE``,
a ``ClientHello`` or a ``Refused`` with its ``Reason``. Invariants:
- Read-only: the reader never changes, drops or adds a byte. The caller keeps every byte it fed
  and replays them upstream unchanged; ``ClientHello.consumed`` says where the records that
  carried the hello end (what follows, e.g. TLS 1.3 early data, is the client's too).
- The answer depends only on the bytes, never on how they were split across ``feed`` calls,
  and it is final: once decided, later bytes are not looked at.
- A ClientHello split across several handshake records (RFC 8446 §5.1 allows it) is
  reassembled, up to ``limit`` bytes of records (headers included; 64 KiB by default, Go's
  crypto/tls cap on one handshake message): real hellos are 0.2-2 KiB, a few KiB with
  post-quantum key shares, so 64 KiB admits every real one while a client cannot make the
  gateway hold more. Held between calls: the hello so far (at most ``limit``) and the start of
  one record (under 5 + 2^14 bytes); nothing once decided.
- Nothing the peer sends raises: every malformed input is a ``Refused`` saying why.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

DEFAULT_LIMIT = 64 * 1024
MAX_RECORD = 1 << 14  # RFC 8446 §5.1: TLSPlaintext.length MUST NOT exceed 2^14
MAX_HOST_NAME = 255  # RFC 6066 §3 gives no bound; OpenSSL's (TLSEXT_MAXLEN_host_name), DNS's 255

_HEADER = 5  # ContentType, legacy_record_version, length (RFC 8446 §5.1)
_HANDSHAKE = 22
_CONTENT_TYPES = {20: "change_cipher_spec", 21: "alert", 22: "handshake", 23: "application_data"}
_CLIENT_HELLO = 1
_EXT_SERVER_NAME = 0  # RFC 6066 §3
_EXT_ALPN = 16  # RFC 7301 §3.1
_EXT_SUPPORTED_VERSIONS = 43  # RFC 8446 §4.2.1
_HOST_NAME = 0  # NameType host_name


class Reason(enum.StrEnum):
    """Why a connection's first bytes are not a ClientHello the gateway can route."""

    NOT_TLS = "not-tls"  # not a TLS record at all (plaintext HTTP, random bytes)
    SSLV2 = "sslv2-hello"  # an SSLv2-compatible hello (RFC 5246 Appendix E.2): no extensions
    NOT_HANDSHAKE = "not-handshake"  # a TLS record, but an alert, data or change_cipher_spec
    NOT_CLIENT_HELLO = "not-client-hello"  # a handshake message other than ClientHello
    MALFORMED = "malformed"  # lengths, vectors or extensions that break the RFCs' grammar
    TOO_LARGE = "too-large"  # the hello's records would pass the reader's limit


@dataclass(frozen=True, slots=True)
class NeedMore:
    """Undecided: feed more bytes (the caller bounds how long it waits)."""


NEED_MORE = NeedMore()


@dataclass(frozen=True, slots=True)
class Refused:
    reason: Reason
    detail: str  # one line for the access log, naming the field and the rule it breaks


@dataclass(frozen=True, slots=True, kw_only=True)
class ClientHello:
    """What a ClientHello says, as sent: ``server_name`` is the RFC 6066 host_name ("" when the
    client sent no server_name extension: not a failure), ``alpn`` the RFC 7301 protocol names
    in the client's order (() when absent), ``supported_versions`` RFC 8446 §4.2.1's list in the
    client's order, GREASE values (RFC 8701) included (() when absent)."""

    server_name: str
    alpn: tuple[bytes, ...]
    legacy_version: int  # ClientHello.legacy_version: 0x0303 from TLS 1.2 and 1.3 clients
    supported_versions: tuple[int, ...]
    consumed: int  # bytes of the records that carried the hello, from the first byte fed
    records: int  # how many records carried it (more than one: a fragmented hello)

    @property
    def version(self) -> int:
        """The highest version offered: supported_versions without GREASE, else legacy_version."""
        offered = [v for v in self.supported_versions if not is_grease(v)]
        return max(offered) if offered else self.legacy_version


Result = NeedMore | ClientHello | Refused


def is_grease(value: int) -> bool:
    """RFC 8701's reserved values 0x0A0A, 0x1A1A ... 0xFAFA (versions, extensions, suites)."""
    return value & 0x0F0F == 0x0A0A and value >> 8 == value & 0xFF


class _Malformed(Exception):  # noqa: N818 -- internal: becomes Refused(MALFORMED) in feed()
    pass


class ClientHelloReader:
    """Reads one connection's ClientHello from the bytes it is fed (see the module's
    docstring). ``limit`` bounds the bytes of records the hello may take."""

    def __init__(self, *, limit: int = DEFAULT_LIMIT) -> None:
        if limit < _HEADER + 4:
            raise ValueError(f"limit {limit} is below one record header and a handshake header")
        self.limit = limit
        self._unread = bytearray()  # bytes fed but not yet a whole record
        self._handshake = bytearray()  # the handshake layer: record fragments reassembled
        self._consumed = 0  # bytes of whole records read
        self._records = 0
        self._result: ClientHello | Refused | None = None

    @property
    def result(self) -> Result:
        return NEED_MORE if self._result is None else self._result

    @property
    def held(self) -> int:
        """Bytes held now: the hello so far and an unread record's start (0 once decided)."""
        return len(self._unread) + len(self._handshake)

    def feed(self, data: bytes) -> Result:
        """Read ``data``, the next bytes of the connection; the answer so far."""
        if self._result is not None:
            return self._result
        self._unread += data
        try:
            self._result = self._read()
        except _Malformed as exc:
            self._result = Refused(Reason.MALFORMED, str(exc))
        if self._result is not None:
            self._unread = bytearray()
            self._handshake = bytearray()
        return self.result

    def _read(self) -> ClientHello | Refused | None:
        while True:
            if self._records == 0 and self._unread:
                refused = _first_bytes(self._unread)
                if refused is not None:
                    return refused
            if len(self._unread) < _HEADER:
                return None
            refused = self._record_header()
            if refused is not None:
                return refused
            length = int.from_bytes(self._unread[3:5])
            if len(self._unread) < _HEADER + length:
                return None
            self._handshake += self._unread[_HEADER : _HEADER + length]
            del self._unread[: _HEADER + length]
            self._consumed += _HEADER + length
            self._records += 1
            decided = self._handshake_message()
            if decided is not None:
                return decided

    def _record_header(self) -> Refused | None:
        kind, major, length = self._unread[0], self._unread[1], int.from_bytes(self._unread[3:5])
        if kind != _HANDSHAKE:  # the first record's type was checked by _first_bytes
            name = _CONTENT_TYPES.get(kind, f"type {kind}")
            raise _Malformed(
                f"a {name} record inside the ClientHello after {self._records} handshake "
                "record(s) (RFC 8446 §5.1: handshake messages are not interleaved)"
            )
        if major != 3:
            raise _Malformed(f"record version {major}.{self._unread[2]} inside the ClientHello")
        if length == 0:
            raise _Malformed("a zero-length handshake record (RFC 8446 §5.1)")
        if length > MAX_RECORD:
            raise _Malformed(f"a record of {length} bytes, over 2^14 (RFC 8446 §5.1)")
        if self._consumed + _HEADER + length > self.limit:
            return Refused(
                Reason.TOO_LARGE,
                f"the ClientHello's records pass {self.limit} bytes "
                f"(record {self._records + 1} of {length} bytes after {self._consumed})",
            )
        return None

    def _handshake_message(self) -> ClientHello | Refused | None:
        if len(self._handshake) < 4:
            return None
        if self._handshake[0] != _CLIENT_HELLO:
            return Refused(
                Reason.NOT_CLIENT_HELLO, f"handshake message type {self._handshake[0]}, not 1"
            )
        length = int.from_bytes(self._handshake[1:4])
        if 4 + length > self.limit - _HEADER:
            return Refused(
                Reason.TOO_LARGE,
                f"a ClientHello of {length} bytes cannot fit in {self.limit} bytes of records",
            )
        if len(self._handshake) < 4 + length:
            return None
        if len(self._handshake) > 4 + length:
            extra = len(self._handshake) - 4 - length
            raise _Malformed(f"{extra} byte(s) after the ClientHello in its record")
        return _client_hello(bytes(self._handshake[4:]), self._consumed, self._records)


def _first_bytes(start: bytearray) -> Refused | None:
    """What the connection's first bytes already rule out, as soon as they do (a plaintext
    client is refused on its first byte, not after five)."""
    first = start[0]
    if first & 0x80:
        return _sslv2(start)
    if first not in _CONTENT_TYPES:
        return Refused(Reason.NOT_TLS, f"first byte 0x{first:02x} is no TLS content type")
    if len(start) < 2:
        return None
    if start[1] != 3:
        return Refused(Reason.NOT_TLS, f"record version major {start[1]}, not 3")
    if first != _HANDSHAKE:
        return Refused(Reason.NOT_HANDSHAKE, f"the first record is {_CONTENT_TYPES[first]}")
    return None


def _sslv2(start: bytearray) -> Refused | None:
    """An SSLv2 record header (two length bytes, the high bit set) then msg_type 1 is an
    SSLv2-compatible hello; anything else with that first byte is not TLS."""
    if len(start) < 3:
        return None
    if start[2] == _CLIENT_HELLO:
        return Refused(Reason.SSLV2, "an SSLv2-compatible ClientHello (no SNI possible)")
    return Refused(Reason.NOT_TLS, f"first byte 0x{start[0]:02x} is no TLS content type")


class _Cursor:
    """Reads the RFCs' presentation-language fields from ``data``; ``_Malformed`` when a
    length runs past the end or breaks its vector's bounds."""

    def __init__(self, data: bytes, what: str) -> None:
        self.data = data
        self.at = 0
        self.what = what

    @property
    def left(self) -> int:
        return len(self.data) - self.at

    def uint(self, size: int, field: str) -> int:
        return int.from_bytes(self.take(size, field))

    def take(self, size: int, field: str) -> bytes:
        if size > self.left:
            raise _Malformed(f"{self.what}: {field} needs {size} bytes, {self.left} left")
        out = self.data[self.at : self.at + size]
        self.at += size
        return out

    def vector(self, length_size: int, low: int, high: int, field: str) -> bytes:
        """``opaque field<low..high>`` with a ``length_size``-byte length."""
        length = self.uint(length_size, f"{field} length")
        if not low <= length <= high:
            raise _Malformed(f"{self.what}: {field} of {length} bytes, outside {low}..{high}")
        return self.take(length, field)

    def end(self) -> None:
        if self.left:
            raise _Malformed(f"{self.what}: {self.left} byte(s) after its last field")


def _client_hello(body: bytes, consumed: int, records: int) -> ClientHello:
    hello = _Cursor(body, "ClientHello")
    legacy_version = hello.uint(2, "legacy_version")
    if legacy_version >> 8 != 3:
        raise _Malformed(f"ClientHello: legacy_version 0x{legacy_version:04x}, not 3.x")
    hello.take(32, "random")
    hello.vector(1, 0, 32, "legacy_session_id")
    suites = hello.vector(2, 2, 0xFFFE, "cipher_suites")
    if len(suites) % 2:
        raise _Malformed(f"ClientHello: cipher_suites of odd length {len(suites)}")
    hello.vector(1, 1, 0xFF, "legacy_compression_methods")
    extensions: dict[int, bytes] = {}
    if hello.left:  # RFC 5246 §7.4.1.2: a TLS 1.2 hello may end here, without extensions
        block = _Cursor(hello.vector(2, 0, 0xFFFF, "extensions"), "extensions")
        hello.end()
        while block.left:
            kind = block.uint(2, "extension_type")
            data = block.vector(2, 0, 0xFFFF, f"extension {kind}")
            if kind in extensions:  # RFC 8446 §4.2: at most one of each type
                raise _Malformed(f"extensions: extension {kind} appears twice")
            extensions[kind] = data
    return ClientHello(
        server_name=_server_name(extensions.get(_EXT_SERVER_NAME)),
        alpn=_alpn(extensions.get(_EXT_ALPN)),
        legacy_version=legacy_version,
        supported_versions=_supported_versions(extensions.get(_EXT_SUPPORTED_VERSIONS)),
        consumed=consumed,
        records=records,
    )


def _server_name(data: bytes | None) -> str:
    """RFC 6066 §3's ServerNameList. As OpenSSL reads it, it holds exactly one name, of type
    host_name: the only type ever defined, and the RFC allows one name per type."""
    if data is None:
        return ""
    outer = _Cursor(data, "server_name")
    names = _Cursor(outer.vector(2, 1, 0xFFFF, "server_name_list"), "server_name_list")
    outer.end()
    name_type = names.uint(1, "name_type")
    if name_type != _HOST_NAME:
        raise _Malformed(f"server_name_list: name_type {name_type}, not host_name (0)")
    raw = names.vector(2, 1, MAX_HOST_NAME, "host_name")
    names.end()
    if not all(0x21 <= byte <= 0x7E for byte in raw):  # ASCII (RFC 6066 §3), A-labels for IDNs
        raise _Malformed("server_name: host_name holds a byte outside printable ASCII")
    return raw.decode("ascii")


def _alpn(data: bytes | None) -> tuple[bytes, ...]:
    """RFC 7301 §3.1: ProtocolName protocol_name_list<2..2^16-1>, each name opaque<1..2^8-1>."""
    if data is None:
        return ()
    outer = _Cursor(data, "application_layer_protocol_negotiation")
    names = _Cursor(outer.vector(2, 2, 0xFFFF, "protocol_name_list"), "protocol_name_list")
    outer.end()
    protocols: list[bytes] = []
    while names.left:
        protocols.append(names.vector(1, 1, 0xFF, "protocol name"))
    return tuple(protocols)


def _supported_versions(data: bytes | None) -> tuple[int, ...]:
    """RFC 8446 §4.2.1: ProtocolVersion versions<2..254> in a ClientHello."""
    if data is None:
        return ()
    outer = _Cursor(data, "supported_versions")
    raw = outer.vector(1, 2, 254, "versions")
    outer.end()
    if len(raw) % 2:
        raise _Malformed(f"supported_versions: versions of odd length {len(raw)}")
    return tuple(int.from_bytes(raw[i : i + 2]) for i in range(0, len(raw), 2))
