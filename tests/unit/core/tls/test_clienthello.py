"""The ClientHello reader on hand-built hellos: the facts it reports, reassembly across records,
and each documented refusal with its reason."""

from __future__ import annotations

import pytest

from meshctl.core.tls.clienthello import (
    DEFAULT_LIMIT,
    MAX_RECORD,
    NEED_MORE,
    ClientHello,
    ClientHelloReader,
    Reason,
    Refused,
    Result,
    is_grease,
)
from tests.unit.core.tls.hellos import (
    TLS12,
    TLS13,
    alpn_ext,
    body,
    ext,
    handshake,
    hello,
    records,
    sni_ext,
    vec,
    versions_ext,
)


def read(data: bytes, *, limit: int = DEFAULT_LIMIT) -> Result:
    return ClientHelloReader(limit=limit).feed(data)


def parsed(data: bytes, **kwargs: int) -> ClientHello:
    result = read(data, **kwargs)
    assert isinstance(result, ClientHello), result
    return result


def refused(data: bytes, reason: Reason, *, limit: int = DEFAULT_LIMIT) -> str:
    result = read(data, limit=limit)
    assert isinstance(result, Refused), result
    assert result.reason is reason, result
    return result.detail


def with_extensions(extensions: bytes) -> bytes:
    return records(handshake(body(extensions=extensions)))


# --- what a hello says --------------------------------------------------------------------


def test_a_tls13_hello_reports_its_name_protocols_and_versions() -> None:
    data = hello(b"a.example", (b"h2", b"http/1.1"), (TLS13, TLS12))
    got = parsed(data)
    assert got.server_name == "a.example"
    assert got.alpn == (b"h2", b"http/1.1")
    assert got.legacy_version == TLS12
    assert got.supported_versions == (TLS13, TLS12)
    assert got.version == TLS13
    assert (got.consumed, got.records) == (len(data), 1)


def test_a_tls12_hello_without_supported_versions_is_its_legacy_version() -> None:
    got = parsed(hello(b"b.example", (b"http/1.1",), ()))
    assert (got.version, got.supported_versions, got.alpn) == (TLS12, (), (b"http/1.1",))


def test_no_sni_is_an_absent_name_not_a_failure() -> None:
    got = parsed(hello(None, ()))
    assert (got.server_name, got.alpn) == ("", ())


def test_a_tls12_hello_may_end_without_an_extensions_block() -> None:
    got = parsed(records(handshake(body(extensions=None))))
    assert (got.server_name, got.alpn, got.supported_versions) == ("", (), ())


def test_an_empty_extensions_block_is_no_extensions() -> None:
    assert parsed(with_extensions(b"")).server_name == ""


def test_grease_versions_are_listed_but_not_the_version() -> None:
    got = parsed(hello(versions=(0x7A7A, TLS13, TLS12)))
    assert got.supported_versions == (0x7A7A, TLS13, TLS12)
    assert got.version == TLS13
    assert parsed(hello(versions=(0x0A0A,))).version == TLS12  # only GREASE: legacy_version


@pytest.mark.parametrize(
    ("value", "grease"),
    [(0x0A0A, True), (0xFAFA, True), (0x1A1A, True), (0x0A1A, False), (0x0304, False)],
)
def test_grease_values_are_rfc8701s(value: int, grease: bool) -> None:
    assert is_grease(value) is grease


def test_unknown_extensions_are_skipped() -> None:
    got = parsed(with_extensions(ext(0xFE0D, b"\x01\x02") + sni_ext(b"c.example") + ext(21, b"")))
    assert got.server_name == "c.example"


def test_the_name_is_reported_as_sent() -> None:
    assert parsed(hello(b"MiXeD.Example.")).server_name == "MiXeD.Example."


def test_alpn_names_are_bytes_as_sent_grease_included() -> None:
    assert parsed(hello(alpn=(b"\x0a\x0a", b"h2"))).alpn == (b"\x0a\x0a", b"h2")


def test_bytes_after_the_hello_records_are_not_consumed() -> None:
    data = hello()
    early = records(b"\x17" * 40, kind=23)  # e.g. TLS 1.3 early data right behind the hello
    got = parsed(data + early)
    assert got.consumed == len(data)


# --- reassembly and the incremental contract ----------------------------------------------


def test_a_hello_split_across_records_is_reassembled() -> None:
    whole = parsed(hello())
    data = hello(sizes=(10, 1, 50))
    got = parsed(data)
    assert (got.consumed, got.records) == (len(data), 4)
    assert (got.server_name, got.alpn, got.version) == (
        whole.server_name,
        whole.alpn,
        whole.version,
    )


