from __future__ import annotations

import pytest

from meshctl.core.gateway.filters import modify_headers, redirect_location, rewritten
from meshctl.core.gateway.model import (
    HeaderModifier,
    PathModifier,
    PathModifierType,
    Redirect,
    Rewrite,
)


def test_header_modifier_sets_adds_and_removes_case_insensitively():
    headers = (("My-Header", "foo"), ("x-keep", "1"), ("X-Drop", "a"), ("x-drop", "b"))
    modifier = HeaderModifier(
        set=(("my-header", "bar"), ("x-new", "n")),
        add=(("x-keep", "2"),),
        remove=("x-DROP",),
    )
    assert modify_headers(headers, modifier) == (
        ("my-header", "bar"),
        ("x-keep", "1"),
        ("x-new", "n"),
        ("x-keep", "2"),
    )


def test_set_replaces_every_value_of_a_repeated_header_once():
    headers = (("a", "1"), ("A", "2"))
    assert modify_headers(headers, HeaderModifier(set=(("a", "x"),))) == (("a", "x"),)


def _location(redirect, *, scheme="http", listener_port=80, path="/foo/bar", query=""):
    return redirect_location(
        redirect,
        scheme=scheme,
        host="example.com",
        listener_port=listener_port,
        path=path,
        query=query,
        matched_prefix="/foo",
    )


@pytest.mark.parametrize(
    ("redirect", "scheme", "listener_port", "expected"),
    [
        (Redirect(), "http", 80, "http://example.com/foo/bar"),
        (Redirect(), "http", 8080, "http://example.com:8080/foo/bar"),
        (Redirect(scheme="https"), "http", 80, "https://example.com/foo/bar"),  # scheme's port
        (Redirect(scheme="https"), "http", 8080, "https://example.com/foo/bar"),
        (Redirect(scheme="https", port=8443), "http", 80, "https://example.com:8443/foo/bar"),
        (Redirect(port=443), "https", 8443, "https://example.com/foo/bar"),
        (Redirect(hostname="other.org"), "http", 80, "http://other.org/foo/bar"),
    ],
)
def test_redirect_port_follows_the_api_rules(redirect, scheme, listener_port, expected):
    assert _location(redirect, scheme=scheme, listener_port=listener_port) == expected


def test_redirect_path_modifiers_and_query_are_applied():
    full = Redirect(path=PathModifier(PathModifierType.FULL, "/new"))
    prefix = Redirect(path=PathModifier(PathModifierType.PREFIX, "/xyz"))
    assert _location(full, query="a=1") == "http://example.com/new?a=1"
    assert _location(prefix) == "http://example.com/xyz/bar"


def test_rewrite_changes_host_and_path_only_when_asked():
    assert rewritten(None, host="h", path="/foo/bar", matched_prefix="/foo") == ("h", "/foo/bar")
    rewrite = Rewrite(hostname="up", path=PathModifier(PathModifierType.PREFIX, "/"))
    assert rewritten(rewrite, host="h", path="/foo/bar", matched_prefix="/foo") == ("up", "/bar")
