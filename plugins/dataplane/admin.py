"""The data plane's HTTP endpoints: readiness (:15021), metrics (:15020), admin (127.0.0.1:15000).

Owns the routes (served by ``meshctl.proxy.responder``): ``/healthz/ready``; ``/metrics`` and
``/stats/prometheus``, and the app probes under ``/app-health/`` (app_probes.py);
``/config_dump``, ``/logging`` (GET shows, POST ``?level=`` sets),
``/quitquitquit`` (POST: drain and exit). Invariant: no key material is ever rendered; the
admin port is bound by the supervisor to loopback only.
"""

from __future__ import annotations

import json
import logging
import os
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from prometheus_client import CONTENT_TYPE_LATEST

from meshctl import __version__
from meshctl.core.k8s.appprobes import is_probe_path
from meshctl.core.wire import ztunnel_dump
from meshctl.core.wire.channel import Certs, CertSource
from meshctl.proxy.responder import Response

if TYPE_CHECKING:
    from meshctl.core.mesh.store import Store
    from meshctl.core.wire import channel
    from meshctl.core.wire.dump import (
        CertificateSummary,
        ConfigDump,
        Connections,
        DiscoveryFacts,
        PodState,
        WorkerReport,
    )
    from meshctl.proxy.telemetry import Telemetry

    from .app_probes import AppProbes

log = logging.getLogger(__name__)


class State(Protocol):
    """What the routes read of the data plane (``Runtime`` is one): live, at each request."""

    @property
    def ready(self) -> bool: ...
    @property
    def draining(self) -> bool: ...
    @property
    def node_mode(self) -> bool: ...
    @property
    def pods_synced(self) -> bool: ...
    @property
    def store(self) -> Store: ...
    @property
    def config(self) -> channel.ProxyConfig: ...
    @property
    def telemetry(self) -> Telemetry: ...
    @property
    def app_probes(self) -> AppProbes: ...
    @property
    def xds_state(self) -> DiscoveryFacts | None: ...

    def served_identity(self) -> str | None: ...
    def served_listeners(self) -> dict[str, str] | None: ...
    def not_ready_reason(self) -> str: ...
    def certificate_problem(self) -> str | None: ...
    def renewal_warning(self) -> str | None: ...
    def certificate_summary(self) -> list[CertificateSummary]: ...
    def connection_report(self) -> Connections: ...
    def workload_state(self) -> dict[str, PodState]: ...
    async def gather_reports(self, timeout: float = 2.0) -> channel.Gathered: ...
    def request_quit(self) -> None: ...


def text(status: int, body: str) -> Response:
    return status, "text/plain; charset=utf-8", body.encode()


