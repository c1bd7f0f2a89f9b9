from __future__ import annotations

import pytest

from meshctl.core.gateway import table
from meshctl.core.gateway.matching import Outcome, Request, choose_backend, match
from meshctl.core.gateway.model import (
    Filters,
    PathModifier,
    PathModifierType,
    Redirect,
    Rewrite,
    Route,
    RouteKey,
    Rule,
)

from .tables import backend, exact, headers, listener, prefix, query, route, single


def _to(table_, path="/", *, host="example.com", port=80, **kw):
    decision = match(table_, Request(port=port, host=host, path=path, **kw))
    if decision.outcome is not Outcome.FORWARD:
        return decision.outcome
    return decision.backends[0].name


def test_exact_path_beats_a_longer_prefix_and_the_longest_prefix_beats_shorter_ones():
    t = single(
        route("r", ((prefix("/foo/bar/baz"),), "deep"), ((exact("/foo/bar"),), "exact")),
        route("s", ((prefix("/foo"),), "short"), ((prefix("/foo/bar"),), "long")),
    )
    assert _to(t, "/foo/bar") == "exact"
    assert _to(t, "/foo/bar/") == "long"
    assert _to(t, "/foo/bar/baz/x") == "deep"
    assert _to(t, "/foo/x") == "short"
    assert _to(t, "/foobar") is Outcome.NO_ROUTE


def test_method_then_header_count_then_query_count_break_path_ties():
    t = single(
        route(
            "r",
            ((prefix("/p"),), "plain"),
            ((prefix("/p", query=query(a="1", b="2")),), "two-query"),
            ((prefix("/p", headers=headers(x="1")),), "one-header"),
            ((prefix("/p", headers=headers(x="1", y="2")),), "two-headers"),
            ((prefix("/p", method="POST"),), "post"),
        )
    )
    assert _to(t, "/p") == "plain"
    assert _to(t, "/p", query="a=1&b=2") == "two-query"
    assert _to(t, "/p", headers=(("X", "1"),)) == "one-header"
    assert _to(t, "/p", headers=(("x", "1"), ("y", "2")), query="a=1&b=2") == "two-headers"
    assert _to(t, "/p", method="POST", headers=(("x", "1"), ("y", "2"))) == "post"


def test_ties_across_routes_go_to_the_oldest_then_namespace_slash_name():
    old = route("zzz", ((prefix("/"),), "old"), created="2025-01-01T00:00:00Z")
    new = route("aaa", ((prefix("/"),), "new"), created="2026-01-01T00:00:00Z")
    assert _to(single(new, old)) == "old"
    # "a-b/x" sorts before "a/x" as text ("-" < "/"), though "a" < "a-b" as namespaces
    dashed = route("x", ((prefix("/"),), "dashed"), namespace="a-b")
    plain = route("x", ((prefix("/"),), "plain"), namespace="a")
    assert _to(single(plain, dashed)) == "dashed"


def test_within_a_route_the_first_matching_rule_wins():
    t = single(route("r", ((prefix("/"),), "first"), ((prefix("/"),), "second")))
    assert _to(t) == "first"


def test_headers_match_case_insensitively_by_name_and_exactly_by_value():
    t = single(route("r", ((prefix("/", headers=headers(version="v2")),), "v2")))
    assert _to(t, headers=(("Version", "v2"),)) == "v2"
    assert _to(t, headers=(("version", "V2"),)) is Outcome.NO_ROUTE


def test_a_repeated_query_param_matches_on_its_first_value():
    t = single(route("r", ((prefix("/", query=query(a="1")),), "one")))
    assert _to(t, query="a=1&a=2") == "one"
    assert _to(t, query="a=2&a=1") is Outcome.NO_ROUTE


def test_dot_segments_are_resolved_before_matching():
    t = single(route("r", ((prefix("/admin"),), "admin"), ((prefix("/public"),), "public")))
    assert _to(t, "/public/../admin/x") == "admin"


def test_the_most_specific_host_takes_the_request_without_falling_through():
    t = single(
        route("wild", ((prefix("/wild"),), "wild"), hostnames=("*.example.com",)),
        route("exact", ((prefix("/exact"),), "exact"), hostnames=("foo.example.com",)),
    )
    assert _to(t, "/exact", host="foo.example.com:80") == "exact"
    assert _to(t, "/wild", host="bar.example.com") == "wild"
    decision = match(t, Request(port=80, host="foo.example.com", path="/wild"))
    assert decision.outcome is Outcome.NO_ROUTE
    assert decision.reason == "no-route (host foo.example.com: no rule matches GET /wild)"


def test_listeners_are_isolated_by_hostname():
    t = table.build(
        [
            (listener("any"), [route("a", ((prefix("/"),), "any"))]),
            (listener("wild", hostname="*.example.com"), [route("b", ((prefix("/"),), "wild"))]),
        ]
    )
    assert _to(t, host="bar.com") == "any"
    assert _to(t, host="x.example.com") == "wild"


def test_no_listener_and_no_host_answer_404_with_the_reason():
    t = single(route("r", ((prefix("/"),), "b"), hostnames=("a.example.com",)))
    assert match(t, Request(port=81, host="a.example.com")).reason == (
        "no-route (no listener on port 81)"
    )
    decision = match(t, Request(port=80, host="b.example.com"))
    assert (decision.status, decision.reason) == (404, "no-route (host b.example.com)")
    scoped = single(route("r", ((prefix("/"),), "b")), hostname="*.example.com")
    assert match(scoped, Request(port=80, host="bar.com")).reason == (
        "no-route (host bar.com: no listener)"
    )


