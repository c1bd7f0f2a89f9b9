"""The raw-capture reader: frames -> segments -> streams -> TLS records (pure)."""

from __future__ import annotations

import ipaddress

from meshctl.core.wire import pcap


def _frame(src: str, dst: str, sport: int, dport: int, seq: int, payload: bytes) -> bytes:
    tcp = sport.to_bytes(2, "big") + dport.to_bytes(2, "big") + seq.to_bytes(4, "big")
    tcp += bytes(4) + bytes([5 << 4, 0x18]) + bytes(6)  # 20-byte header, PSH|ACK
    ip = bytes([0x45, 0]) + (20 + len(tcp) + len(payload)).to_bytes(2, "big") + bytes(5)
    ip += bytes([6]) + bytes(2) + ipaddress.IPv4Address(src).packed
    ip += ipaddress.IPv4Address(dst).packed
    return bytes(12) + b"\x08\x00" + ip + tcp + payload


def _record(kind: int, body: bytes) -> bytes:
    return bytes([kind, 3, 3]) + len(body).to_bytes(2, "big") + body


def test_records_are_counted_once_across_segments_and_retransmissions():
    stream = _record(22, b"h" * 40) + _record(23, b"a" * 100) + _record(23, b"b" * 7)
    a, b = stream[:60], stream[60:]
    frames = [
        _frame("10.0.0.2", "10.0.0.3", 40000, 15008, 1000 + 60, b),  # out of order
        _frame("10.0.0.2", "10.0.0.3", 40000, 15008, 1000, a),
        _frame("10.0.0.2", "10.0.0.3", 40000, 15008, 1000, a),  # retransmitted
        b"\x00" * 20,  # not IP: skipped
    ]
    flows = pcap.streams(pcap.segments(frames))
    assert flows == {(("10.0.0.2", 40000), ("10.0.0.3", 15008)): stream}
    records = pcap.tls_records(stream)
    assert records.counts == {"handshake": 1, "application_data": 2}
    assert records.whole
    assert records.total == 3


def test_plaintext_is_not_tls_and_a_cut_record_is_not_counted():
    assert not pcap.tls_records(b"GET / HTTP/1.1\r\n\r\n").whole
    cut = pcap.tls_records(_record(23, b"x" * 10) + _record(23, b"y" * 50)[:20])
    assert (cut.counts, cut.whole) == ({"application_data": 1}, True)
