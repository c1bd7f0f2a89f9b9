"""Hypothesis against the ClientHello reader: random bytes, valid hellos cut into random records
and fed in random pieces, truncations and mutated bytes. Whatever arrives, the reader answers
one of its three results (never raises), holds no more than its bound, and answers the same
however the bytes were split. ``MESHCTL_FUZZ_EXAMPLES`` raises the example count."""

from __future__ import annotations

import os
from collections.abc import Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.core.tls.clienthello import (
    MAX_RECORD,
    NEED_MORE,
    ClientHello,
    ClientHelloReader,
    NeedMore,
    Refused,
    Result,
)
from tests.unit.core.tls.hellos import (
    alpn_ext,
    body,
    ext,
    handshake,
    records,
    sni_ext,
    versions_ext,
)

EXAMPLES = int(os.environ.get("MESHCTL_FUZZ_EXAMPLES", "300"))

labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
host_names = st.lists(labels, min_size=1, max_size=5).map(".".join)
protocols = st.binary(min_size=1, max_size=20)
versions = st.integers(0, 0xFFFF)


@st.composite
def client_hellos(draw: st.DrawFn) -> tuple[bytes, str, tuple[bytes, ...], tuple[int, ...]]:
    """A valid hello (bytes) with the name, protocols and versions it was built with."""
    name = draw(st.none() | host_names)
    alpn = tuple(draw(st.lists(protocols, max_size=4)))
    offered = tuple(draw(st.lists(versions, max_size=6)))
    extensions = [ext(kind, draw(st.binary(max_size=40))) for kind in draw(_other_kinds())]
    if name is not None:
        extensions.append(sni_ext(name.encode()))
    if alpn:
        extensions.append(alpn_ext(*alpn))
    if offered:
        extensions.append(versions_ext(*offered))
    order = draw(st.permutations(extensions))
    session = draw(st.binary(max_size=32))
    layer = handshake(body(session_id=session, extensions=b"".join(order)))
    sizes = draw(st.lists(st.integers(1, max(1, len(layer))), max_size=8))
    return records(layer, sizes), name or "", alpn, offered


def _other_kinds() -> st.SearchStrategy[list[int]]:
    return st.lists(
        st.integers(0, 0xFFFF).filter(lambda k: k not in (0, 16, 43)), max_size=4, unique=True
    )


def feed_in_pieces(data: bytes, cuts: Sequence[int], limit: int | None = None) -> Result:
    """Feed ``data`` cut at ``cuts``; check the bound on what the reader holds after each
    piece; the final answer."""
    reader = ClientHelloReader() if limit is None else ClientHelloReader(limit=limit)
    result: Result = NEED_MORE
    bounds = sorted({c % (len(data) + 1) for c in cuts})
    for start, end in zip([0, *bounds], [*bounds, len(data)], strict=True):
        result = reader.feed(data[start:end])
        assert isinstance(result, NeedMore | ClientHello | Refused)
        if isinstance(result, NeedMore):
            assert reader.held < reader.limit + 5 + MAX_RECORD
        else:
            assert reader.held == 0
    return result


cut_lists = st.lists(st.integers(0, 1 << 20), max_size=12)


@settings(max_examples=EXAMPLES, deadline=None)
@given(data=st.binary(max_size=600), cuts=cut_lists)
def test_random_bytes_get_one_of_the_three_answers_however_split(
    data: bytes, cuts: list[int]
) -> None:
    assert feed_in_pieces(data, cuts) == ClientHelloReader().feed(data)


@settings(max_examples=EXAMPLES, deadline=None)
@given(start=st.sampled_from([b"\x16\x03\x01", b"\x16\x03\x03"]), rest=st.binary(max_size=400))
def test_random_bytes_behind_a_handshake_header_never_raise(start: bytes, rest: bytes) -> None:
    feed_in_pieces(start + rest, [3, 5, 9])


@settings(max_examples=EXAMPLES, deadline=None)
@given(hello=client_hellos(), cuts=cut_lists)
def test_valid_hellos_read_back_what_was_built_however_split(
    hello: tuple[bytes, str, tuple[bytes, ...], tuple[int, ...]], cuts: list[int]
) -> None:
    data, name, alpn, offered = hello
    result = feed_in_pieces(data, cuts)
    assert isinstance(result, ClientHello), result
    assert (result.server_name, result.alpn, result.supported_versions) == (name, alpn, offered)
    assert result.consumed == len(data)
    assert result == ClientHelloReader().feed(data)


@settings(max_examples=EXAMPLES, deadline=None)
@given(hello=client_hellos(), cut=st.integers(0, 1 << 20))
def test_a_truncated_valid_hello_needs_more_and_is_never_refused(
    hello: tuple[bytes, str, tuple[bytes, ...], tuple[int, ...]], cut: int
) -> None:
    data = hello[0]
    assert ClientHelloReader().feed(data[: cut % len(data)]) is NEED_MORE


@settings(max_examples=EXAMPLES, deadline=None)
@given(
    hello=client_hellos(),
    at=st.integers(0, 1 << 20),
    value=st.integers(0, 255),
    cuts=cut_lists,
)
def test_a_mutated_byte_is_answered_the_same_however_split(
    hello: tuple[bytes, str, tuple[bytes, ...], tuple[int, ...]],
    at: int,
    value: int,
    cuts: list[int],
) -> None:
    data = bytearray(hello[0])
    data[at % len(data)] = value
    assert feed_in_pieces(bytes(data), cuts) == ClientHelloReader().feed(bytes(data))


@settings(max_examples=EXAMPLES, deadline=None)
@given(hello=client_hellos(), limit=st.integers(9, 600), cuts=cut_lists)
def test_what_is_read_never_passes_the_limit(
    hello: tuple[bytes, str, tuple[bytes, ...], tuple[int, ...]], limit: int, cuts: list[int]
) -> None:
    data = hello[0]
    result = feed_in_pieces(data, cuts, limit)
    if len(data) <= limit:
        assert isinstance(result, ClientHello)
    else:
        assert isinstance(result, Refused)
        assert result.reason == "too-large"


def test_a_megabyte_of_handshake_records_is_refused_within_the_limit() -> None:
    # a hello that claims 16 MiB, sent as full records: refused before the reader holds more
    # than its limit, however much the client keeps sending
    reader = ClientHelloReader()
    first = b"\x01\xff\xff\xff" + b"\0" * (MAX_RECORD - 4)
    result = reader.feed(records(first))
    assert isinstance(result, Refused)
    assert result.reason == "too-large"
    reader = ClientHelloReader()
    claim = b"\x01" + (60 * 1024).to_bytes(3)  # fits the limit: only the records can pass it
    stream = records(claim + b"\0" * (MAX_RECORD - 4)) + records(b"\0" * MAX_RECORD) * 64
    for at in range(0, len(stream), 4096):
        result = reader.feed(stream[at : at + 4096])
        assert reader.held <= reader.limit + 4096
        if not isinstance(result, NeedMore):
            break
    assert isinstance(result, Refused)
    assert result.reason == "too-large"
    assert at < reader.limit + 4096
