"""Hypothesis properties of matching: what a prefix may match, Exact over prefixes, the
precedence order as an oracle, independence from the routes' order, weights, hostnames."""

from __future__ import annotations

from hypothesis import example, given
from hypothesis import strategies as st

from meshctl.core.gateway import hostnames, render, table
from meshctl.core.gateway.local import CLUSTER_FIELDS as KIND_FIELDS
from meshctl.core.gateway.matching import Outcome, Request, choose_backend, holds, match
from meshctl.core.gateway.model import (
    Backend,
    HeaderMatch,
    PathMatch,
    PathType,
    Route,
    RouteKey,
    RouteMatch,
    Rule,
)
from meshctl.core.gateway.translate import Cluster, translate

from .tables import backend, listener

SEGMENTS = st.sampled_from(["a", "b", "ab", "ba", "aa", "a.b"])
PATHS = st.builds(
    lambda segs, slash: "/" + "/".join(segs) + ("/" if slash and segs else ""),
    st.lists(SEGMENTS, max_size=4),
    st.booleans(),
)
MATCHES = st.builds(
    RouteMatch,
    path=st.builds(PathMatch, st.sampled_from(list(PathType)), PATHS),
    method=st.sampled_from(["", "GET", "POST"]),
    headers=st.lists(
        st.builds(HeaderMatch, st.sampled_from(["x", "y"]), st.sampled_from(["1", "2"])),
        max_size=2,
        unique_by=lambda h: h.name,
    ).map(tuple),
)
TIMESTAMPS = st.sampled_from(["2025-01-01T00:00:00Z", "2026-01-01T00:00:00Z"])


@st.composite
def routes(draw: st.DrawFn) -> list[Route]:
    names = draw(st.lists(st.sampled_from(["r1", "r2", "r3"]), min_size=1, max_size=3, unique=True))
    out = []
    for name in names:
        rules = draw(st.lists(st.lists(MATCHES, min_size=1, max_size=3), min_size=1, max_size=3))
        out.append(
            Route(
                key=RouteKey("HTTPRoute", draw(st.sampled_from(["a", "a-b"])), name),
                created=draw(TIMESTAMPS),
                rules=tuple(
                    Rule(index=i, matches=tuple(ms), backends=(backend(f"{name}-{i}"),))
                    for i, ms in enumerate(rules)
                ),
            )
        )
    return out


REQUESTS = st.builds(
    lambda path, method, headers: Request(
        port=80, host="example.com", path=path, method=method, headers=headers
    ),
    PATHS,
    st.sampled_from(["GET", "POST"]),
    st.lists(st.tuples(st.sampled_from(["x", "y"]), st.sampled_from(["1", "2"])), max_size=2).map(
        tuple
    ),
)


def _elementwise_prefix(prefix: str, path: str) -> bool:
    """Independent of paths.py: the prefix's /-elements (one trailing / dropped) lead the path's."""
    want = prefix[:-1].split("/") if prefix.endswith("/") else prefix.split("/")
    if want == [""]:  # the prefix "/"
        return True
    return path.split("/")[: len(want)] == want


def _table(rs: list[Route]) -> table.RouteTable:
    return table.build([(listener(), rs)])


SHORT_PATHS = st.builds(
    lambda segs, slash: "/" + "/".join(segs) + ("/" if slash and segs else ""),
    st.lists(st.sampled_from(["a", "ab", "b"]), max_size=3),
    st.booleans(),
)


@given(st.lists(SHORT_PATHS, min_size=1, max_size=4), SHORT_PATHS)
@example(["/a"], "/ab")
@example(["/a/"], "/a")
def test_a_request_never_matches_a_prefix_that_is_not_an_element_wise_prefix(prefixes, path):
    rule = Rule(
        index=0,
        matches=tuple(RouteMatch(path=PathMatch(PathType.PREFIX, p)) for p in prefixes),
        backends=(backend("b"),),
    )
    decision = match(
        _table([Route(key=RouteKey("HTTPRoute", "ns", "r"), rules=(rule,))]), _get(path)
    )
    expected = [p for p in prefixes if _elementwise_prefix(p, path)]
    if decision.entry is None:
        assert not expected
    else:
        assert decision.entry.match.path.value in expected
        assert len(decision.entry.match.path.value) == max(len(p) for p in expected)


