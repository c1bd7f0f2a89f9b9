from __future__ import annotations

import pytest

from meshctl.core.gateway.hostnames import (
    ANY,
    best,
    covers,
    intersection,
    matches,
    precedence,
    request_host,
)


@pytest.mark.parametrize(
    ("authority", "host"),
    [
        ("Example.COM", "example.com"),
        ("example.com:8080", "example.com"),
        ("example.com.", "example.com"),
        ("example.com.:443", "example.com"),
        ("[::1]:8443", "[::1]"),
        ("[fd00::1]", "[fd00::1]"),
        ("10.0.0.1:80", "10.0.0.1"),
    ],
)
def test_request_host_drops_port_case_and_trailing_dot(authority, host):
    assert request_host(authority) == host


@pytest.mark.parametrize(
    ("pattern", "host", "gateway", "ingress"),
    [
        ("foo.example.com", "foo.example.com", True, True),
        ("foo.example.com", "bar.example.com", False, False),
        ("*.example.com", "foo.example.com", True, True),
        ("*.example.com", "foo.bar.example.com", True, False),  # one label only for Ingress
        ("*.example.com", "example.com", False, False),
        ("*.example.com", "fooexample.com", False, False),
        (ANY, "anything.at.all", True, True),
    ],
)
def test_wildcards_span_labels_for_the_gateway_api_and_one_label_for_ingress(
    pattern, host, gateway, ingress
):
    assert matches(pattern, host) is gateway
    assert matches(pattern, host, one_label=True) is ingress


@pytest.mark.parametrize(
    ("listener", "route", "expected"),
    [
        ("test.example.com", "test.example.com", "test.example.com"),
        ("test.example.com", "*.example.com", "test.example.com"),
        ("*.example.com", "test.example.com", "test.example.com"),
        ("*.example.com", "foo.test.example.com", "foo.test.example.com"),
        ("*.example.com", "*.foo.example.com", "*.foo.example.com"),
        ("*.foo.example.com", "*.example.com", "*.foo.example.com"),
        ("*.example.com", "example.com", None),
        ("*.example.com", "test.example.net", None),
        ("test.example.com", "other.example.com", None),
        (ANY, "*.example.com", "*.example.com"),
        ("*.example.com", ANY, "*.example.com"),
    ],
)
def test_intersection_is_the_narrower_pattern_or_none(listener, route, expected):
    assert intersection(listener, route) == expected
    assert intersection(route, listener) == expected


def test_one_label_wildcards_nest_only_when_equal():
    assert not covers("*.example.com", "*.foo.example.com", one_label=True)
    assert covers("*.example.com", "*.example.com", one_label=True)
    assert intersection("*.example.com", "a.b.example.com", one_label=True) is None


def test_precedence_orders_exact_then_longer_wildcards_then_any():
    patterns = [ANY, "*.example.com", "a.example.com", "*.foo.example.com", "longer.example.com"]
    assert sorted(patterns, key=precedence) == [
        "longer.example.com",
        "a.example.com",
        "*.foo.example.com",
        "*.example.com",
        ANY,
    ]


def test_best_pattern_is_the_most_specific_that_names_the_host():
    patterns = [ANY, "*.example.com", "*.foo.example.com", "abc.foo.example.com"]
    assert best(patterns, "abc.foo.example.com") == "abc.foo.example.com"
    assert best(patterns, "x.foo.example.com") == "*.foo.example.com"
    assert best(patterns, "x.example.com") == "*.example.com"
    assert best(patterns, "bar.com") == ANY
    assert best(["*.example.com"], "bar.com") is None
