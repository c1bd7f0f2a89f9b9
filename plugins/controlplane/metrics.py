"""The control plane's Prometheus metrics (served on 15014 at ``/metrics``), one registry each.

Owns the names and labels: CA requests by result and their latency, TokenReviews by result, the
root's expiry (Istio's ``citadel_server_root_cert_expiry_timestamp``), and for discovery the
connected proxies (Istio's ``pilot_xds``), pushes, NACKs and push latency by type
(``pilot_xds_pushes``, ``pilot_total_xds_rejects``, ``pilot_xds_push_time``), which the
discovery server updates. Invariant: a registry per process object, never the global default
(no module-level state); label values come from fixed sets, never from a peer's input.
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

# Why a CreateCertificate ended; also the ``result`` label's complete set of values.
RESULTS = (
    "issued",
    "unauthenticated",
    "permission_denied",
    "invalid_argument",
    "unavailable",
    "internal",
)
REVIEW_RESULTS = ("accepted", "refused", "error")


class Metrics:
    """Every metric of one control-plane process."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        self.ca_requests = Counter(
            "meshctl_ca_requests",
            "CreateCertificate calls by result",
            ["result"],
            registry=self.registry,
        )
        self.ca_duration = Histogram(
            "meshctl_ca_request_duration_seconds",
            "CreateCertificate handling time (authentication, checks and signing) by result",
            ["result"],
            buckets=(0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 1.0, 5.0),
            registry=self.registry,
        )
        self.token_reviews = Counter(
            "meshctl_ca_token_reviews",
            "TokenReviews sent to the API server by result (cache misses only)",
            ["result"],
            registry=self.registry,
        )
        self.root_expiry = Gauge(
            "citadel_server_root_cert_expiry_timestamp",
            "Unix time at which the signing CA's root certificate expires",
            registry=self.registry,
        )
        self.connected_proxies = Gauge(
            "pilot_xds",
            "Proxies connected to this control plane over xDS",
            registry=self.registry,
        )
        self.pushes = Counter(
            "pilot_xds_pushes",
            "xDS responses sent, by type",
            ["type"],
            registry=self.registry,
        )
        self.xds_rejects = Counter(
            "pilot_total_xds_rejects",
            "xDS responses proxies refused (NACK), by type",
            ["type"],
            registry=self.registry,
        )
        self.xds_push_time = Histogram(
            "pilot_xds_push_time",
            "Seconds from a store change to its xDS response being written, by type",
            ["type"],
            buckets=(0.001, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 5.0),
            registry=self.registry,
        )
        self.leader = Gauge(
            "meshctl_controlplane_leader",
            "1 while this replica holds the writers' lease",
            registry=self.registry,
        )
        for result in RESULTS:  # present from the start: rate() over a missing series is empty
            self.ca_requests.labels(result)
        for result in REVIEW_RESULTS:
            self.token_reviews.labels(result)
