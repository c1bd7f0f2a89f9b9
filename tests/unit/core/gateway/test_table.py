from __future__ import annotations

from meshctl.core.gateway import table
from meshctl.core.gateway.hostnames import ANY

from .tables import exact, listener, prefix, route


def test_effective_hostnames_are_each_routes_name_narrowed_to_the_listeners():
    assert table.effective_hostnames(ANY, []) == (ANY,)
    assert table.effective_hostnames("*.example.com", []) == ("*.example.com",)
    assert table.effective_hostnames("*.example.com", ["a.example.com", "b.example.net"]) == (
        "a.example.com",
    )
    assert table.effective_hostnames("a.example.com", ["*.example.com"]) == ("a.example.com",)
    assert table.effective_hostnames("a.example.com", ["*.example.com", "a.example.com"]) == (
        "a.example.com",
    )
    assert table.effective_hostnames("*.a.example.com", ["b.example.com"]) == ()
    assert table.effective_hostnames("*.example.com", ["a.b.example.com"], one_label=True) == ()


def test_a_listener_s_hosts_are_most_specific_first_and_rows_in_precedence_order():
    routes = [
        route("wide", ((prefix("/"),), "w"), hostnames=("*.example.com",)),
        route("any", ((prefix("/a"),), "a"), ((exact("/a"),), "e")),
        route("deep", ((prefix("/"),), "d"), hostnames=("*.a.example.com", "x.example.com")),
    ]
    lr = table.listener_routes(listener(), routes)
    assert [vh.hostname for vh in lr.hosts] == [
        "x.example.com",
        "*.a.example.com",
        "*.example.com",
        ANY,
    ]
    rows = lr.hosts[-1].entries
    assert [(r.match.path.type.value, r.match.path.value) for r in rows] == [
        ("Exact", "/a"),
        ("PathPrefix", "/a"),
    ]


def test_ports_group_their_listeners_most_specific_first():
    t = table.build(
        [
            (listener("any", port=80), []),
            (listener("b", port=8080), []),
            (listener("wild", port=80, hostname="*.example.com"), []),
            (listener("exact", port=80, hostname="a.example.com"), []),
        ]
    )
    assert [p.port for p in t.ports] == [80, 8080]
    assert [lr.listener.name for lr in t.ports[0].listeners] == ["exact", "wild", "any"]
    assert t.port(8080) is t.ports[1]
    assert t.port(9) is None
