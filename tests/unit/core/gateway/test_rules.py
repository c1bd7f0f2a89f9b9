from __future__ import annotations

import pytest

from meshctl.core.gateway.model import Backend, PathModifierType, PathType
from meshctl.core.gateway.rules import duration_ms, read_rules


def _backend(ref):
    return Backend(namespace="ns", name=ref.get("name", ""), port=ref.get("port", 0))


def _read(*rules):
    return read_rules(list(rules), _backend)


@pytest.mark.parametrize(
    ("text", "ms"),
    [("10s", 10_000), ("1h", 3_600_000), ("1m30s", 90_000), ("500ms", 500), ("0s", 0)],
)
def test_gateway_api_durations_in_milliseconds(text, ms):
    assert duration_ms(text) == ms


@pytest.mark.parametrize("text", ["", "10", "1.5s", "1d", "-1s", "123456s", "1h1m1s1ms1h"])
def test_what_is_not_a_gateway_api_duration(text):
    assert duration_ms(text) is None


def test_a_rule_without_matches_matches_every_path():
    [rule], problems = _read({"backendRefs": [{"name": "a", "port": 80}]})
    assert problems == ()
    assert [(m.path.type, m.path.value) for m in rule.matches] == [(PathType.PREFIX, "/")]


def test_repeated_header_and_query_names_count_once_the_first_one_winning():
    [rule], _ = _read(
        {
            "matches": [
                {
                    "headers": [
                        {"name": "Version", "value": "1"},
                        {"name": "version", "value": "2"},
                    ],
                    "queryParams": [{"name": "q", "value": "a"}, {"name": "q", "value": "b"}],
                }
            ]
        }
    )
    [match] = rule.matches
    assert [(h.name, h.value) for h in match.headers] == [("version", "1")]
    assert [(q.name, q.value) for q in match.query] == [("q", "a")]


@pytest.mark.parametrize(
    ("rule", "words"),
    [
        (
            {"matches": [{"path": {"type": "RegularExpression", "value": "/.*"}}]},
            "RegularExpression",
        ),
        (
            {"matches": [{"headers": [{"type": "RegularExpression", "name": "a", "value": "."}]}]},
            "RegularExpression",
        ),
        (
            {
                "matches": [
                    {"queryParams": [{"type": "RegularExpression", "name": "a", "value": "."}]}
                ]
            },
            "RegularExpression",
        ),
        ({"matches": [{"method": "BREW"}]}, "BREW"),
        ({"matches": [{"path": {"type": "PathPrefix", "value": "/a/../b"}}]}, "'/../'"),
        ({"filters": [{"type": "RequestMirror"}]}, "RequestMirror"),
        ({"filters": [{"type": "RequestRedirect", "requestRedirect": {"statusCode": 305}}]}, "305"),
        ({"filters": [{"type": "RequestRedirect", "requestRedirect": {"scheme": "ftp"}}]}, "ftp"),
        ({"timeouts": {"request": "soon"}}, "soon"),
        ({"backendRefs": [{"name": "a", "port": 1, "filters": [{"type": "X"}]}]}, "filters"),
    ],
)
def test_unsupported_values_are_problems(rule, words):
    _, problems = _read(rule)
    assert [reason for reason, _ in problems] == ["UnsupportedValue"]
    assert words in problems[0][1]


def test_redirect_with_rewrite_is_incompatible():
    _, problems = _read(
        {
            "filters": [
                {"type": "RequestRedirect", "requestRedirect": {}},
                {"type": "URLRewrite", "urlRewrite": {"hostname": "x"}},
            ]
        }
    )
    assert [reason for reason, _ in problems] == ["IncompatibleFilters"]


def test_replace_prefix_match_needs_exactly_one_path_prefix_match():
    rewrite = {
        "type": "URLRewrite",
        "urlRewrite": {"path": {"type": "ReplacePrefixMatch", "replacePrefixMatch": "/b"}},
    }
    [rule], problems = _read({"matches": [{"path": {"value": "/a"}}], "filters": [rewrite]})
    assert problems == ()
    assert rule.filters.rewrite is not None
    assert rule.filters.rewrite.path is not None
    assert rule.filters.rewrite.path.type is PathModifierType.PREFIX
    _, problems = _read(
        {"matches": [{"path": {"type": "Exact", "value": "/a"}}], "filters": [rewrite]}
    )
    assert "ReplacePrefixMatch" in problems[0][1]


def test_filters_and_timeouts_are_read():
    [rule], problems = _read(
        {
            "filters": [
                {
                    "type": "RequestHeaderModifier",
                    "requestHeaderModifier": {
                        "set": [{"name": "a", "value": "1"}],
                        "add": [{"name": "b", "value": "2"}],
                        "remove": ["c"],
                    },
                },
                {
                    "type": "ResponseHeaderModifier",
                    "responseHeaderModifier": {"add": [{"name": "d", "value": "4"}]},
                },
            ],
            "timeouts": {"request": "10s", "backendRequest": "2s"},
        }
    )
    assert problems == ()
    assert rule.filters.request_headers is not None
    assert rule.filters.request_headers.set == (("a", "1"),)
    assert rule.filters.request_headers.remove == ("c",)
    assert rule.filters.response_headers is not None
    assert rule.filters.response_headers.add == (("d", "4"),)
    assert (rule.timeouts.request_ms, rule.timeouts.backend_request_ms) == (10_000, 2_000)


def test_route_paths_are_compared_with_unreserved_escapes_decoded():
    [rule], _ = _read({"matches": [{"path": {"type": "Exact", "value": "/%7Euser"}}]})
    assert rule.matches[0].path.value == "/~user"
