"""Istio's AUTO_PASSTHROUGH server names: the canonical form parses into port, subset and host,
round-trips, and every other form is refused with the part that is wrong."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.tls.sni import (
    AutoPassthroughName,
    ServerNameError,
    format_auto_passthrough,
    parse_auto_passthrough,
)


def test_a_whole_service_name_has_an_empty_subset() -> None:
    got = parse_auto_passthrough("outbound_.8080_._.httpbin.default.svc.cluster.local")
    assert got == AutoPassthroughName(
        port=8080, subset="", host="httpbin.default.svc.cluster.local"
    )


def test_a_subset_name_is_read() -> None:
    got = parse_auto_passthrough("outbound_.9080_.v1_.reviews.default.svc.cluster.local")
    assert (got.port, got.subset, got.host) == (9080, "v1", "reviews.default.svc.cluster.local")


def test_names_compare_lower_case() -> None:
    got = parse_auto_passthrough("OUTBOUND_.80_.V2_.Web.Prod.svc.cluster.local")
    assert (got.subset, got.host) == ("v2", "web.prod.svc.cluster.local")


def test_formatting_writes_istios_form() -> None:
    name = AutoPassthroughName(port=15021, subset="", host="a.b.svc.cluster.local")
    assert format_auto_passthrough(name) == "outbound_.15021_._.a.b.svc.cluster.local"


@pytest.mark.parametrize(
    ("server_name", "detail"),
    [
        ("httpbin.default.svc.cluster.local", "0 of 3 '_.' separators"),
        ("outbound_.8080_.httpbin.default", "2 of 3 '_.' separators"),
        ("inbound_.8080_._.httpbin.default.svc.cluster.local", "direction 'inbound'"),
        ("outbound_.http_._.httpbin.default", "port 'http'"),
        ("outbound_._._.httpbin.default", "port ''"),
        ("outbound_.0_._.httpbin.default", "port '0'"),
        ("outbound_.080_._.httpbin.default", "port '080'"),
        ("outbound_.65536_._.httpbin.default", "port '65536'"),
        ("outbound_.+80_._.httpbin.default", "port '+80'"),
        ("outbound_.\uff18\uff10_._.httpbin.default", "is not ASCII"),  # fullwidth 80
        ("outbound_.80_._.\u212a.default", "is not ASCII"),
        ("outbound_.80_.v_1_.httpbin.default", "subset 'v_1'"),
        ("outbound_.80_.-v1_.httpbin.default", "subset '-v1'"),
        ("outbound_.80_._.", "no service host"),
        ("outbound_.80_._.httpbin..default", "host label ''"),
        ("outbound_.80_._.*.default", "host label '*'"),
        ("outbound_.80_._.httpbin.default.", "host label ''"),
        ("outbound_.80_._." + "a" * 64 + ".default", "host label 'aaaa"),
        ("outbound_.80_._." + ".".join(["a" * 60] * 5), "host of 304 characters"),
        ("outbound_.80_._.x_.y", "host label 'x_'"),
    ],
)
def test_other_forms_are_refused_naming_the_wrong_part(server_name: str, detail: str) -> None:
    with pytest.raises(ServerNameError, match=re.escape(detail)):
        parse_auto_passthrough(server_name)


labels = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?", fullmatch=True)


@given(
    port=st.integers(1, 65535),
    subset=st.just("") | labels,
    host=st.lists(labels, min_size=1, max_size=6).map(".".join),
)
def test_every_canonical_name_round_trips(port: int, subset: str, host: str) -> None:
    name = AutoPassthroughName(port=port, subset=subset, host=host)
    assert parse_auto_passthrough(format_auto_passthrough(name)) == name


@given(st.text(max_size=80))
def test_any_text_parses_or_is_refused_and_what_parses_is_canonical(text: str) -> None:
    try:
        name = parse_auto_passthrough(text)
    except ServerNameError:
        return
    assert format_auto_passthrough(name) == text.lower()
