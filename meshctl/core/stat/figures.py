"""What a window of traffic adds up to: counter increases, their attribution to workloads and
pods, and the figures ``meshctl stat`` prints (success, rates, latency quantiles, mTLS share).

Counters only grow, so a series whose value fell restarted (its proxy did): its increase is its
whole new value, as Prometheus' ``increase()`` reads a reset; a series absent from the first
snapshot was created inside the window (series appear on their first event) and counts whole.
Which proxy reports what (Istio's ``reporter`` label): a sidecar's ``destination`` series are its
own pod's inbound traffic; a node proxy's ``destination`` series belong to the workload its
``destination_workload*`` labels name (several pods of one workload on a node share them); a
gateway reports as ``source``: its requests count for the backend workload it names and, with
its connections, for the gateway's own row. TCP figures come from ``destination`` reports only,
so a meshed backend behind a gateway is not counted twice.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Literal

from meshctl.core.stat import exposition as ex

ProxyKind = Literal["sidecar", "node", "gateway"]
UNKNOWN = "unknown"
MTLS = "mutual_tls"


@dataclass(frozen=True, slots=True, kw_only=True)
class Proxy:
    """A proxy scraped: its kind and the pod it runs in (for a node proxy: its node)."""

    kind: ProxyKind
    namespace: str
    pod: str
    workload: str = ""  # the pod's workload name (Istio's, e.g. the Deployment's name)
    node: str = ""


@dataclass(frozen=True, slots=True)
class Target:
    """What figures belong to: a workload, one pod of it (sidecar, gateway), or its pods on one
    node (a node proxy cannot tell them apart)."""

    namespace: str
    workload: str
    pod: str = ""
    node: str = ""


@dataclass(slots=True)
class Figures:
    """Increases over a window (or, for ``open``, connections open at its end)."""

    seconds: float = 0.0  # the window's length (the longest of the proxies added)
    requests: float = 0.0
    failed_requests: float = 0.0  # 5xx answers, as linkerd counts failures
    mtls_requests: float = 0.0
    buckets: dict[float, float] = field(default_factory=dict)  # le -> cumulative count
    opened: float = 0.0
    failed: float = 0.0  # connections refused or never set up
    mtls_opened: float = 0.0
    closed: float = 0.0
    open: float = 0.0
    bytes_in: float = 0.0  # client -> server
    bytes_out: float = 0.0  # server -> client

    def add(self, other: Figures) -> None:
        self.seconds = max(self.seconds, other.seconds)
        self.requests += other.requests
        self.failed_requests += other.failed_requests
        self.mtls_requests += other.mtls_requests
        for le, n in other.buckets.items():
            self.buckets[le] = self.buckets.get(le, 0.0) + n
        self.opened += other.opened
        self.failed += other.failed
        self.mtls_opened += other.mtls_opened
        self.closed += other.closed
        self.open += other.open
        self.bytes_in += other.bytes_in
        self.bytes_out += other.bytes_out


def increases(before: ex.Snapshot, after: ex.Snapshot) -> dict[ex.Series, float]:
    """Each series' increase from ``before`` to ``after`` (a fall is a reset: the new value)."""
    out: dict[ex.Series, float] = {}
    for series, value in after.values.items():
        old = before.values.get(series, 0.0)
        out[series] = value if value < old else value - old
    return out


def quantile(q: float, buckets: Mapping[float, float]) -> float | None:
    """Prometheus' ``histogram_quantile``: the ``q`` quantile of cumulative ``buckets`` (upper
    bound -> count, ``inf`` included), linear within the bucket it falls in; the highest finite
    bound when it falls in the ``+Inf`` bucket; None without observations."""
    if not buckets or not 0 <= q <= 1:
        return None
    bounds = sorted(buckets)
    total = buckets[bounds[-1]] if math.isinf(bounds[-1]) else max(buckets.values())
    if total <= 0:
        return None
    rank = q * total
    lower, below = 0.0, 0.0
    for bound in bounds:
        count = buckets[bound]
        if count >= rank:
            if math.isinf(bound):
                finite = [b for b in bounds if not math.isinf(b)]
                return finite[-1] if finite else None
            if count == below:
                return bound
            return lower + (bound - lower) * (rank - below) / (count - below)
        lower, below = bound, count
    finite = [b for b in bounds if not math.isinf(b)]
    return finite[-1] if finite else None


