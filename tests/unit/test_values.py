"""Parsing the values users type: durations, ports, counts, addresses, listen addresses."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl import values


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5s", 5.0), ("300ms", 0.3), ("1m30s", 90.0), ("2h", 7200.0), ("30d", 2592000.0),
     ("1.5s", 1.5), ("90", 90.0), ("0", 0.0), ("250us", 0.00025), ("-1s", -1.0)],
)  # fmt: skip
def test_durations_read_as_go_writes_them(text, seconds):
    assert values.parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize("text", ["", "soon", "5 s", "1h1", "s", "1x", "--1s"])
def test_a_non_duration_names_the_accepted_forms(text):
    with pytest.raises(ValueError, match=r"is not a duration \(e\.g\. 30s, 500ms"):
        values.parse_duration(text)


@given(st.integers(min_value=1, max_value=10**7).map(lambda ms: ms / 1000))
def test_a_formatted_duration_reads_back(seconds):
    assert values.parse_duration(values.format_duration(seconds)) == pytest.approx(seconds)


@pytest.mark.parametrize(
    ("parser", "raw", "message"),
    [
        (values.Duration(positive=True), "0s", "0s is out of range (more than 0s)"),
        (values.Duration(maximum=3600), "-1", "-1s is out of range (0s to 1h)"),
        (values.Duration(positive=True, maximum=300), "6m", "(more than 0s, at most 5m)"),
        (values.PORT, "0", "0 is out of range for a port (1-65535)"),
        (values.PORT, "http", "'http' is not a port (1-65535)"),
        (values.NUMERIC_ID, "-1", "(0-4294967294)"),
        (values.Integer(1, None), "0", "(at least 1)"),
        (values.ADDRESS, "nothost", "'nothost' is not an IP address"),
        (values.CIDR, "10.0.0.0/33", "'10.0.0.0/33' is not a CIDR"),
        (values.Choice(("a", "b")), "c", "'c' is not one of a, b"),
        (values.ListenAddress(), "8000", "is not HOST:PORT"),
        (values.ListenAddress(), ":70000", "':70000': port 70000 is out of range (1-65535)"),
        (values.ListenAddress(zero_ok=True), ":-1", "(0-65535; 0: any free port)"),
        (values.ListenAddress(), "example.org:80", "'example.org' is not an IP address"),
        (values.DIAL_ADDRESS, "127.0.0.1:99999", "port 99999 is out of range (1-65535)"),
        (values.DIAL_ADDRESS, "ca:http", "'http' is not a port (1-65535)"),
        (values.DIAL_ADDRESS, ":15012", "names no host"),
        (values.DIAL_ADDRESS, "a_b:1", "is neither a host name nor an IP address"),
        (values.DIAL_ADDRESS, "http://ca:15012", "plaintext (http://) is not supported"),
        (values.ListenAddress(), "::1:80", "IPv6 address in brackets"),
        (values.PORT, True, "expected a value, not bool"),
    ],
)
def test_out_of_range_and_malformed_values_say_what_is_allowed(parser, raw, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        parser(raw)


def test_parsers_accept_their_own_results():
    # A settings file's YAML number, or a group option handed down to a subcommand.
    assert values.PORT(values.PORT("80")) == 80
    assert values.Duration()(values.Duration()("1m")) == 60.0
    assert values.ADDRESS(values.ADDRESS("::")) == "::"
    assert values.ListenAddress(empty_ok=True)("") == ""
    assert values.ListenAddress()("[::]:8000") == "[::]:8000"
    assert values.ListenAddress()(":8000") == ":8000"
    assert values.DIAL_ADDRESS("https://ca.ns.svc:15012/") == "ca.ns.svc:15012"
    assert values.DIAL_ADDRESS(values.DIAL_ADDRESS("[::1]:15012")) == "[::1]:15012"
