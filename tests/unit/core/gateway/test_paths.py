from __future__ import annotations

import pytest

from meshctl.core.gateway.paths import (
    invalid_path,
    normalize,
    prefix_matches,
    remove_dot_segments,
    replace_prefix,
)


@pytest.mark.parametrize(
    ("prefix", "path", "expected"),
    [
        ("/abc", "/abc", True),
        ("/abc", "/abc/", True),
        ("/abc", "/abc/def", True),
        ("/abc", "/abcd", False),
        ("/abc/", "/abc", True),  # a trailing "/" of the prefix is ignored
        ("/abc/", "/abcd", False),
        ("/", "/anything/at/all", True),
        ("/aaa/bb", "/aaa/bbb", False),
        ("/aaa/bbb", "/aaa/bbbxyz", False),
    ],
)
def test_prefix_matches_element_by_element(prefix, path, expected):
    assert prefix_matches(prefix, path) is expected


# The API's ReplacePrefixMatch table (HTTPPathModifier), row by row.
@pytest.mark.parametrize(
    ("path", "prefix", "replacement", "expected"),
    [
        ("/foo/bar", "/foo", "/xyz", "/xyz/bar"),
        ("/foo/bar", "/foo", "/xyz/", "/xyz/bar"),
        ("/foo/bar", "/foo/", "/xyz", "/xyz/bar"),
        ("/foo/bar", "/foo/", "/xyz/", "/xyz/bar"),
        ("/foo", "/foo", "/xyz", "/xyz"),
        ("/foo/", "/foo", "/xyz", "/xyz/"),
        ("/foo/bar", "/foo", "", "/bar"),
        ("/foo/", "/foo", "", "/"),
        ("/foo", "/foo", "", "/"),
        ("/foo/", "/foo", "/", "/"),
        ("/foo", "/foo", "/", "/"),
    ],
)
def test_replace_prefix_follows_the_api_table(path, prefix, replacement, expected):
    assert replace_prefix(path, prefix, replacement) == expected


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/a/b/c", "/a/b/c"),
        ("/public/../admin", "/admin"),
        ("/a/./b", "/a/b"),
        ("/a/b/..", "/a/"),
        ("/a/.", "/a/"),
        ("/../../etc", "/etc"),
        ("/a//b", "/a//b"),
        ("", "/"),
    ],
)
def test_dot_segments_are_resolved_and_never_climb_above_root(path, expected):
    assert remove_dot_segments(path) == expected


@pytest.mark.parametrize(
    "value", ["foo", "/a//b", "/a/./b", "/a/../b", "/a%2fb", "/a%2Fb", "/a#b", "/a/..", "/a/."]
)
def test_paths_the_api_refuses_are_invalid(value):
    assert invalid_path(value)


def test_ordinary_paths_are_valid():
    assert invalid_path("/") == ""
    assert invalid_path("/foo/bar-baz_1.2~") == ""


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("/%61dmin", "/admin"),
        ("/%2e%2e/admin", "/admin"),
        ("/a%2Fb", "/a%2Fb"),  # an escaped "/" is not a separator
        ("/a%2fb", "/a%2Fb"),
        ("/%7Euser", "/~user"),
        ("/100%", "/100%"),  # not an escape
        ("/%zz", "/%zz"),
    ],
)
def test_unreserved_escapes_are_decoded_before_dot_segments(path, expected):
    assert normalize(path) == expected
