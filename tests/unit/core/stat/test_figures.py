"""Counter increases over a window (resets included), histogram quantiles, and which workload,
pod or node each proxy's series count for."""

from __future__ import annotations

import math

import pytest

from meshctl.core.stat import exposition as ex
from meshctl.core.stat.figures import (
    Figures,
    Proxy,
    Target,
    attribute,
    increases,
    quantile,
    summary,
)


def snap(at: float, *series: tuple[str, dict[str, str], float]) -> ex.Snapshot:
    return ex.Snapshot(
        at=at, values={(name, tuple(sorted(labels.items()))): v for name, labels, v in series}
    )


def test_increases_are_differences_and_a_fall_is_a_reset_counting_the_new_value():
    a = snap(0, ("c", {"x": "1"}, 10.0), ("c", {"x": "2"}, 50.0))
    b = snap(5, ("c", {"x": "1"}, 14.0), ("c", {"x": "2"}, 3.0), ("c", {"x": "3"}, 2.0))
    grown = increases(a, b)
    assert grown[("c", (("x", "1"),))] == 4.0
    assert grown[("c", (("x", "2"),))] == 3.0  # restarted proxy: 50 -> 3 means 3 since restart
    assert grown[("c", (("x", "3"),))] == 2.0  # series born inside the window counts whole


@pytest.mark.parametrize(
    ("q", "expected"),
    [
        (0.5, 8.0),  # rank 5 of 10: 3 of the 5 counts of the (5, 10] bucket in: 5 + 5 * 3/5
        (0.2, 5.0),  # rank 2: the top of the first bucket
        (0.1, 2.5),  # rank 1: the first bucket interpolates from 0
        (0.99, 10.0),  # rank 9.9 falls in +Inf: the highest finite bound
    ],
)
def test_quantiles_interpolate_within_the_bucket_as_prometheus_does(q, expected):
    buckets = {5.0: 2.0, 10.0: 7.0, math.inf: 10.0}
    assert quantile(q, buckets) == pytest.approx(expected)


def test_no_observations_have_no_quantile():
    assert quantile(0.5, {}) is None
    assert quantile(0.5, {5.0: 0.0, math.inf: 0.0}) is None


SIDECAR = Proxy(kind="sidecar", namespace="shop", pod="web-1", workload="web")
NODE = Proxy(kind="node", namespace="meshctl-system", pod="zt-a", node="n1")
GATEWAY = Proxy(kind="gateway", namespace="ingress", pod="gw-1", workload="gw")


def tcp(reporter: str, dest: str = "web", ns: str = "shop", mtls: bool = True) -> dict[str, str]:
    return {
        "reporter": reporter,
        "destination_workload": dest,
        "destination_workload_namespace": ns,
        "connection_security_policy": "mutual_tls" if mtls else "unknown",
    }


def test_a_sidecar_counts_its_inbound_for_its_own_pod_and_ignores_its_outbound():
    a = snap(0, (ex.TCP_OPENED, tcp("destination"), 1.0), (ex.TCP_OPENED, tcp("source"), 5.0))
    b = snap(10, (ex.TCP_OPENED, tcp("destination"), 21.0), (ex.TCP_OPENED, tcp("source"), 99.0))
    found = attribute(SIDECAR, a, b)
    assert list(found) == [Target("shop", "web", pod="web-1")]
    f = found[Target("shop", "web", pod="web-1")]
    assert f.opened == 20.0
    assert f.seconds == 10.0
    assert summary(f)["cps"] == 2.0


def test_a_node_proxy_attributes_inbound_by_destination_workload_on_its_node():
    before = snap(0)
    after = snap(
        4,
        (ex.TCP_OPENED, tcp("destination", "web"), 8.0),
        (ex.TCP_OPENED, tcp("destination", "db", "data", mtls=False), 2.0),
        (ex.TCP_FAILED, tcp("destination", "web"), 2.0),
        (ex.TCP_OPENED, tcp("source", "web"), 7.0),  # outbound of some client: not inbound
        (ex.TCP_OPENED, tcp("destination", "unknown", "unknown"), 9.0),  # nobody to credit
    )
    found = attribute(NODE, before, after)
    assert set(found) == {Target("shop", "web", node="n1"), Target("data", "db", node="n1")}
    web = summary(found[Target("shop", "web", node="n1")])
    assert web["connections"] == 8
    assert web["failedConnections"] == 2
    assert web["success"] == 0.8
    assert web["successOf"] == "connections"
    assert web["mtls"] == 1.0
    assert summary(found[Target("data", "db", node="n1")])["mtls"] == 0.0


def test_a_gateways_requests_count_for_the_backend_and_the_gateway_but_its_tcp_only_for_itself():
    labels = {**tcp("source"), "response_code": "200"}
    failed = {**tcp("source"), "response_code": "503"}
    after = snap(
        2,
        (ex.REQUESTS, labels, 8.0),
        (ex.REQUESTS, failed, 2.0),
        (ex.TCP_OPENED, tcp("source"), 3.0),
    )
    found = attribute(GATEWAY, snap(0), after)
    backend = summary(found[Target("shop", "web")])
    own = summary(found[Target("ingress", "gw", pod="gw-1")])
    assert (backend["requests"], backend["success"], backend["rps"]) == (10, 0.8, 5.0)
    assert backend["connections"] == 0
    assert (own["requests"], own["connections"]) == (10, 3)


def test_latency_quantiles_come_from_the_windows_bucket_increases_only():
    def buckets(at: float, under5: float, total: float) -> ex.Snapshot:
        return snap(
            at,
            (ex.DURATION_BUCKET, {**tcp("source"), "le": "5.0"}, under5),
            (ex.DURATION_BUCKET, {**tcp("source"), "le": "+Inf"}, total),
        )

    # Before the window: 100 fast requests; inside it: 10 slow ones only.
    found = attribute(GATEWAY, buckets(0, 100, 100), buckets(1, 100, 110))
    s = summary(found[Target("shop", "web")])
    assert s["latencyP50Ms"] == 5.0  # all in +Inf: the highest finite bound, not the old fast 2.5


def test_success_prefers_requests_and_counts_5xx_as_failures():
    f = Figures(seconds=1.0, requests=4, failed_requests=1, opened=2, failed=2)
    s = summary(f)
    assert (s["success"], s["successOf"]) == (0.75, "requests")
    assert summary(Figures(seconds=1.0))["success"] is None