def _targets(proxy: Proxy, labels: Mapping[str, str], name: str) -> list[Target]:
    reporter = labels.get("reporter", "")
    request = name in (ex.REQUESTS, ex.DURATION_BUCKET, ex.REQUEST_BYTES, ex.RESPONSE_BYTES)
    if proxy.kind == "sidecar":
        if reporter == "destination":
            return [Target(proxy.namespace, proxy.workload, pod=proxy.pod)]
        return []
    destination = Target(
        labels.get("destination_workload_namespace", UNKNOWN),
        labels.get("destination_workload", UNKNOWN),
    )
    known = UNKNOWN not in (destination.namespace, destination.workload)
    if proxy.kind == "node":
        if reporter == "destination" and known:
            return [Target(destination.namespace, destination.workload, node=proxy.node)]
        return []
    own = [Target(proxy.namespace, proxy.workload, pod=proxy.pod)]
    if request and reporter == "source" and known:
        return [*own, destination]
    return own


def attribute(proxy: Proxy, before: ex.Snapshot, after: ex.Snapshot) -> dict[Target, Figures]:
    """The window's figures of one proxy, by the target each series counts for."""
    seconds = max(after.at - before.at, 0.0)
    found: dict[Target, Figures] = {}
    grown = increases(before, after)
    for series, value in after.values.items():
        name, pairs = series
        labels = dict(pairs)
        for target in _targets(proxy, labels, name):
            figures = found.setdefault(target, Figures(seconds=seconds))
            _count(figures, name, labels, grown[series], value)
    return found


def _count(f: Figures, name: str, labels: Mapping[str, str], grown: float, now: float) -> None:
    mtls = labels.get("connection_security_policy") == MTLS
    if name == ex.REQUESTS:
        f.requests += grown
        f.failed_requests += grown if labels.get("response_code", "").startswith("5") else 0.0
        f.mtls_requests += grown if mtls else 0.0
    elif name == ex.DURATION_BUCKET:
        try:
            le = float(labels.get("le", ""))
        except ValueError:
            return
        f.buckets[le] = f.buckets.get(le, 0.0) + grown
    elif name == ex.TCP_OPENED:
        f.opened += grown
        f.mtls_opened += grown if mtls else 0.0
        f.open += now
    elif name == ex.TCP_CLOSED:
        f.closed += grown
        f.open -= now
    elif name == ex.TCP_FAILED:
        f.failed += grown
    elif name in (ex.TCP_RECEIVED, ex.REQUEST_BYTES):
        f.bytes_in += grown
    elif name in (ex.TCP_SENT, ex.RESPONSE_BYTES):
        f.bytes_out += grown


def total(parts: Iterable[Figures]) -> Figures:
    out = Figures()
    for part in parts:
        out.add(part)
    return out


def _rate(n: float, seconds: float) -> float | None:
    return round(n / seconds, 3) if seconds > 0 else None


def _share(n: float, of: float) -> float | None:
    return round(n / of, 4) if of > 0 else None


def summary(f: Figures) -> dict[str, object]:
    """The figures a row shows: success as a share of requests where a proxy saw requests, else
    of connection attempts; rates per second over the window; latency in milliseconds."""
    attempts = f.opened + f.failed
    basis: str | None
    if f.requests > 0:
        success, basis = _share(f.requests - f.failed_requests, f.requests), "requests"
        mtls = _share(f.mtls_requests, f.requests)
    else:
        success, basis = _share(f.opened, attempts), "connections" if attempts else None
        mtls = _share(f.mtls_opened, f.opened)
    p50, p99 = quantile(0.5, f.buckets), quantile(0.99, f.buckets)
    return {
        "success": success,
        "successOf": basis,
        "requests": int(f.requests),
        "failedRequests": int(f.failed_requests),
        "rps": _rate(f.requests, f.seconds),
        "latencyP50Ms": None if p50 is None else round(p50, 3),
        "latencyP99Ms": None if p99 is None else round(p99, 3),
        "connections": int(f.opened),
        "failedConnections": int(f.failed),
        "cps": _rate(f.opened, f.seconds),
        "tcpOpen": max(int(f.open), 0),
        "bytesInPerSecond": _rate(f.bytes_in, f.seconds),
        "bytesOutPerSecond": _rate(f.bytes_out, f.seconds),
        "mtls": mtls,
        "windowSeconds": round(f.seconds, 3),
    }