def _get(path: str) -> Request:
    return Request(port=80, host="example.com", path=path)


@given(routes(), REQUESTS)
def test_whatever_the_routes_a_matched_path_is_an_element_wise_prefix_or_exact(rs, request):
    decision = match(_table(rs), request)
    if decision.entry is not None:
        path = decision.entry.match.path
        if path.type is PathType.PREFIX:
            assert _elementwise_prefix(path.value, request.path)
        else:
            assert path.value == request.path


@given(routes(), REQUESTS)
def test_an_exact_match_of_the_path_always_beats_every_prefix(rs, request):
    exact_route = Route(
        key=RouteKey("HTTPRoute", "zzz", "newest"),
        created="2027-01-01T00:00:00Z",  # the newest, last by name: only Exact can win it
        rules=(
            Rule(
                index=0,
                matches=(RouteMatch(path=PathMatch(PathType.EXACT, request.path)),),
                backends=(backend("exact"),),
            ),
        ),
    )
    decision = match(_table([*rs, exact_route]), request)
    assert decision.entry is not None
    assert decision.entry.match.path.type is PathType.EXACT


@given(routes(), REQUESTS)
def test_the_decision_is_the_matching_row_of_highest_precedence(rs, request):
    t = _table(rs)
    decision = match(t, request)
    rows = [e for vh in t.ports[0].listeners[0].hosts for e in vh.entries]
    matching = [e for e in rows if holds(e.match, request, request.path, None)]
    if not matching:
        assert decision.outcome is Outcome.NO_ROUTE
    else:
        assert decision.entry == min(matching, key=table.precedence)


@given(routes(), REQUESTS, st.randoms(use_true_random=False))
def test_the_result_does_not_depend_on_the_order_of_routes(rs, request, rnd):
    shuffled = list(rs)
    rnd.shuffle(shuffled)
    first, second = _table(rs), _table(shuffled)
    assert render.table_data(first) == render.table_data(second)
    assert render.decision_data(match(first, request)) == render.decision_data(
        match(second, request)
    )


@given(st.lists(st.integers(min_value=0, max_value=6), min_size=1, max_size=6))
def test_over_draws_every_weighted_backend_is_chosen_in_proportion_and_none_of_weight_zero(
    weights,
):
    backends = [
        Backend(namespace="ns", name=f"b{i}", port=80, weight=w) for i, w in enumerate(weights)
    ]
    total = sum(weights)
    if total == 0:
        return
    picks = [choose_backend(backends, (k + 0.5) / total).name for k in range(total)]
    for b in backends:
        assert picks.count(b.name) == b.weight


LABELS = st.lists(st.sampled_from(["a", "b", "example", "com"]), min_size=1, max_size=4)
PATTERNS = st.one_of(
    st.just(hostnames.ANY),
    LABELS.map(".".join),
    LABELS.map(lambda ls: "*." + ".".join(ls)),
)


@given(PATTERNS, PATTERNS, LABELS.map(".".join), st.booleans())
def test_a_host_is_in_the_intersection_exactly_when_both_patterns_name_it(a, b, host, one_label):
    common = hostnames.intersection(a, b, one_label=one_label)
    both = hostnames.matches(a, host, one_label=one_label) and hostnames.matches(
        b, host, one_label=one_label
    )
    if common is None:
        assert not both
    else:
        assert hostnames.matches(common, host, one_label=one_label) == both


@given(LABELS.map(".".join), LABELS.map(".".join))
def test_a_wildcard_names_hosts_ending_in_its_suffix_with_more_labels(suffix, host):
    pattern = "*." + suffix
    ends = host.endswith("." + suffix)
    assert hostnames.matches(pattern, host) == ends
    one = ends and host.count(".") == suffix.count(".") + 1
    assert hostnames.matches(pattern, host, one_label=True) == one