def _https_table(*, same_certificate: bool, by_listener: bool = False):
    return table.build(
        [
            (
                listener("default", port=443, https=True, certificates=("a",)),
                [route("a", ((prefix("/"),), "default"))],
            ),
            (
                listener(
                    "b",
                    port=443,
                    https=True,
                    hostname="b.example.com",
                    certificates=("a",) if same_certificate else ("b",),
                ),
                [route("b", ((prefix("/"),), "b"))],
            ),
        ],
        misdirected_by_listener=by_listener,
    )


def test_a_host_of_a_listener_with_another_certificate_is_misdirected():
    t = _https_table(same_certificate=False)
    decision = match(t, Request(port=443, host="b.example.com", sni="a.example.com"))
    assert (decision.outcome, decision.status) == (Outcome.MISDIRECTED, 421)
    assert decision.reason == (
        "misdirected (host b.example.com belongs to listener ns/gw/b, TLS was for ns/gw/default)"
    )
    assert _to(t, host="b.example.com", port=443, sni="b.example.com") == "b"


def test_a_coalesced_connection_is_routed_when_the_certificate_is_the_same():
    t = _https_table(same_certificate=True)
    assert _to(t, host="b.example.com", port=443, sni="a.example.com") == "b"
    strict = _https_table(same_certificate=True, by_listener=True)
    assert _to(strict, host="b.example.com", port=443, sni="a.example.com") == Outcome.MISDIRECTED


def test_rules_without_usable_backends_answer_500_with_the_reason():
    r = Route(
        key=RouteKey("HTTPRoute", "ns", "r"),
        rules=(
            Rule(index=0, matches=(exact("/none"),)),
            Rule(index=1, matches=(exact("/zero"),), backends=(backend("a", weight=0),)),
            Rule(
                index=2,
                matches=(exact("/bad"),),
                backends=(backend("gone", problem="BackendNotFound"),),
            ),
            Rule(
                index=3,
                matches=(exact("/half"),),
                backends=(backend("gone", problem="BackendNotFound"), backend("ok")),
            ),
        ),
    )
    t = single(r)
    reasons = {p: match(t, Request(port=80, host="h", path=p)) for p in ("/none", "/zero", "/bad")}
    assert {d.status for d in reasons.values()} == {500}
    assert reasons["/none"].reason == "no-backend (HTTPRoute ns/r rules[0]: no backendRefs)"
    assert reasons["/zero"].reason == "no-backend (HTTPRoute ns/r rules[1]: every weight is 0)"
    assert reasons["/bad"].reason == (
        "no-backend (HTTPRoute ns/r rules[2]: BackendNotFound ns/gone:80)"
    )
    half = match(t, Request(port=80, host="h", path="/half"))
    assert half.outcome is Outcome.FORWARD
    assert [b.name for b in half.backends] == ["gone", "ok"]


def test_a_redirect_rule_answers_the_redirect_without_backends():
    r = Route(
        key=RouteKey("HTTPRoute", "ns", "r"),
        rules=(
            Rule(
                index=0,
                matches=(prefix("/old"),),
                filters=Filters(
                    redirect=Redirect(
                        scheme="https",
                        status=301,
                        path=PathModifier(PathModifierType.PREFIX, "/new"),
                    )
                ),
            ),
        ),
    )
    decision = match(single(r), Request(port=80, host="Example.com:80", path="/old/x", query="q=1"))
    assert (decision.outcome, decision.status) == (Outcome.REDIRECT, 301)
    assert decision.location == "https://example.com/new/x?q=1"


def test_a_rewrite_gives_the_upstream_host_and_path():
    r = Route(
        key=RouteKey("HTTPRoute", "ns", "r"),
        rules=(
            Rule(
                index=0,
                matches=(prefix("/api"),),
                backends=(backend("b"),),
                filters=Filters(
                    rewrite=Rewrite(
                        hostname="internal", path=PathModifier(PathModifierType.PREFIX, "/v2")
                    )
                ),
            ),
        ),
    )
    decision = match(single(r), Request(port=80, host="h:80", path="/api/users"))
    assert (decision.upstream_host, decision.upstream_path) == ("internal", "/v2/users")
    plain = match(
        single(route("p", ((prefix("/"),), "b"))), Request(port=80, host="h:80", path="/x")
    )
    assert (plain.upstream_host, plain.upstream_path) == ("h:80", "/x")


def test_choose_backend_splits_draws_by_weight_and_skips_zero_weights():
    backends = (backend("a", weight=1), backend("zero", weight=0), backend("b", weight=3))
    picks = [choose_backend(backends, i / 8 + 1 / 16).name for i in range(8)]
    assert picks.count("a") == 2
    assert picks.count("b") == 6
    assert choose_backend(backends, 1.0).name == "b"
    with pytest.raises(ValueError, match="weight above 0"):
        choose_backend((backend("zero", weight=0),), 0.5)


def test_escaped_unreserved_characters_cannot_slip_past_a_route():
    t = single(route("r", ((prefix("/admin"),), "admin"), ((prefix("/"),), "other")))
    assert _to(t, "/%61dmin/x") == "admin"
    assert _to(t, "/public/%2E%2E/admin") == "admin"