class Endpoints:
    """The route table of the three ports, reading live state from the runtime."""

    def __init__(self, rt: State) -> None:
        self.rt = rt

    async def readiness(
        self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str]
    ) -> Response:
        if path != "/healthz/ready":
            return text(404, "not found\n")
        if self.rt.ready and not self.rt.draining:
            problem = self.rt.certificate_problem()
            if problem:
                return text(503, f"not ready: {problem}\n")
            # Still serving on a valid certificate while the CA is away: ready, and say so.
            warning = self.rt.renewal_warning()
            return text(200, f"ready ({warning})\n" if warning else "ready\n")
        return text(503, f"not ready: {self.rt.not_ready_reason()}\n")

    async def metrics(
        self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str]
    ) -> Response:
        if is_probe_path(path):  # the kubelet's probes, rewritten to this port by the injector
            return await self.rt.app_probes.handle(method, path, headers)
        if path not in ("/metrics", "/stats/prometheus"):
            return text(404, "not found\n")
        ours = self.rt.telemetry.render()
        if path == "/stats/prometheus":  # Istio's merged endpoint: the app's metrics follow
            ours += await self.rt.app_probes.app_metrics_text()
        return 200, CONTENT_TYPE_LATEST, ours

    async def admin(
        self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str]
    ) -> Response:
        if path == "/config_dump":
            dump = await self.config_dump()
            return 200, "application/json", json.dumps(dump, indent=2).encode()
        if path == "/logging":
            if method == "POST" and "level" in query:
                level = query["level"][0].upper()
                if level not in ("DEBUG", "INFO", "WARNING", "ERROR"):
                    return text(400, "level must be debug|info|warning|error\n")
                logging.getLogger().setLevel(level)
            return text(200, f"level: {logging.getLevelName(logging.getLogger().level).lower()}\n")
        if path == "/quitquitquit":
            if method != "POST":
                return text(405, "use POST\n")
            self.rt.request_quit()
            return text(200, "OK\n")
        return text(404, "not found\n")

    async def config_dump(self) -> ConfigDump:
        """ztunnel's shape: workloads, services, policies, certificates, config, version.

        Workloads, policies and certificates are the same in every worker (one feed); the
        connections are each worker's own, so they are gathered from all of them through the
        supervisor and summed, every flow tagged with its worker. A worker that does not answer
        in time (restarting) is listed in ``workersMissing`` instead of holding up the answer.
        """
        rt = self.rt
        store = rt.store
        own: WorkerReport = {
            "worker": rt.config.worker,
            "pid": os.getpid(),
            "connections": rt.connection_report(),
        }
        gathered = await rt.gather_reports()
        reports = sorted([own, *gathered.reports], key=lambda r: int(r["worker"]))
        connections: Connections = {
            "inbound_tunnels": sum(int(r["connections"]["inbound_tunnels"]) for r in reports),
            "pooled": sum(int(r["connections"]["pooled"]) for r in reports),
            "open": sum(int(r["connections"]["open"]) for r in reports),
            "flows": [
                {**flow, "worker": r["worker"]}
                for r in reports
                for flow in r["connections"]["flows"]
            ],
        }
        hidden = ("listeners", "pod_channel")
        held = ztunnel_dump.state_sections(store.workloads, store.services, store.policies)
        dump: ConfigDump = {
            "version": __version__,
            "config": {k: v for k, v in _fields(rt.config).items() if k not in hidden},
            # The worker that answered; ``workers`` below lists each one's share.
            "worker": {"index": rt.config.worker, "of": rt.config.workers, "pid": os.getpid()},
            # ztunnel's shapes, so Istio's tooling reads them (``istioctl ztunnel-config``).
            "workloads": held["workloads"],
            "services": held["services"],
            "stagedServices": held["stagedServices"],
            "policies": held["policies"],
            "certificates": rt.certificate_summary(),
            # The discovery client's view (empty with a local config): connection, per type
            # subscription, ACKed nonce, resources held, NACKs.
            "xds": rt.xds_state or {},
            "connections": connections,
            "workers": [
                {
                    "index": r["worker"],
                    "pid": r["pid"],
                    "inboundTunnels": r["connections"]["inbound_tunnels"],
                    "pooled": r["connections"]["pooled"],
                    "open": r["connections"]["open"],
                }
                for r in reports
            ],
            "workersMissing": list(gathered.missing),
        }
        identity = rt.served_identity()
        if identity is not None:
            dump["identity"] = identity
        listeners = rt.served_listeners()
        if listeners is not None:
            dump["listeners"] = listeners  # sidecar mode: role -> address
        if rt.node_mode:
            # ztunnel's in-pod section: uid -> info, state, plus the netns, listeners and
            # certificate of each enrolled pod.
            pods = rt.workload_state()
            for pod in pods.values():
                if pod["state"] == "Up":  # as ztunnel: a pod's connections while it is served
                    info = pod["info"]
                    pod["connections"] = ztunnel_dump.pod_connections(
                        connections["flows"], info["namespace"], info["name"]
                    )
            dump["workloadState"] = pods
            dump["podsSynced"] = rt.pods_synced
        return dump


def certificate_summary(
    certs: Certs, identity: str, source: CertSource | None = None
) -> list[CertificateSummary]:
    """The ``certificates`` section (ztunnel's shape): identity, state, each certificate, and
    where the certificates come from (files, or the CA with the state of its renewal)."""
    chain = certs.chain_facts
    state = "Available"
    if chain and datetime.fromisoformat(chain[0]["expirationTime"]) <= datetime.now(UTC):
        state = "Expired"
    entry = ztunnel_dump.identity_certs(
        identity, state, chain, certs.cert_chain, certs.root_facts, certs.roots
    )
    if source is not None:
        entry["source"] = {
            "kind": source.source,
            "caAddress": source.ca_address,
            "renewing": source.renewing,
            "lastError": source.last_error,
            "failingSince": source.failing_since,
            "lastSuccess": source.last_success,
            "nextRefresh": source.next_refresh,
        }
    return [entry]


def _fields(obj: Any) -> dict[str, object]:
    from dataclasses import fields

    return {f.name: getattr(obj, f.name) for f in fields(obj)}