def test_a_handshake_header_split_across_records_is_reassembled() -> None:
    assert parsed(hello(sizes=(1, 2))).server_name == "a.example"


def test_one_byte_at_a_time_needs_more_until_the_last_byte() -> None:
    data = hello(sizes=(7,))
    reader = ClientHelloReader()
    for byte in data[:-1]:
        assert reader.feed(bytes([byte])) is NEED_MORE
    assert isinstance(reader.feed(data[-1:]), ClientHello)


def test_the_answer_is_final_and_later_bytes_are_not_read() -> None:
    reader = ClientHelloReader()
    first = reader.feed(hello())
    assert reader.feed(b"GET / HTTP/1.1\r\n") is first
    assert reader.result is first
    assert reader.held == 0


def test_nothing_fed_needs_more() -> None:
    reader = ClientHelloReader()
    assert reader.feed(b"") is NEED_MORE
    assert reader.result is NEED_MORE


# --- refusals: what is not a ClientHello ----------------------------------------------------


def test_plaintext_http_is_not_tls_on_its_first_byte() -> None:
    assert "0x47" in refused(b"G", Reason.NOT_TLS)


def test_a_handshake_type_with_another_major_version_is_not_tls() -> None:
    assert "major 2" in refused(b"\x16\x02", Reason.NOT_TLS)


def test_an_sslv2_compatible_hello_is_its_own_reason() -> None:
    refused(b"\x80\x2e\x01\x00\x02", Reason.SSLV2)


def test_a_high_bit_first_byte_that_is_no_sslv2_hello_is_not_tls() -> None:
    refused(b"\x80\x2e\x02", Reason.NOT_TLS)


def test_a_first_byte_that_is_only_a_possible_start_waits() -> None:
    assert read(b"\x16") is NEED_MORE
    assert read(b"\x80\x2e") is NEED_MORE
    assert read(b"\x16\x03\x01\x00") is NEED_MORE


def test_an_alert_first_is_not_a_handshake() -> None:
    assert "alert" in refused(b"\x15\x03\x03\x00\x02\x02\x28", Reason.NOT_HANDSHAKE)


def test_a_server_hello_is_not_a_client_hello() -> None:
    refused(records(handshake(body(), msg_type=2)), Reason.NOT_CLIENT_HELLO)


# --- refusals: malformed records ------------------------------------------------------------


def test_a_zero_length_record_is_malformed() -> None:
    assert "zero-length" in refused(b"\x16\x03\x01\x00\x00", Reason.MALFORMED)


def test_a_record_over_two_to_the_fourteen_is_malformed() -> None:
    header = b"\x16\x03\x01" + (MAX_RECORD + 1).to_bytes(2)
    assert "2^14" in refused(header, Reason.MALFORMED)


def test_a_record_of_exactly_16_kib_carries_a_hello() -> None:
    base = handshake(body(extensions=sni_ext(b"big.example")))
    padding = MAX_RECORD - len(base) - 4  # extension header: type and length
    layer = handshake(body(extensions=sni_ext(b"big.example") + ext(21, b"\0" * padding)))
    assert len(layer) == MAX_RECORD
    assert parsed(records(layer)).server_name == "big.example"


def test_another_record_type_inside_the_hello_is_malformed() -> None:
    layer = handshake(body(extensions=sni_ext(b"a.example")))
    data = records(layer[:10]) + records(b"\x02\x28", kind=21) + records(layer[10:])
    assert "alert record inside" in refused(data, Reason.MALFORMED)


def test_another_record_version_major_inside_the_hello_is_malformed() -> None:
    layer = handshake(body())
    data = records(layer[:10]) + records(layer[10:], version=b"\x02\x00")
    assert "record version 2.0" in refused(data, Reason.MALFORMED)


def test_handshake_bytes_after_the_hello_in_its_record_are_malformed() -> None:
    data = records(handshake(body()) + handshake(b"", msg_type=20))
    assert "4 byte(s) after the ClientHello" in refused(data, Reason.MALFORMED)


# --- refusals: malformed hellos -------------------------------------------------------------


