"""The Prometheus text a proxy serves on ``/stats/prometheus``, read into one snapshot.

Owns the parse (prometheus-client's parser of the text exposition format, version 0.0.4) and its
bounds: a body that is not that format is a ``MetricsError`` naming the fault, never a traceback;
only the families ``meshctl stat`` reads are kept, so a proxy with many other series costs
nothing beyond the parse. A snapshot maps each series (sample name + sorted label pairs) to its
value; a series listed twice keeps the last value.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from meshctl.errors import MeshctlError

Labels = tuple[tuple[str, str], ...]
Series = tuple[str, Labels]

REQUESTS = "istio_requests_total"
DURATION_BUCKET = "istio_request_duration_milliseconds_bucket"
TCP_OPENED = "istio_tcp_connections_opened_total"
TCP_CLOSED = "istio_tcp_connections_closed_total"
TCP_FAILED = "istio_tcp_connections_failed_total"  # meshctl's proxies: refused or never set up
TCP_RECEIVED = "istio_tcp_received_bytes_total"  # client -> server
TCP_SENT = "istio_tcp_sent_bytes_total"  # server -> client
REQUEST_BYTES = "istio_request_bytes_total"
RESPONSE_BYTES = "istio_response_bytes_total"
WANTED = frozenset(
    {
        REQUESTS,
        DURATION_BUCKET,
        TCP_OPENED,
        TCP_CLOSED,
        TCP_FAILED,
        TCP_RECEIVED,
        TCP_SENT,
        REQUEST_BYTES,
        RESPONSE_BYTES,
    }
)


class MetricsError(MeshctlError):
    """A body that is not Prometheus text (or holds a value that is no counter)."""


@dataclass(frozen=True, slots=True)
class Snapshot:
    """One proxy's counters at one moment (``at``: seconds on the caller's monotonic clock)."""

    at: float
    values: Mapping[Series, float]


def parse(text: str, *, at: float) -> Snapshot:
    """The wanted series of ``text``; ``MetricsError`` when it is not Prometheus text."""
    values: dict[Series, float] = {}
    try:
        samples = [s for f in text_string_to_metric_families(text) for s in f.samples]
    except (ValueError, TypeError, IndexError, KeyError) as exc:
        raise MetricsError(f"not Prometheus text: {str(exc)[:120]}") from exc
    for sample in samples:
        if sample.name not in WANTED:
            continue
        value = float(sample.value)
        if math.isnan(value) or value < 0:
            raise MetricsError(f"{sample.name} is {value}: not a counter's value")
        values[(sample.name, tuple(sorted(sample.labels.items())))] = value
    return Snapshot(at=at, values=values)
