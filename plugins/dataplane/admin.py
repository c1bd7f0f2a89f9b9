"""The data plane's HTTP endpoints: readiness (:15021), metrics (:15020), admin (127.0.0.1:15000).

Owns a minimal HTTP/1.1 responder (one request per connection, ``Connection: close``, a read
deadline, bodies up to 64 KiB) and the routes: ``/healthz/ready``; ``/metrics`` and
``/stats/prometheus``, and the app probes under ``/app-health/`` (app_probes.py);
``/config_dump``, ``/logging`` (GET shows, POST ``?level=`` sets),
``/quitquitquit`` (POST: drain and exit). Invariant: no key material is ever rendered; the
admin port is bound by the supervisor to loopback only.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any
from urllib.parse import parse_qs, urlsplit

from prometheus_client import CONTENT_TYPE_LATEST

from meshctl import __version__
from meshctl.core.k8s.appprobes import is_probe_path
from meshctl.core.wire.channel import Certs, CertSource

if TYPE_CHECKING:
    import socket

    from .runtime import Runtime

log = logging.getLogger(__name__)

Response = tuple[int, str, bytes]
# (method, path, query, headers with lower-case names) -> response
Handler = Callable[[str, str, dict[str, list[str]], dict[str, str]], Awaitable[Response]]
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}
_READ_DEADLINE = 5.0
_MAX_BODY = 64 * 1024


async def serve(sock: socket.socket, handler: Handler) -> asyncio.Server:
    """Answer HTTP requests arriving on the listening ``sock`` with ``handler``."""

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_DEADLINE)
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, target, _ = request_line.split(" ", 2)
            headers: dict[str, str] = {}
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            length = min(int(headers.get("content-length") or 0), _MAX_BODY)
            if length:
                await asyncio.wait_for(reader.readexactly(length), _READ_DEADLINE)
            url = urlsplit(target)
            status, ctype, body = await handler(method, url.path, parse_qs(url.query), headers)
        except (
            ValueError,  # a request line or header that is not HTTP, or a bad content-length
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,  # a head longer than the reader's 64 KiB limit
            TimeoutError,
            ConnectionError,
        ):
            status, ctype, body = 400, "text/plain", b"bad request\n"
        try:
            writer.write(
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
                + body
            )
            await asyncio.wait_for(writer.drain(), _READ_DEADLINE)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(one, sock=sock)


def text(status: int, body: str) -> Response:
    return status, "text/plain; charset=utf-8", body.encode()


class Endpoints:
    """The route table of the three ports, reading live state from the runtime."""

    def __init__(self, rt: Runtime) -> None:
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

    async def config_dump(self) -> dict[str, Any]:
        """ztunnel's shape: workloads, services, policies, certificates, config, version.

        Workloads, policies and certificates are the same in every worker (one feed); the
        connections are each worker's own, so they are gathered from all of them through the
        supervisor and summed, every flow tagged with its worker. A worker that does not answer
        in time (restarting) is listed in ``workersMissing`` instead of holding up the answer.
        """
        rt = self.rt
        store = rt.store
        own = {
            "worker": rt.config.worker,
            "pid": os.getpid(),
            "connections": rt.connection_report(),
        }
        gathered = await rt.gather_reports()
        reports = sorted([own, *gathered.reports], key=lambda r: int(r["worker"]))
        connections: dict[str, Any] = {
            key: sum(int(r["connections"][key]) for r in reports)
            for key in ("inbound_tunnels", "pooled", "open")
        }
        connections["flows"] = [
            {**flow, "worker": r["worker"]} for r in reports for flow in r["connections"]["flows"]
        ]
        hidden = ("listeners", "pod_channel")
        dump: dict[str, Any] = {
            "version": __version__,
            "config": {k: v for k, v in _fields(rt.config).items() if k not in hidden},
            # The worker that answered; ``workers`` below lists each one's share.
            "worker": {"index": rt.config.worker, "of": rt.config.workers, "pid": os.getpid()},
            "workloads": [_record(w) for w in store.workloads],
            "services": [_record(s) for s in store.services],
            "policies": [_record(p) for p in store.policies],
            "certificates": rt.certificate_summary(),
            # The discovery client's view (empty with a local config): connection, per type
            # subscription, ACKed nonce, resources held, NACKs.
            "xds": rt.xds_state,
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
        served = rt.locals.get("")
        if served is not None:
            dump["identity"] = str(served.identity)
        if rt.node_mode:
            # ztunnel's in-pod section: uid -> info, state, plus the netns, listeners and
            # certificate of each enrolled pod.
            dump["workloadState"] = rt.workload_state()
            dump["podsSynced"] = rt.pods_synced
        return dump


def certificate_summary(
    certs: Certs, identity: str, source: CertSource | None = None
) -> list[dict[str, Any]]:
    """The ``certificates`` section: identity, state, each certificate's validity, and where
    the certificates come from (files, or the CA with the state of its renewal)."""
    chain = [dict(f) for f in certs.chain_facts]
    state = "Available"
    if chain and datetime.fromisoformat(chain[0]["expirationTime"]) <= datetime.now(UTC):
        state = "Expired"
    entry: dict[str, Any] = {
        "identity": identity,
        "state": state,
        "certChain": chain,
        "rootCerts": [dict(f) for f in certs.root_facts],
    }
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


def _fields(obj: Any) -> dict[str, Any]:
    from dataclasses import fields

    return {f.name: getattr(obj, f.name) for f in fields(obj)}


def _record(obj: Any) -> dict[str, Any]:
    """A store record as JSON-friendly camelCase data."""
    out: dict[str, Any] = {}
    for key, value in _fields(obj).items():
        if key.startswith("_"):
            continue
        out[_camel(key)] = _plain(value)
    return out


def _plain(value: Any) -> Any:
    if isinstance(value, tuple | list):
        return [_plain(v) for v in value]
    if isinstance(value, dict) or hasattr(value, "items"):
        return {str(k): _plain(v) for k, v in value.items()}
    if hasattr(value, "__dataclass_fields__"):
        return _record(value)
    if isinstance(value, bool | int | float | str) or value is None:
        return value
    return str(value)


def _camel(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(p.title() for p in rest)
