"""What a raw packet capture shows: Ethernet frames -> TCP segments -> per-flow byte streams,
and TLS records in them.

Owns reading frames as the kernel hands them to an AF_PACKET socket (RFC 791 IPv4, RFC 8200
IPv6 without extension headers, RFC 9293 TCP) and walking TLS records (RFC 8446 section 5.1:
type, legacy version, 16-bit length). Invariants: pure (bytes in, values out); anything that is
not TCP over IPv4/IPv6 is skipped, never an error; a stream is rebuilt in sequence order with
retransmitted bytes counted once, so a record count does not depend on the capture's timing.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass

_ETH_IPV4 = b"\x08\x00"
_ETH_IPV6 = b"\x86\xdd"
_TCP = 6
TLS_CONTENT_TYPES = {20: "change_cipher_spec", 21: "alert", 22: "handshake", 23: "application_data"}


@dataclass(frozen=True, slots=True)
class Segment:
    """One TCP segment's addresses, sequence number and payload."""

    src: tuple[str, int]
    dst: tuple[str, int]
    seq: int
    payload: bytes


@dataclass(frozen=True, slots=True)
class TlsRecords:
    """The TLS records found at the start of a stream, by content type, and whether the whole
    stream parsed as records (False: it is not TLS, or the capture missed bytes)."""

    counts: dict[str, int]
    whole: bool

    @property
    def total(self) -> int:
        return sum(self.counts.values())


def segment(frame: bytes) -> Segment | None:
    """The TCP segment in an Ethernet frame, or None for anything else."""
    kind = frame[12:14]
    if kind == _ETH_IPV4 and len(frame) >= 34:
        ip = frame[14:]
        if ip[9] != _TCP:
            return None
        header = (ip[0] & 0x0F) * 4
        # 0 in frames the kernel merged (GRO/GSO): take what arrived.
        total = int.from_bytes(ip[2:4], "big") or len(ip)
        src_ip = str(ipaddress.IPv4Address(ip[12:16]))
        dst_ip = str(ipaddress.IPv4Address(ip[16:20]))
        tcp = ip[header:total]
    elif kind == _ETH_IPV6 and len(frame) >= 54:
        ip = frame[14:]
        if ip[6] != _TCP:
            return None
        length = int.from_bytes(ip[4:6], "big") or len(ip) - 40
        src_ip = str(ipaddress.IPv6Address(ip[8:24]))
        dst_ip = str(ipaddress.IPv6Address(ip[24:40]))
        tcp = ip[40 : 40 + length]
    else:
        return None
    if len(tcp) < 20:
        return None
    offset = (tcp[12] >> 4) * 4
    return Segment(
        (src_ip, int.from_bytes(tcp[0:2], "big")),
        (dst_ip, int.from_bytes(tcp[2:4], "big")),
        int.from_bytes(tcp[4:8], "big"),
        bytes(tcp[offset:]),
    )


def segments(frames: Iterable[bytes]) -> list[Segment]:
    return [s for frame in frames if (s := segment(frame)) is not None]


def streams(segs: Iterable[Segment]) -> dict[tuple[tuple[str, int], tuple[str, int]], bytes]:
    """Each direction of each TCP connection as one byte string, in sequence order.

    Retransmissions (a segment whose bytes were already seen) count once. Sequence numbers wrap
    at 2**32: a flow whose numbers span more than half the space wrapped, and starts at the
    lowest number above the half (captures here are short).
    """
    by_flow: dict[tuple[tuple[str, int], tuple[str, int]], list[Segment]] = {}
    for seg in segs:
        if seg.payload:
            by_flow.setdefault((seg.src, seg.dst), []).append(seg)
    out = {}
    for flow, items in by_flow.items():
        seqs = [s.seq for s in items]
        high = [s for s in seqs if s >= 1 << 31]
        base = min(high) if high and max(seqs) - min(seqs) > 1 << 31 else min(seqs)
        ordered = sorted(items, key=lambda s: (s.seq - base) % (1 << 32))
        data = bytearray()
        end = 0  # relative offset just past the bytes already in ``data``
        for seg in ordered:
            start = (seg.seq - base) % (1 << 32)
            if start + len(seg.payload) <= end:
                continue
            data += seg.payload[max(0, end - start) :]
            end = start + len(seg.payload)
        out[flow] = bytes(data)
    return out


def tls_records(stream: bytes) -> TlsRecords:
    """Count the TLS records a stream starts with; stops at the first byte that is not one."""
    counts: dict[str, int] = {}
    pos = 0
    while pos + 5 <= len(stream):
        kind = TLS_CONTENT_TYPES.get(stream[pos])
        if kind is None or stream[pos + 1] != 3:
            return TlsRecords(counts, whole=False)
        length = int.from_bytes(stream[pos + 3 : pos + 5], "big")
        if pos + 5 + length > len(stream):
            break  # the capture ended inside this record
        counts[kind] = counts.get(kind, 0) + 1
        pos += 5 + length
    return TlsRecords(counts, whole=True)