@pytest.mark.parametrize(
    ("message", "detail"),
    [
        (body(legacy_version=0x0200), "legacy_version 0x0200"),
        (body(session_id=b"\0" * 33), "legacy_session_id of 33 bytes"),
        (body(suites=b""), "cipher_suites of 0 bytes"),
        (body(suites=b"\x13\x01\x13"), "cipher_suites of odd length 3"),
        (body(compression=b""), "legacy_compression_methods of 0 bytes"),
        (body()[:20], "random needs 32 bytes"),
        (body(extensions=None) + b"\x00", "extensions length needs 2 bytes"),
        (body(extensions=None) + b"\x00\x05\x00", "extensions needs 5 bytes, 1 left"),
        (body(extensions=sni_ext(b"a.example")) + b"\x00", "1 byte(s) after its last field"),
        (body(extensions=b"\x00\x00\x00\x09"), "extension 0 needs 9 bytes"),
        (body(extensions=b"\x00"), "extension_type needs 2 bytes"),
        (body(extensions=alpn_ext(b"h2") * 2), "extension 16 appears twice"),
    ],
)
def test_hello_fields_that_break_the_grammar_are_malformed(message: bytes, detail: str) -> None:
    assert detail in refused(records(handshake(message)), Reason.MALFORMED)


@pytest.mark.parametrize(
    ("extension", "detail"),
    [
        (ext(0, b""), "server_name_list length needs 2 bytes"),
        (ext(0, vec(2, b"")), "server_name_list of 0 bytes"),
        (ext(0, vec(2, b"\x00" + vec(2, b"a")) + b"\x00"), "server_name: 1 byte(s) after"),
        (sni_ext(b"a.example", name_type=1), "name_type 1, not host_name"),
        (sni_ext(b""), "host_name of 0 bytes"),
        (sni_ext(b"a" * 256), "host_name of 256 bytes"),
        (sni_ext(b"a.exam\x00ple"), "outside printable ASCII"),
        (sni_ext(b"a example"), "outside printable ASCII"),
        (sni_ext("bücher.example".encode()), "outside printable ASCII"),
        (
            ext(0, vec(2, b"\x00" + vec(2, b"a.example") + b"\x00" + vec(2, b"b.example"))),
            "server_name_list: 12 byte(s) after",
        ),
        (ext(16, vec(2, b"")), "protocol_name_list of 0 bytes"),
        (ext(16, vec(2, b"\x00\x02h2")), "protocol name of 0 bytes"),
        (ext(16, vec(2, b"\x05h2")), "protocol name needs 5 bytes"),
        (ext(16, vec(2, b"\x02h2") + b"!"), "1 byte(s) after"),
        (ext(43, vec(1, b"")), "versions of 0 bytes"),
        (ext(43, vec(1, b"\x03\x04\x03")), "versions of odd length 3"),
        (ext(43, vec(1, b"\x03\x04" * 127 + b"\x03")), "versions of 255 bytes"),
        (ext(43, vec(1, b"\x03\x04") + b"\x00"), "supported_versions: 1 byte(s) after"),
    ],
)
def test_sni_alpn_and_versions_that_break_their_rfcs_are_malformed(
    extension: bytes, detail: str
) -> None:
    assert detail in refused(with_extensions(extension), Reason.MALFORMED)


def test_a_longest_host_name_is_read() -> None:
    name = b".".join([b"a" * 63] * 4)[:255]
    assert parsed(hello(name)).server_name == name.decode()


# --- the limit -------------------------------------------------------------------------------


def test_a_declared_hello_too_large_for_the_limit_is_refused_on_its_first_record() -> None:
    data = b"\x16\x03\x01\x00\x04" + b"\x01" + (1 << 20).to_bytes(3)
    assert "1048576 bytes" in refused(data, Reason.TOO_LARGE)


def test_records_past_the_limit_are_refused_before_they_are_read() -> None:
    data = hello(sizes=(20,) * 20)  # the hello fits the limit, its record headers do not
    layer = len(hello()) - 5  # the same hello in one record
    limit = layer + 5 + 7
    assert len(data) > limit
    detail = refused(data, Reason.TOO_LARGE, limit=limit)
    passing = limit // 25 + 1  # records of 25 bytes: the first that would end past the limit
    assert f"record {passing} of" in detail


def test_a_hello_exactly_at_the_limit_is_read_and_one_byte_less_is_not() -> None:
    data = hello()
    assert parsed(data, limit=len(data)).consumed == len(data)
    refused(data, Reason.TOO_LARGE, limit=len(data) - 1)


def test_a_limit_below_one_header_is_a_local_error() -> None:
    with pytest.raises(ValueError, match="limit 8"):
        ClientHelloReader(limit=8)


def test_versions_ext_builds_what_the_parser_reads() -> None:
    # the helper under the other tests: a versions list the parser reads back in order
    assert parsed(with_extensions(versions_ext(TLS12, TLS13))).supported_versions == (
        TLS12,
        TLS13,
    )
