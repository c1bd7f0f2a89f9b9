"""``meshctl stat``'s figures from a real proxy: a ``meshctl gateway run`` on loopback serves N
requests (some answered 503: their backend refuses), and two scrapes of its own
``/stats/prometheus`` around them give exactly those counts, that success rate and a rate over
the measured window. The scrapes here are plain GETs on loopback; through the API server they are
the same text (tests/node/test_stat_on_node.py)."""

from __future__ import annotations

import http.client
import socket
import time

from meshctl_plugins.stat import table

from meshctl.core.stat.exposition import Snapshot, parse
from meshctl.core.stat.figures import Proxy, Target, attribute, summary
from tests.harness import gateway as gw

OK, FAILING = 12, 4


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _get(port: int, path: str) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
    conn.request("GET", path, headers={"Host": "example.com"})
    response = conn.getresponse()
    response.read()
    conn.close()
    return response.status


def _scrape(offset: int) -> Snapshot:
    conn = http.client.HTTPConnection("127.0.0.1", 15020 + offset, timeout=5)
    conn.request("GET", "/stats/prometheus")
    text = conn.getresponse().read().decode()
    return parse(text, at=time.monotonic())


def test_counts_success_and_rate_of_a_window_are_exactly_the_requests_sent(tmp_path):
    with gw.backend() as web:
        objects = [
            gw.gateway_class(),
            gw.gateway(gw.http_listener()),
            gw.route(
                "web",
                [gw.rule("/api", "web:80"), gw.rule("/down", "gone:80")],
                hostnames=["example.com"],
            ),
            gw.service("web"),
            gw.endpoint_slice("web", [("127.0.0.1", True)], web.port),
            gw.service("gone"),
            gw.endpoint_slice("gone", [("127.0.0.1", True)], _closed_port()),
        ]
        with gw.run_gateway(tmp_path, objects, listener_ports=(80,)) as proc:
            assert _get(proc.port(80), "/api/warm") == 200  # before the window: not counted
            before = _scrape(proc.offset)
            statuses = [_get(proc.port(80), f"/api/{i}") for i in range(OK)]
            statuses += [_get(proc.port(80), f"/down/{i}") for i in range(FAILING)]
            time.sleep(0.5)
            after = _scrape(proc.offset)
    assert statuses.count(200) == OK
    assert all(s >= 500 for s in statuses[OK:]), statuses
    me = Proxy(kind="gateway", namespace="infra", pod="gw-1", workload="gw")
    found = attribute(me, before, after)
    row = summary(found[Target("infra", "gw", pod="gw-1")])
    assert row["requests"] == OK + FAILING
    assert row["failedRequests"] == FAILING
    assert row["success"] == round(OK / (OK + FAILING), 4)
    assert row["successOf"] == "requests"
    window = after.at - before.at
    assert row["rps"] == round((OK + FAILING) / window, 3)
    # Loopback answers take well under Istio's 250 ms bucket bound: the quantiles say so.
    assert 0 < row["latencyP50Ms"] <= row["latencyP99Ms"] <= 250
    text = table.text([{"namespace": "infra", "name": "gw-1", "meshed": "1/1", **row}],
                      namespaces=False)  # fmt: skip
    assert text.splitlines()[0].split()[:4] == ["NAME", "MESHED", "SUCCESS", "RPS"]
    assert "75.00%" in text.splitlines()[1]
