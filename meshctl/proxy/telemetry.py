"""Istio's TCP metrics and the per-connection access log.

Owns the Prometheus registry of one data plane (never the process-global one) with Istio's names
and labels (``istio_tcp_*``, ``reporter``, ``source_*``, ``destination_*``,
``connection_security_policy``; unknown values render ``unknown``), and ``Flow``: one proxied
connection's counters. Istio's directions: *received* bytes travel client -> server (the
request), *sent* bytes server -> client (the response), for either reporter. Invariants: a
``Flow`` is opened at most once and closed exactly once, and a failed one counts as failed and
not as opened; a flow's bytes reach the byte counters when it closes and, while it is open, at
the latest ``PUBLISH_INTERVAL`` later or when this worker renders the metrics (every increment
of a multiprocess counter is a lock, a getpid and an mmap write: too much per read).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, values
from prometheus_client.multiprocess import MultiProcessCollector

from meshctl.core.mesh.records import Service, Workload
from meshctl.core.pki.identity import SpiffeId

if TYPE_CHECKING:
    from meshctl.core.wire.dump import FlowEnd, FlowFacts

access_log = logging.getLogger("meshctl.access")

LABELS = (
    "reporter",
    "source_workload",
    "source_canonical_service",
    "source_canonical_revision",
    "source_workload_namespace",
    "source_principal",
    "source_app",
    "source_version",
    "source_cluster",
    "destination_service",
    "destination_service_namespace",
    "destination_service_name",
    "destination_workload",
    "destination_canonical_service",
    "destination_canonical_revision",
    "destination_workload_namespace",
    "destination_principal",
    "destination_app",
    "destination_version",
    "destination_cluster",
    "request_protocol",
    "response_flags",
    "connection_security_policy",
)
UNKNOWN = "unknown"
PUBLISH_INTERVAL = 1.0  # seconds: how stale an open flow's byte counters may be
_CACHE_LIMIT = 4096  # label sets kept; cleared beyond that (workload churn), then rebuilt


@dataclass(slots=True)
class _Children:
    """The counters one label set increments (prometheus-client's ``labels()`` resolved once)."""

    opened: Any
    closed: Any
    received: Any
    sent: Any
    keep: tuple[object, ...]  # the objects whose id() is in the cache key stay alive with it


_pid = os.getpid()


def _remember_pid() -> None:
    global _pid  # noqa: PLW0603 (one number per process, refreshed by a fork)
    _pid = os.getpid()


def _this_process() -> int:
    return _pid


def _cheap_multiprocess_values() -> None:
    """Multiprocess values that identify their process without a syscall.

    prometheus-client's multiprocess values ask ``os.getpid()`` on every increment, to notice a
    fork: a system call, six per connection and proxy, 3% of a new connection's CPU. The pid is
    remembered instead and refreshed in a forked child (its documented ``process_identifier``
    hook, which must differ between processes running at once: it does).
    """
    global _installed  # noqa: PLW0603 (once per process: two value classes would share files)
    if os.environ.get("PROMETHEUS_MULTIPROC_DIR") and not _installed:
        values.ValueClass = values.MultiProcessValue(  # type: ignore[no-untyped-call]
            process_identifier=_this_process
        )
        _installed = True


_installed = False


os.register_at_fork(after_in_child=_remember_pid)


@dataclass(frozen=True, slots=True)
class TcpCounters:
    """Istio's ``istio_tcp_*`` counters (prometheus-client appends ``_total``), for every proxy
    that reports TCP streams: the node proxy and sidecar, the gateway's TLS and TCP listeners."""

    opened: Counter
    closed: Counter
    sent: Counter  # server -> client (response)
    received: Counter  # client -> server (request)


def tcp_counters(registry: CollectorRegistry) -> TcpCounters:
    def counter(name: str, text: str) -> Counter:
        return Counter(name, text, LABELS, registry=registry)

    return TcpCounters(
        opened=counter("istio_tcp_connections_opened", "TCP connections opened"),
        closed=counter("istio_tcp_connections_closed", "TCP connections closed"),
        sent=counter("istio_tcp_sent_bytes", "Bytes sent server -> client (response)"),
        received=counter("istio_tcp_received_bytes", "Bytes received client -> server (request)"),
    )


class Telemetry:
    """The counters of one data plane, in its own registry."""

    def __init__(self) -> None:
        _cheap_multiprocess_values()
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry
        # prometheus-client appends "_total" to counter names.
        tcp = tcp_counters(r)
        self.opened, self.closed, self.sent, self.received = (
            tcp.opened,
            tcp.closed,
            tcp.sent,
            tcp.received,
        )
        self.failed = Counter(
            "istio_tcp_connections_failed", "TCP connections that failed", LABELS, registry=r
        )
        self.active = 0  # flows open now (the drain waits for zero)
        self.flows: set[Flow] = set()  # the open ones, for /config_dump
        # With several workers each one's values live in its own file in the multiprocess
        # directory (prometheus-client's multiprocess mode): live gauges add up, build is one.
        self.open_sockets = Gauge(
            "istio_open_sockets",
            "Proxied connections open now",
            ("direction",),
            registry=r,
            multiprocess_mode="livesum",
        )
        build = Gauge(
            "istio_build",
            "Build information",
            ("component", "tag"),
            registry=r,
            multiprocess_mode="max",
        )
        from meshctl import __version__

        build.labels("ztunnel", __version__).set(1)
        self.multiprocess_dir = ""
        self._children: dict[tuple[object, ...], _Children] = {}
        self._open_gauges: dict[str, Gauge] = {}

    def children(
        self, reporter: str, src: Peer, dst: Peer, service: Service | None, *, mtls: bool
    ) -> _Children:
        """The counters of a connection between ``src`` and ``dst`` (cached per label set).

        Keyed by the identity of the workload and service records (frozen snapshots: a reload
        makes new ones, hence a new key) and by the value of the SPIFFE ids; building the 23
        label values and resolving four metrics' children took ~8% of a proxy's CPU per
        connection.
        """
        s, d = src.workload, dst.workload
        key = (reporter, id(s), src.identity, id(d), dst.identity, id(service), mtls)
        found = self._children.get(key)
        if found is None:
            if len(self._children) >= _CACHE_LIMIT:
                self._children.clear()
            values = labels(reporter, src, dst, service=service, mtls=mtls)
            found = self._children[key] = _Children(
                opened=self.opened.labels(**values),
                closed=self.closed.labels(**values),
                received=self.received.labels(**values),
                sent=self.sent.labels(**values),
                keep=(s, d, service),
            )
        return found

    def open_gauge(self, direction: str) -> Gauge:
        gauge = self._open_gauges.get(direction)
        if gauge is None:
            gauge = self._open_gauges[direction] = self.open_sockets.labels(direction)
        return gauge

    def publish_open(self) -> None:
        """Push the bytes open flows moved since their last publish into the counters."""
        for flow in self.flows:
            flow.publish()

    def render(self) -> bytes:
        """The Prometheus text of every worker (or of this process alone without a directory)."""
        self.publish_open()
        if not self.multiprocess_dir:
            return generate_latest(self.registry)
        merged = CollectorRegistry()
        MultiProcessCollector(merged, path=self.multiprocess_dir)  # type: ignore[no-untyped-call]
        return generate_latest(merged)


@dataclass(slots=True)
class Peer:
    """One end of a connection, as far as we know it."""

    addr: tuple[str, int]
    workload: Workload | None = None
    identity: SpiffeId | None = None


def labels(
    reporter: str,
    src: Peer,
    dst: Peer,
    *,
    service: Service | None,
    mtls: bool,
    flags: str = "-",
) -> dict[str, str]:
    """Istio's label values for a connection between ``src`` and ``dst``."""
    return {
        "reporter": reporter,
        **_end_labels("source", src),
        "destination_service": service.hostname if service else UNKNOWN,
        "destination_service_namespace": service.namespace if service else UNKNOWN,
        "destination_service_name": service.name if service else UNKNOWN,
        **_end_labels("destination", dst),
        "request_protocol": "tcp",
        "response_flags": flags,
        "connection_security_policy": "mutual_tls" if mtls else UNKNOWN,
    }


def _end_labels(side: str, peer: Peer) -> dict[str, str]:
    """The labels of one end (``source`` or ``destination``): its workload and principal."""
    w = peer.workload
    return {
        f"{side}_workload": (w.workload_name or w.name) if w else UNKNOWN,
        f"{side}_canonical_service": (w.canonical_name or w.name) if w else UNKNOWN,
        f"{side}_canonical_revision": w.canonical_revision or "latest" if w else UNKNOWN,
        f"{side}_workload_namespace": w.namespace if w else UNKNOWN,
        f"{side}_principal": str(peer.identity) if peer.identity else UNKNOWN,
        f"{side}_app": (w.canonical_name or w.name) if w else UNKNOWN,
        f"{side}_version": w.canonical_revision or "latest" if w else UNKNOWN,
        f"{side}_cluster": w.cluster_id if w else UNKNOWN,
    }


class Flow:
    """One proxied connection: counters while it runs, one access-log line when it ends."""

    def __init__(
        self,
        telemetry: Telemetry,
        *,
        direction: str,
        src: Peer,
        dst: Peer,
        service: Service | None = None,
        mtls: bool = False,
        hbone_addr: tuple[str, int] | None = None,
    ) -> None:
        self.telemetry = telemetry
        self.direction = direction  # "inbound" | "outbound"
        self.src, self.dst = src, dst
        self.service = service
        self.mtls = mtls
        # Over HBONE, either side: the CONNECT authority (ztunnel's dst.hbone_addr), while
        # dst.addr is the address of the TCP connection that carries it (the peer's :15008).
        self.hbone_addr = hbone_addr
        self.started = time.monotonic()
        self.bytes_received = 0  # client -> server
        self.bytes_sent = 0  # server -> client
        self._published = (0, 0)  # (received, sent) already in the counters
        self._children: _Children | None = None
        self.state = "new"  # new -> open -> closed | new -> failed

    @property
    def reporter(self) -> str:
        return "source" if self.direction == "outbound" else "destination"

    def _labels(self, flags: str = "-") -> dict[str, str]:
        return labels(
            self.reporter, self.src, self.dst, service=self.service, mtls=self.mtls, flags=flags
        )

    def open(self) -> None:
        if self.state != "new":
            return
        self.state = "open"
        t = self.telemetry
        # close() counts under the same labels. Bytes that moved before the flow opened (a
        # client that sends right after its CONNECT) are published with the rest.
        self._children = t.children(self.reporter, self.src, self.dst, self.service, mtls=self.mtls)
        self._children.opened.inc()
        t.open_gauge(self.direction).inc()
        t.active += 1
        t.flows.add(self)

    def request_bytes(self, n: int) -> None:
        self.bytes_received += n

    def response_bytes(self, n: int) -> None:
        self.bytes_sent += n

    def publish(self) -> None:
        """Add the bytes moved since the last publish to the byte counters (open flows only)."""
        children = self._children
        if children is None:
            return
        received, sent = self._published
        if self.bytes_received != received:
            children.received.inc(self.bytes_received - received)
        if self.bytes_sent != sent:
            children.sent.inc(self.bytes_sent - sent)
        self._published = (self.bytes_received, self.bytes_sent)

    def fail(self, flags: str, reason: str) -> None:
        """The connection was refused or could not be set up (never opened)."""
        if self.state == "open":
            self.close(error=reason)
            return
        if self.state != "new":
            return
        self.state = "failed"
        self.telemetry.failed.labels(**self._labels(flags)).inc()
        self._log(error=reason, flags=flags)

    def close(self, error: str | None = None) -> None:
        if self.state != "open":
            return
        self.state = "closed"
        self.publish()
        t = self.telemetry
        if self._children is not None:
            self._children.closed.inc()
        t.open_gauge(self.direction).dec()
        t.active -= 1
        t.flows.discard(self)
        self._log(error=error)

    def describe(self) -> FlowFacts:
        """This connection for ``/config_dump``: both ends with their identities, bytes so far."""

        def end(peer: Peer) -> FlowEnd:
            w = peer.workload
            return {
                "addr": _addr(peer.addr),
                "workload": f"{w.namespace}/{w.name}" if w else None,
                "identity": str(peer.identity) if peer.identity else None,
            }

        return {
            "direction": self.direction,
            "src": end(self.src),
            "dst": end(self.dst),
            "hboneAddr": _addr(self.hbone_addr) if self.hbone_addr else None,
            "service": self.service.hostname if self.service else None,
            "mutualTls": self.mtls,
            "bytesReceived": self.bytes_received,
            "bytesSent": self.bytes_sent,
            "durationSeconds": round(time.monotonic() - self.started, 3),
        }

    def _log(self, *, error: str | None, flags: str = "-") -> None:
        if not access_log.isEnabledFor(logging.INFO):
            return  # the line is built only for a logger that writes it
        s, d = self.src, self.dst
        outbound = self.direction == "outbound"
        fields = {
            "src.addr": _addr(s.addr),
            "src.workload": s.workload.name if s.workload else None,
            "src.namespace": s.workload.namespace if s.workload else None,
            "src.identity": _text(s.identity) if s.identity else None,
            "dst.addr": _addr(d.addr),
            "dst.hbone_addr": _addr(self.hbone_addr) if self.hbone_addr else None,
            "dst.service": self.service.hostname if self.service else None,
            "dst.workload": d.workload.name if d.workload else None,
            "dst.namespace": d.workload.namespace if d.workload else None,
            "dst.identity": _text(d.identity) if d.identity else None,
            "direction": self.direction,
            # ztunnel's reading: each proxy's bytes_sent is what it forwarded towards the other
            # proxy's side of the mesh: the client's bytes at the source, the server's at the
            # destination (its metrics.rs: "Istio flips the metric for source ... unflip for logs").
            "bytes_sent": self.bytes_received if outbound else self.bytes_sent,
            "bytes_recv": self.bytes_sent if outbound else self.bytes_received,
            "duration": f"{(time.monotonic() - self.started) * 1000:.0f}ms",
        }
        if error:
            fields["error"] = error
            fields["flags"] = flags
        # One pass; only the error text can hold a space (ztunnel quotes such values).
        text = " ".join(
            [
                f'{k}="{v}"' if k == "error" else f"{k}={v}"
                for k, v in fields.items()
                if v is not None
            ]
        )
        access_log.info("connection complete %s", text, extra={"access": fields})


# SPIFFE ids repeat per peer: their text is built once (a bounded cache of frozen values).
_text = functools.lru_cache(maxsize=4096)(str)


def _addr(addr: tuple[str, int]) -> str:
    host, port = addr[0], addr[1]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