KEYS = st.sampled_from(
    [
        "metadata", "name", "namespace", "generation", "creationTimestamp", "labels", "spec",
        "status", "gatewayClassName", "controllerName", "listeners", "port", "protocol",
        "hostname", "hostnames", "tls", "mode", "certificateRefs", "allowedRoutes", "namespaces",
        "from", "selector", "matchLabels", "matchExpressions", "kinds", "kind", "group",
        "parentRefs", "sectionName", "rules", "matches", "path", "type", "value", "headers",
        "queryParams", "method", "filters", "requestRedirect", "urlRewrite", "statusCode",
        "requestHeaderModifier", "set", "add", "remove", "backendRefs", "weight", "timeouts",
        "request", "parents", "conditions", "controllerName", "to", "ingressClassName", "http",
        "paths", "pathType", "backend", "service", "number", "defaultBackend", "secretName",
        "hosts", "ports", "annotations",
    ]
)  # fmt: skip
JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-2, 70000)
    | st.sampled_from(["", "a", "/", "*.x.io", "HTTP", "meshctl", "Exact"]),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(KEYS, inner, max_size=5),
    max_leaves=30,
)


@given(st.lists(st.tuples(st.sampled_from(sorted(KIND_FIELDS)), JSON), max_size=8))
def test_translate_never_raises_on_any_shape_of_object(objects):
    lists: dict[str, list[object]] = {field: [] for field in KIND_FIELDS.values()}
    for kind, body in objects:
        lists[KIND_FIELDS[kind]].append(body)
    result = translate(Cluster(**lists), now="2026-12-02T10:00:00Z")  # type: ignore[arg-type]
    for t in [*result.gateways.values(), result.ingress]:
        match(t, Request(port=80, host="a.x.io", path="/a"))


def _realistic() -> list[dict[str, object]]:
    from . import cluster as c

    ingress = {
        "kind": "Ingress",
        "metadata": {"name": "i", "namespace": "infra"},
        "spec": {
            "ingressClassName": "meshctl",
            "tls": [{"hosts": ["a.x.io"], "secretName": "cert"}],
            "defaultBackend": {"service": {"name": "svc", "port": {"number": 80}}},
            "rules": [
                {
                    "host": "a.x.io",
                    "http": {
                        "paths": [
                            {
                                "pathType": "Prefix",
                                "path": "/a",
                                "backend": {"service": {"name": "svc", "port": {"name": "http"}}},
                            }
                        ]
                    },
                }
            ],
        },
    }
    redirect = {
        "type": "RequestRedirect",
        "requestRedirect": {"path": {"type": "ReplacePrefixMatch"}},
    }
    return [
        c.gateway_class(),
        c.gateway(
            c.listener(),
            c.https(
                hostname="*.x.io",
                allowedRoutes={
                    "namespaces": {"from": "Selector", "selector": {"matchLabels": {"a": "b"}}}
                },
            ),
        ),
        c.route("r", c.rule("svc", path="/a", filters=[redirect]), hostnames=["a.x.io"]),
        c.grant("infra", [(c.GROUP, "HTTPRoute", "app")], [("", "Service", "svc")]),
        c.service(),
        c.namespace("infra", a="b"),
        ingress,
    ]


def _paths(value: object, at: tuple[object, ...] = ()) -> list[tuple[object, ...]]:
    out = [at]
    if isinstance(value, dict):
        for k, v in value.items():
            out += _paths(v, (*at, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            out += _paths(v, (*at, i))
    return out


@given(st.data())
def test_translate_never_raises_when_any_field_of_real_objects_is_garbage(data):
    objects = _realistic()
    fields = [KIND_FIELDS[str(obj["kind"])] for obj in objects]  # the list each one goes to
    for _ in range(data.draw(st.integers(1, 3))):
        index = data.draw(st.integers(0, len(objects) - 1))
        at = data.draw(st.sampled_from(_paths(objects[index])[1:]))
        parent = objects[index]
        for step in at[:-1]:
            parent = parent[step]  # type: ignore[index]
        parent[at[-1]] = data.draw(JSON)  # type: ignore[index]
    lists: dict[str, list[object]] = {field: [] for field in KIND_FIELDS.values()}
    for field, obj in zip(fields, objects, strict=True):
        lists[field].append(obj)
    result = translate(Cluster(**lists), now="2026-12-02T10:00:00Z")  # type: ignore[arg-type]
    for t in [*result.gateways.values(), result.ingress]:
        for port in (80, 443):
            match(t, Request(port=port, host="a.x.io", path="/a/b", sni="a.x.io"))
