"""The gateway's request and connection metrics, with Istio's names and labels (the gateway
reports as the source, as Istio's gateways do): ``istio_requests_total``,
``istio_request_duration_milliseconds``, ``istio_request_bytes``/``istio_response_bytes`` sums;
for TLS passthrough and TCP listeners ``istio_tcp_connections_opened_total``/``_closed_total``
and ``istio_tcp_received_bytes_total`` (client -> backend) / ``istio_tcp_sent_bytes_total``
(backend -> client), with ``request_protocol="tcp"`` as Istio's TCP metrics carry.

Owns one registry per process (never the global one). The label set is the TCP metrics' set
from ``meshctl.proxy.telemetry`` (plus ``response_code`` on the request metrics); unknown values
render ``unknown``. A connection counts as opened when its backend connection is made (or, never
made, when it ends: opened and closed together, its flags saying why), and its bytes are added
when it closes.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from meshctl.proxy.telemetry import LABELS, UNKNOWN, tcp_counters

REQUEST_LABELS = (*LABELS, "response_code")
# Istio's default buckets for request durations (milliseconds).
MAX_CACHED_SERIES = 10_000
BUCKETS = (0.5, 1, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000, 10000, 30000, 60000)


@dataclass(frozen=True, slots=True, kw_only=True)
class Source:
    """Who the gateway is, for the ``source_*`` labels."""

    workload: str = UNKNOWN
    namespace: str = UNKNOWN
    principal: str = UNKNOWN
    cluster: str = "Kubernetes"


@dataclass(frozen=True, slots=True, kw_only=True)
class Sample:
    status: int
    protocol: str  # http | grpc | tcp
    service_host: str = ""  # name.namespace.svc.cluster.local
    service_name: str = ""
    service_namespace: str = ""
    workload: str = ""  # "<namespace>/<name>" of the endpoint
    principal: str = ""
    mtls: bool = False
    flags: str = "-"
    duration_ms: float = 0.0
    request_bytes: int = 0
    response_bytes: int = 0


def _series(sample: Sample) -> tuple[object, ...]:
    """What tells a sample's series apart, but for the response code."""
    return (
        sample.protocol,
        sample.service_host,
        sample.service_name,
        sample.service_namespace,
        sample.workload,
        sample.principal,
        sample.mtls,
        sample.flags,
    )


class RequestMetrics:
    def __init__(self, source: Source) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        self.source = source
        self.requests = Counter("istio_requests", "Requests", REQUEST_LABELS, registry=r)
        self.duration = Histogram(
            "istio_request_duration_milliseconds",
            "Request durations",
            REQUEST_LABELS,
            buckets=BUCKETS,
            registry=r,
        )
        self.request_bytes = Counter(
            "istio_request_bytes", "Request body bytes", REQUEST_LABELS, registry=r
        )
        self.response_bytes = Counter(
            "istio_response_bytes", "Response body bytes", REQUEST_LABELS, registry=r
        )
        self.tcp = tcp_counters(r)
        self._children: dict[tuple[object, ...], tuple[Any, Any, Any, Any]] = {}
        self._tcp_children: dict[tuple[object, ...], tuple[Any, Any, Any, Any]] = {}
        # One series however many workers set it (multiprocess mode; ignored in one process).
        build = Gauge(
            "istio_build",
            "Build information",
            ("component", "tag"),
            registry=r,
            multiprocess_mode="max",
        )
        from meshctl import __version__

        build.labels("gateway", __version__).set(1)

    def record(self, sample: Sample) -> None:
        key = (sample.status, *_series(sample))
        children = self._children.get(key)
        if children is None:
            # Resolving 24 labels costs more than the request's own routing: once per series.
            labels = self._labels(sample)
            children = (
                self.requests.labels(**labels),
                self.duration.labels(**labels),
                self.request_bytes.labels(**labels),
                self.response_bytes.labels(**labels),
            )
            if len(self._children) < MAX_CACHED_SERIES:
                self._children[key] = children
        requests, duration, request_bytes, response_bytes = children
        requests.inc()
        duration.observe(sample.duration_ms)
        request_bytes.inc(sample.request_bytes)
        response_bytes.inc(sample.response_bytes)

    def connection_opened(self, sample: Sample) -> None:
        self._tcp_series(sample)[0].inc()

    def connection_closed(self, sample: Sample, *, received: int, sent: int) -> None:
        """``received``: bytes from the client; ``sent``: bytes to it (Istio's directions)."""
        _, closed, from_client, to_client = self._tcp_series(sample)
        closed.inc()
        from_client.inc(received)
        to_client.inc(sent)

    def _tcp_series(self, sample: Sample) -> tuple[Any, Any, Any, Any]:
        """The four ``istio_tcp_*`` children of the sample's series, resolved once per series
        (building 23 labels cost ~40 us, a tenth of a passthrough connection's CPU)."""
        key = _series(sample)
        children = self._tcp_children.get(key)
        if children is None:
            labels = self._labels(sample)
            del labels["response_code"]
            tcp = self.tcp
            children = (
                tcp.opened.labels(**labels),
                tcp.closed.labels(**labels),
                tcp.received.labels(**labels),
                tcp.sent.labels(**labels),
            )
            if len(self._tcp_children) < MAX_CACHED_SERIES:
                self._tcp_children[key] = children
        return children

    def _labels(self, s: Sample) -> dict[str, str]:
        src = self.source
        ns, _, name = s.workload.partition("/") if s.workload else (UNKNOWN, "", UNKNOWN)
        app = s.service_name or UNKNOWN
        return {
            "reporter": "source",
            "source_workload": src.workload,
            "source_canonical_service": src.workload,
            "source_canonical_revision": "latest",
            "source_workload_namespace": src.namespace,
            "source_principal": src.principal,
            "source_app": src.workload,
            "source_version": "latest",
            "source_cluster": src.cluster,
            "destination_service": s.service_host or UNKNOWN,
            "destination_service_namespace": s.service_namespace or UNKNOWN,
            "destination_service_name": s.service_name or UNKNOWN,
            "destination_workload": name or UNKNOWN,
            "destination_canonical_service": app,
            "destination_canonical_revision": "latest",
            "destination_workload_namespace": ns or UNKNOWN,
            "destination_principal": s.principal or UNKNOWN,
            "destination_app": app,
            "destination_version": "latest",
            "destination_cluster": src.cluster if s.service_host else UNKNOWN,
            "request_protocol": s.protocol,
            "response_flags": s.flags,
            "connection_security_policy": "mutual_tls" if s.mtls else UNKNOWN,
            "response_code": str(s.status),
        }

    def render(self) -> bytes:
        return generate_latest(self.registry)
