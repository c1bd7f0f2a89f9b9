"""The wire form of a gateway's config: every config survives the round trip exactly (order,
shared rules, absent vs empty filters), equal configs encode to equal bytes, bad messages are
refused with a reason."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl import gateway_wire as wire
from meshctl.core.gateway.config import BackendKey, Endpoint, GatewayConfig, KeyPair
from meshctl.core.gateway.matching import Request, match, passthrough
from meshctl.core.gateway.model import (
    AllowedRoutes,
    Backend,
    Entry,
    Filters,
    HeaderMatch,
    HeaderModifier,
    Listener,
    ListenerRoutes,
    PathMatch,
    PathModifier,
    PathModifierType,
    PathType,
    PortTable,
    Protocol,
    QueryMatch,
    Redirect,
    Rewrite,
    RouteKey,
    RouteMatch,
    RouteTable,
    RpcMatch,
    Rule,
    SecretRef,
    Timeouts,
    VirtualHost,
)
from meshctl.proto import gateway_pb2
from tests.unit.core.gateway.cluster import (
    gateway,
    gateway_class,
    https,
    listener,
    route,
    rule,
    run,
    service,
)
from tests.unit.core.gateway.tables import single
from tests.unit.core.gateway.test_properties import routes

TEXT = st.text(max_size=6)
INT = st.integers(min_value=-(2**63), max_value=2**63 - 1)
SMALL = st.integers(min_value=0, max_value=2**32 - 1)
PAIRS = st.lists(st.tuples(TEXT, TEXT), max_size=2).map(tuple)
MODIFIERS = st.builds(
    HeaderModifier, set=PAIRS, add=PAIRS, remove=st.lists(TEXT, max_size=2).map(tuple)
)
PATH_MODIFIERS = st.none() | st.builds(PathModifier, st.sampled_from(list(PathModifierType)), TEXT)
FILTERS = st.builds(
    Filters,
    request_headers=st.none() | MODIFIERS,
    response_headers=st.none() | MODIFIERS,
    redirect=st.none()
    | st.builds(Redirect, scheme=TEXT, hostname=TEXT, path=PATH_MODIFIERS, port=INT, status=INT),
    rewrite=st.none() | st.builds(Rewrite, hostname=TEXT, path=PATH_MODIFIERS),
)
MATCHES = st.builds(
    RouteMatch,
    path=st.builds(PathMatch, st.sampled_from(list(PathType)), TEXT),
    method=TEXT,
    headers=st.lists(st.builds(HeaderMatch, TEXT, TEXT), max_size=2).map(tuple),
    query=st.lists(st.builds(QueryMatch, TEXT, TEXT), max_size=2).map(tuple),
    rpc=st.none() | st.builds(RpcMatch, service=TEXT, method=TEXT),
)
BACKENDS = st.builds(
    Backend, namespace=TEXT, name=TEXT, port=INT, weight=INT, problem=TEXT, detail=TEXT
)
RULES = st.builds(
    Rule,
    index=SMALL,
    name=TEXT,
    matches=st.lists(MATCHES, max_size=2).map(tuple),
    filters=FILTERS,
    backends=st.lists(BACKENDS, max_size=2).map(tuple),
    timeouts=st.builds(Timeouts, request_ms=st.none() | INT, backend_request_ms=st.none() | INT),
)
SECRETS = st.builds(SecretRef, TEXT, TEXT)
LISTENERS = st.builds(
    Listener,
    owner=TEXT,
    name=TEXT,
    port=INT,
    protocol=st.sampled_from(list(Protocol)),
    hostname=TEXT,
    certificates=st.lists(SECRETS, max_size=2).map(tuple),
    allowed=st.builds(
        AllowedRoutes,
        namespaces=TEXT,
        selector=st.lists(
            st.tuples(TEXT, TEXT, st.lists(TEXT, max_size=2).map(tuple)), max_size=2
        ).map(tuple),
        kinds=st.lists(st.tuples(TEXT, TEXT), max_size=2).map(tuple),
    ),
)


@st.composite
def tables(draw: st.DrawFn) -> RouteTable:
    # A few rules reused by several entries, as translate's tables share them.
    pool = draw(st.lists(RULES, min_size=1, max_size=3))

    def entry() -> Entry:
        return Entry(
            route=draw(st.builds(RouteKey, TEXT, TEXT, TEXT)),
            created=draw(TEXT),
            rule=draw(st.sampled_from(pool)),
            match_index=draw(SMALL),
            match=draw(MATCHES),
        )

    ports = []
    for _ in range(draw(st.integers(0, 2))):
        listeners = tuple(
            ListenerRoutes(
                listener=draw(LISTENERS),
                hosts=tuple(
                    VirtualHost(
                        hostname=draw(TEXT),
                        entries=tuple(entry() for _ in range(draw(st.integers(0, 3)))),
                    )
                    for _ in range(draw(st.integers(0, 2)))
                ),
            )
            for _ in range(draw(st.integers(0, 2)))
        )
        default = entry() if draw(st.booleans()) else None
        protocol = draw(st.sampled_from(list(Protocol)))
        ports.append(
            PortTable(port=draw(INT), protocol=protocol, listeners=listeners, default=default)
        )
    return RouteTable(
        ports=tuple(ports),
        one_label_wildcards=draw(st.booleans()),
        misdirected_by_listener=draw(st.booleans()),
    )


ENDPOINTS = st.builds(
    Endpoint, address=TEXT, port=INT, hbone=st.booleans(), identity=TEXT, workload=TEXT
)
CONFIGS = st.builds(
    GatewayConfig,
    name=TEXT,
    version=TEXT,
    table=tables(),
    certificates=st.dictionaries(
        SECRETS, st.builds(KeyPair, chain_pem=st.binary(max_size=8), key_pem=st.binary(max_size=8))
    ),
    endpoints=st.dictionaries(
        st.builds(BackendKey, TEXT, TEXT, INT), st.lists(ENDPOINTS, max_size=2).map(tuple)
    ),
)


@given(CONFIGS)
def test_every_config_survives_the_round_trip_exactly(config: GatewayConfig) -> None:
    assert wire.decode(wire.encode(config)) == config


@given(CONFIGS)
def test_equal_configs_encode_to_equal_bytes_whatever_the_order_of_their_maps(
    config: GatewayConfig,
) -> None:
    shuffled = GatewayConfig(
        name=config.name,
        version=config.version,
        table=config.table,
        certificates=dict(reversed(list(config.certificates.items()))),
        endpoints=dict(reversed(list(config.endpoints.items()))),
    )
    assert wire.encode(shuffled) == wire.encode(config)
    assert wire.digest(shuffled) == wire.digest(config)


@given(routes())
def test_every_table_the_core_sorts_comes_back_in_the_same_precedence_order(found) -> None:
    table = single(*found)
    back = wire.decode(wire.encode(GatewayConfig(name="ns/gw", table=table))).table
    assert back == table
    rows = [e.label for p in back.ports for lr in p.listeners for h in lr.hosts for e in h.entries]
    assert rows == [
        e.label for p in table.ports for lr in p.listeners for h in lr.hosts for e in h.entries
    ]


def test_a_translated_table_comes_back_in_its_precedence_order_and_routes_the_same():
    result = run(
        gateway_class(),
        gateway(listener(), https(hostname="*.example.com")),
        route(
            "web",
            rule("svc", path="/a"),
            rule("svc", path="/a/b", filters=[_header_filter()]),
            rule("other:8080", path="/", timeouts={"request": "5s"}),
        ),
        route("exact", rule("svc", matches=[{"path": {"type": "Exact", "value": "/a"}}])),
        service(),
        service("other", "infra", 8080),
    )
    table = result.gateways["infra", "gw"]
    assert [p.port for p in table.ports] == [80, 443]
    assert len(table.ports[0].listeners[0].hosts[0].entries) == 4
    config = GatewayConfig(name="infra/gw", table=table)
    back = wire.decode(wire.encode(config))
    assert back.table == table
    for path in ("/a", "/a/b/c", "/x", "/a/bc"):
        request = Request(port=80, host="h.example.com", path=path, method="GET", headers=())
        assert match(back.table, request) == match(table, request)


def _header_filter() -> dict[str, object]:
    return {
        "type": "RequestHeaderModifier",
        "requestHeaderModifier": {"set": [{"name": "x-a", "value": "1"}]},
    }


def test_a_rule_shared_by_many_entries_is_sent_once():
    shared = Rule(index=0, matches=(RouteMatch(), RouteMatch(method="GET")))
    entries = tuple(
        Entry(
            route=RouteKey("HTTPRoute", "ns", "r"), created="", rule=shared, match_index=i, match=m
        )
        for i, m in enumerate(shared.matches)
    )
    lr = ListenerRoutes(
        listener=Listener(owner="ns/gw", name="http", port=80, protocol=Protocol.HTTP),
        hosts=(VirtualHost(hostname="*", entries=entries),),
    )
    table = RouteTable(ports=(PortTable(port=80, protocol=Protocol.HTTP, listeners=(lr, lr)),))
    message = wire.to_proto(GatewayConfig(name="ns/gw", table=table))
    assert len(message.table.rules) == 1
    assert [
        e.rule
        for p in message.table.ports
        for lr in p.listeners
        for h in lr.hosts
        for e in h.entries
    ] == [0, 0, 0, 0]


def test_no_filter_and_an_empty_filter_stay_apart():
    empty = Filters(request_headers=HeaderModifier(), redirect=Redirect(), rewrite=Rewrite())
    for filters in (Filters(), empty):
        rule = Rule(index=0, filters=filters)
        entry = Entry(
            route=RouteKey("HTTPRoute", "n", "r"),
            created="",
            rule=rule,
            match_index=0,
            match=RouteMatch(),
        )
        table = RouteTable(
            ports=(PortTable(port=80, protocol=Protocol.HTTP, listeners=(), default=entry),)
        )
        back = wire.decode(wire.encode(GatewayConfig(name="g", table=table)))
        assert back.table.ports[0].default is not None
        assert back.table.ports[0].default.rule.filters == filters


def test_an_entry_naming_a_missing_rule_is_refused():
    message = gateway_pb2.GatewayConfig(name="ns/gw")
    port = message.table.ports.add(port=80, protocol=gateway_pb2.PROTOCOL_HTTP)
    port.default.rule = 3
    with pytest.raises(wire.GatewayWireError, match="names rule 3 of 0"):
        wire.from_proto(message)


def test_an_unknown_protocol_is_refused():
    message = gateway_pb2.GatewayConfig(name="ns/gw")
    message.table.ports.add(port=80, protocol=gateway_pb2.PROTOCOL_UNSPECIFIED)
    with pytest.raises(wire.GatewayWireError, match="unknown protocol 0"):
        wire.from_proto(message)


def test_bytes_that_are_no_config_are_refused():
    with pytest.raises(wire.GatewayWireError, match="not a GatewayConfig"):
        wire.decode(b"\xff\xff\xff")


def test_a_number_beyond_int64_is_refused_when_encoding():
    backend = Backend(namespace="n", name="s", port=80, weight=2**64)
    rule = Rule(index=0, backends=(backend,))
    entry = Entry(
        route=RouteKey("HTTPRoute", "n", "r"),
        created="",
        rule=rule,
        match_index=0,
        match=RouteMatch(),
    )
    table = RouteTable(
        ports=(PortTable(port=80, protocol=Protocol.HTTP, listeners=(), default=entry),)
    )
    with pytest.raises(wire.GatewayWireError, match="gateway ns/gw: cannot encode"):
        wire.encode(GatewayConfig(name="ns/gw", table=table))


def test_the_digest_ignores_the_version_field_and_follows_the_content():
    base = GatewayConfig(name="ns/gw")
    assert wire.digest(base) == wire.digest(GatewayConfig(name="ns/gw", version="7"))
    assert wire.digest(base) != wire.digest(GatewayConfig(name="ns/gw2"))


def test_a_tls_passthrough_table_comes_back_and_routes_the_same_sni():
    tls_route = route("pass", rule("svc:443"), hostnames=["a.example.com"])
    tls_route["kind"] = "TLSRoute"
    result = run(
        gateway_class(),
        gateway(listener("tls", 443, "TLS", tls={"mode": "Passthrough"})),
        tls_route,
        service("svc", "infra", 443),
    )
    table = result.gateways["infra", "gw"]
    assert table.ports[0].protocol is Protocol.TLS
    back = wire.decode(wire.encode(GatewayConfig(name="infra/gw", table=table)))
    assert back.table == table
    for sni in ("a.example.com", "b.example.com", ""):
        assert passthrough(back.table, 443, sni) == passthrough(table, 443, sni)
    assert passthrough(back.table, 443, "a.example.com").reason == "TLSRoute infra/pass rules[0]"
