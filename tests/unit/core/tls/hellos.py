"""ClientHellos built by hand from their RFC fields, so a test can get any length wrong on
purpose. Written from RFC 8446 §4.1.2/§4.2 and §5.1, RFC 6066 §3 and RFC 7301 §3.1 directly,
not through the parser under test."""

from __future__ import annotations

from collections.abc import Sequence

TLS12 = 0x0303
TLS13 = 0x0304


def vec(length_size: int, data: bytes) -> bytes:
    """``opaque<..>`` with a ``length_size``-byte length in front."""
    return len(data).to_bytes(length_size) + data


def ext(kind: int, data: bytes) -> bytes:
    return kind.to_bytes(2) + vec(2, data)


def sni_ext(name: bytes, name_type: int = 0) -> bytes:
    return ext(0, vec(2, bytes([name_type]) + vec(2, name)))


def alpn_ext(*names: bytes) -> bytes:
    return ext(16, vec(2, b"".join(vec(1, n) for n in names)))


def versions_ext(*versions: int) -> bytes:
    return ext(43, vec(1, b"".join(v.to_bytes(2) for v in versions)))


def body(
    *,
    legacy_version: int = TLS12,
    session_id: bytes = b"\x11" * 32,
    suites: bytes = b"\x13\x01\x13\x02\xc0\x2f",
    compression: bytes = b"\x00",
    extensions: bytes | None = b"",
) -> bytes:
    """A ClientHello body; ``extensions=None`` ends it after the compression methods (the
    TLS 1.2 form without an extensions block)."""
    out = (
        legacy_version.to_bytes(2)
        + b"\x5a" * 32
        + vec(1, session_id)
        + vec(2, suites)
        + vec(1, compression)
    )
    return out if extensions is None else out + vec(2, extensions)


def handshake(message: bytes, msg_type: int = 1) -> bytes:
    return bytes([msg_type]) + len(message).to_bytes(3) + message


def records(
    layer: bytes,
    sizes: Sequence[int] = (),
    *,
    kind: int = 22,
    version: bytes = b"\x03\x01",
) -> bytes:
    """``layer`` in records of ``sizes`` bytes (the rest in the last one; one record when
    ``sizes`` is empty)."""
    out = b""
    at = 0
    for size in sizes:
        fragment = layer[at : at + size]
        if fragment:
            out += bytes([kind]) + version + vec(2, fragment)
        at += len(fragment)
    if at < len(layer):
        out += bytes([kind]) + version + vec(2, layer[at:])
    return out


def hello(
    server_name: bytes | None = b"a.example",
    alpn: Sequence[bytes] = (b"h2", b"http/1.1"),
    versions: Sequence[int] = (TLS13, TLS12),
    *,
    more: bytes = b"",
    sizes: Sequence[int] = (),
) -> bytes:
    """A whole ClientHello as a client writes it: records around a handshake message."""
    extensions = b""
    if server_name is not None:
        extensions += sni_ext(server_name)
    if alpn:
        extensions += alpn_ext(*alpn)
    if versions:
        extensions += versions_ext(*versions)
    return records(handshake(body(extensions=extensions + more)), sizes)
