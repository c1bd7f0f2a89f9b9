from __future__ import annotations

from meshctl.core.gateway import render
from meshctl.core.gateway.matching import Request, match

from .tables import backend, headers, prefix, query, route, single


def test_a_table_prints_one_line_per_concern_in_precedence_order():
    t = single(
        route("r", ((prefix("/a", method="GET", headers=headers(x="1"), query=query(q="v")),), "b"))
    )
    data = render.table_data(t)
    [port] = data["ports"]
    [row] = port["listeners"][0]["hosts"][0]["routes"]
    assert row == {
        "match": "PathPrefix /a GET header[x]=1 query[q]=v",
        "route": "HTTPRoute ns/r rules[0]",
        "backends": ["ns/b:80 weight 1"],
    }


def test_a_decision_prints_its_outcome_reason_and_backends():
    t = single(route("r", ((prefix("/"),), "b")))
    assert render.decision_data(match(t, Request(port=80, host="h"))) == {
        "outcome": "forward",
        "reason": "HTTPRoute ns/r rules[0]",
        "listener": "ns/gw/http",
        "hostname": "*",
        "backends": ["ns/b:80 weight 1"],
    }
    assert render.backend_text(backend("x", problem="BackendNotFound")) == (
        "ns/x:80 weight 1 (BackendNotFound)"
    )
