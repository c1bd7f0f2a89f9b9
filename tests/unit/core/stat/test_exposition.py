"""The proxies' Prometheus text read into snapshots: the wanted series only, refusals as
``MetricsError``."""

from __future__ import annotations

import contextlib

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.stat import exposition as ex

TEXT = """\
# HELP istio_requests_total Requests
# TYPE istio_requests_total counter
istio_requests_total{reporter="source",response_code="200",destination_workload="web"} 3.0
istio_requests_total{reporter="source",response_code="503",destination_workload="web"} 1.0
# TYPE istio_request_duration_milliseconds histogram
istio_request_duration_milliseconds_bucket{le="5.0",reporter="source"} 2.0
istio_request_duration_milliseconds_bucket{le="+Inf",reporter="source"} 4.0
istio_request_duration_milliseconds_count{reporter="source"} 4.0
istio_request_duration_milliseconds_sum{reporter="source"} 30.0
# TYPE istio_build gauge
istio_build{component="gateway",tag="1"} 1.0
# TYPE process_cpu_seconds_total counter
process_cpu_seconds_total 12.5
"""


def test_the_wanted_series_are_kept_by_name_and_sorted_labels():
    snap = ex.parse(TEXT, at=7.0)
    assert snap.at == 7.0
    key = (
        ex.REQUESTS,
        (("destination_workload", "web"), ("reporter", "source"), ("response_code", "200")),
    )
    assert snap.values[key] == 3.0
    names = {name for name, _ in snap.values}
    assert names == {ex.REQUESTS, ex.DURATION_BUCKET}  # no _count, _sum, gauges, process_*


def test_an_empty_body_is_an_empty_snapshot():
    assert ex.parse("", at=0.0).values == {}


@pytest.mark.parametrize(
    "body",
    [
        "garbage {{{",
        'istio_requests_total{reporter="source} 1',
        "<html><body>502 Bad Gateway</body></html>",
        "\x00\xff\xfe",
        "istio_requests_total NaN",
        "istio_requests_total -3",
    ],
)
def test_what_is_not_prometheus_text_is_a_metrics_error(body):
    with pytest.raises(ex.MetricsError):
        ex.parse(body, at=0.0)


# Near-misses of the format: its own characters in any order, besides any text at all.
NEAR = st.text(
    alphabet=st.sampled_from(list('istio_requests_total{}="\\, \n#TYPE0123456789.+-eInfNale'))
)


@given(st.one_of(st.text(max_size=200), NEAR))
def test_any_text_parses_or_is_a_metrics_error(body):
    with contextlib.suppress(ex.MetricsError):
        ex.parse(body, at=0.0)
