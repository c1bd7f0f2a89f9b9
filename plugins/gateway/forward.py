"""One request through the gateway: route it (the core's ``match``), answer what the gateway
answers itself (404, 421, 500, 503, redirects), or forward it to a ready endpoint of the chosen
backend and stream the response back; one access-log line and one metrics sample per request.

Owns the proxy's request semantics: the table is read once per request (a config update never
changes a request in flight); filters apply in the API's order (request headers, rewrite) and
the response header modifier on the way back; ``X-Forwarded-For`` gets the client appended,
``X-Forwarded-Proto`` says the client's scheme, ``x-request-id`` is kept or generated; Host is
the client's unless rewritten. Endpoints are tried in a random rotation: one that refuses or does
not answer the connect is skipped; all of them: 503. A gRPC call (``core.gateway.grpc``) goes to
its backend over HTTP/2 (``upstream_h2``) with its trailers relayed, and what the gateway answers
itself is a trailers-only gRPC status instead (404 UNIMPLEMENTED, the 5xx UNAVAILABLE).
Invariant: every request gets exactly one response (or a reset when its response was already
under way).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from urllib.parse import urlsplit

from meshctl.core.gateway import filters as core_filters
from meshctl.core.gateway import grpc
from meshctl.core.gateway.config import Endpoint, GatewayConfig
from meshctl.core.gateway.matching import (
    HEADER,
    Decision,
    Outcome,
    Request,
    choose_backend,
    match,
    unresolved,
)
from meshctl.core.gateway.model import Backend
from meshctl.proxy.telemetry import access_log

from .exchange import BodyError, Headers, Inbound, ResponseSink
from .metrics import RequestMetrics, Sample
from .upstream import ConnectError, Dialer, Pool, Response, UpstreamError, tcp_dialer
from .upstream_h2 import H2Pool

log = logging.getLogger(__name__)
DEFAULT_HEAD_TIMEOUT = 30.0  # seconds for a backend's response head without a route timeout


@dataclass(slots=True)
class _Log:
    status: int = 0
    route: str = "-"
    backend: str = "-"
    endpoint: str = "-"
    identity: str = "-"
    reason: str = "-"
    flags: str = "-"
    sent: int = 0
    upstream_ms: float = -1.0
    grpc: bool = False  # a gRPC call: answered in gRPC's terms
    grpc_status: str = "-"  # its grpc-status (the backend's, or the gateway's own)


# (endpoint) -> the dialer for it and the identity it must present ("" when plaintext)
DialerFor = Callable[[Endpoint], tuple[Dialer, str]]


def plain(endpoint: Endpoint) -> tuple[Dialer, str]:
    """Every endpoint in plaintext (a gateway without a mesh identity)."""
    return tcp_dialer, ""


class Forwarder:
    def __init__(
        self,
        current: Callable[[], GatewayConfig | None],
        *,
        pool: Pool,
        metrics: RequestMetrics,
        dialer_for: DialerFor = plain,
        domain: str = "cluster.local",
        name: str = "gateway",
        h2_pool: H2Pool | None = None,
    ) -> None:
        self.current = current
        self.name = name  # the access log's first field ("gateway worker=N pid=P" in a worker)
        self.pool = pool
        self.h2_pool = h2_pool if h2_pool is not None else H2Pool(idle_timeout=pool.idle_timeout)
        self.metrics = metrics
        self.dialer_for = dialer_for
        self.domain = domain
        self.in_flight = 0

    async def __call__(self, inbound: Inbound, sink: ResponseSink) -> None:
        self.in_flight += 1
        entry = _Log(grpc=grpc.is_grpc(inbound.protocol, inbound.headers))
        sample: dict[str, object] = {}
        try:
            await self._handle(inbound, sink, entry, sample)
        finally:
            self.in_flight -= 1
            self._finish(inbound, entry, sample)

    async def _handle(
        self, inbound: Inbound, sink: ResponseSink, entry: _Log, sample: dict[str, object]
    ) -> None:
        config = self.current()
        if config is None:
            await self._answer(inbound, sink, entry, 503, "no config yet", "no-config")
            return
        try:
            path, query = _split(inbound.target)
        except ValueError as exc:  # an absolute-form target urlsplit refuses ("http://[::1/")
            await self._answer(inbound, sink, entry, 400, f"bad request target ({exc})", "DPE")
            return
        request = Request(
            port=inbound.port,
            host=inbound.authority,
            path=path,
            query=query,
            method=inbound.method,
            headers=tuple(inbound.headers),
            scheme=inbound.scheme,
            sni=inbound.sni,
            grpc=entry.grpc,
        )
        decision = match(config.table, request)
        entry.route = decision.entry.label if decision.entry is not None else "-"
        if decision.outcome is Outcome.REDIRECT:
            entry.reason = decision.reason
            headers = [("location", decision.location)]
            await self._respond(inbound, sink, entry, decision, decision.status, headers, b"")
            return
        if decision.outcome is not Outcome.FORWARD:
            await self._answer(inbound, sink, entry, decision.status, decision.reason, "NR")
            return
        backend = choose_backend(decision.backends, random.random())  # noqa: S311 (load spread)
        entry.backend = backend.label
        sample.update(
            service_host=f"{backend.name}.{backend.namespace}.svc.{self.domain}",
            service_name=backend.name,
            service_namespace=backend.namespace,
        )
        if not backend.resolved:
            reason = f"no-backend ({unresolved(backend)})"
            await self._answer(inbound, sink, entry, 500, reason, "NR")
            return
        endpoints = config.endpoints_of(backend)
        if not endpoints:
            reason = f"no-endpoint ({backend.label} has no ready endpoint)"
            await self._answer(inbound, sink, entry, 503, reason, "UH")
            return
        await self._forward(inbound, sink, entry, sample, decision, backend, endpoints, query)

    async def _forward(
        self,
        inbound: Inbound,
        sink: ResponseSink,
        entry: _Log,
        sample: dict[str, object],
        decision: Decision,
        backend: Backend,
        endpoints: tuple[Endpoint, ...],
        query: str,
    ) -> None:
        headers = self._upstream_headers(inbound, decision)
        target = (decision.upstream_path or "/") + (f"?{query}" if query else "")
        timeouts = decision.timeouts
        head_timeout = DEFAULT_HEAD_TIMEOUT
        if timeouts.backend_request_ms:
            head_timeout = timeouts.backend_request_ms / 1000
        if timeouts.request_ms:
            head_timeout = min(head_timeout, timeouts.request_ms / 1000)
        start = random.randrange(len(endpoints))  # noqa: S311 (load spread)
        loop = asyncio.get_running_loop()
        began = loop.time()
        last = ""
        response: Response | None = None
        for i in range(len(endpoints)):
            endpoint = endpoints[(start + i) % len(endpoints)]
            dialer, identity = self.dialer_for(endpoint)
            entry.endpoint = f"{endpoint.address}:{endpoint.port}"
            entry.identity = identity or "-"
            sample.update(workload=endpoint.workload, principal=identity, mtls=bool(identity))
            pool = self.h2_pool if entry.grpc else self.pool
            try:
                response = await pool.request(
                    (endpoint.address, endpoint.port),
                    method=inbound.method,
                    target=target,
                    headers=headers,
                    body=inbound.body,
                    head_timeout=head_timeout,
                    dial=dialer,
                )
                break
            except ConnectError as exc:
                last = str(exc)
                continue
            except UpstreamError as exc:
                status = 504 if "in time" in str(exc) else 502
                entry.upstream_ms = (loop.time() - began) * 1000
                flags = "UT" if status == 504 else "UC"
                await self._answer(inbound, sink, entry, status, f"upstream ({exc})", flags)
                return
            except BodyError as exc:
                entry.reason, entry.flags, entry.status = f"client ({exc})", "DC", 0
                return
        if response is None:
            reason = f"no-healthy-upstream (every endpoint of {backend.label} refused: {last})"
            await self._answer(inbound, sink, entry, 503, reason, "UF")
            return
        entry.upstream_ms = (loop.time() - began) * 1000
        await self._relay(response, sink, entry, decision)

    async def _relay(
        self, response: Response, sink: ResponseSink, entry: _Log, decision: Decision
    ) -> None:
        """Stream the backend's response to the client."""
        entry.reason = decision.reason
        out = response.headers
        if decision.filters.response_headers is not None:
            out = list(core_filters.modify_headers(out, decision.filters.response_headers))
        entry.status = response.status
        try:
            if response.ended:  # trailers-only (a gRPC status without a message)
                entry.grpc_status = _grpc_status(out)
                await sink.start(response.status, out, response.length, end_stream=True)
                return
            await sink.start(response.status, out, response.length)
            async for chunk in response.body:
                entry.sent += len(chunk)
                await sink.write(chunk)
            entry.grpc_status = _grpc_status(response.trailers or ())
            await sink.end(response.trailers)
        except UpstreamError as exc:
            entry.reason, entry.flags = f"upstream ({exc})", "UPE"
            sink.abort()
        except (ConnectionError, OSError) as exc:
            entry.reason, entry.flags = f"client ({exc})", "DC"
            response.close()

    def _upstream_headers(self, inbound: Inbound, decision: Decision) -> Headers:
        headers = [(n, v) for n, v in inbound.headers if n != "host"]
        if decision.filters.request_headers is not None:
            headers = list(core_filters.modify_headers(headers, decision.filters.request_headers))
        forwarded = [v for n, v in headers if n == "x-forwarded-for"]
        headers = [(n, v) for n, v in headers if n not in ("x-forwarded-for", "x-forwarded-proto")]
        client = inbound.client[0]
        headers.append(("x-forwarded-for", ", ".join([*forwarded, client])))
        headers.append(("x-forwarded-proto", inbound.scheme))
        request_id = next((v for n, v in headers if n == "x-request-id"), "")
        if not request_id:
            request_id = str(uuid.uuid4())
            headers.append(("x-request-id", request_id))
        inbound.extra["request_id"] = request_id
        host = decision.upstream_host or inbound.authority
        return [("host", host), *headers]

    async def _answer(
        self,
        inbound: Inbound,
        sink: ResponseSink,
        entry: _Log,
        status: int,
        reason: str,
        flags: str,
    ) -> None:
        entry.reason, entry.flags = reason, flags
        header = [(HEADER, reason)] if status in (404, 421, 500, 503) else []
        if entry.grpc:
            code = grpc.code_for(status)
            entry.grpc_status = str(int(code))
            head = [*grpc.trailers_only(code, reason), *header]
            await self._respond(inbound, sink, entry, None, 200, head, b"", end_stream=True)
            return
        await self._respond(inbound, sink, entry, None, status, header, f"{reason}\n".encode())

    async def _respond(
        self,
        inbound: Inbound,
        sink: ResponseSink,
        entry: _Log,
        decision: Decision | None,
        status: int,
        headers: Headers,
        body: bytes,
        *,
        end_stream: bool = False,
    ) -> None:
        entry.status = status
        if sink.started:
            sink.abort()
            return
        # The request's body is not forwarded: read it (within the front end's limits) so the
        # connection stays in step, unless it is long, in which case the front end closes.
        if inbound.body.length is not None and inbound.body.length <= 64 * 1024:
            with contextlib.suppress(BodyError, TimeoutError):
                await asyncio.wait_for(inbound.body.drain(), 5.0)
        out = [("content-type", "text/plain"), *headers] if body else list(headers)
        if decision is not None and decision.filters.response_headers is not None:
            out = list(core_filters.modify_headers(out, decision.filters.response_headers))
        if end_stream:
            await sink.start(status, out, 0, end_stream=True)
            return
        await sink.start(status, out, len(body))
        await sink.write(body)
        await sink.end()
        entry.sent = len(body)

    def _finish(self, inbound: Inbound, entry: _Log, sample: dict[str, object]) -> None:
        loop = asyncio.get_running_loop()
        duration = (loop.time() - inbound.started) * 1000 if inbound.started else 0.0
        access_log.info(
            '[%s] "%s %s %s" %d %s route="%s" backend=%s endpoint=%s identity=%s '
            'reason="%s" received=%d sent=%d duration=%.1fms upstream=%s client=%s '
            'authority="%s" request_id=%s grpc_status=%s',
            self.name,
            inbound.method,
            inbound.target,
            inbound.protocol,
            entry.status,
            entry.flags,
            entry.route,
            entry.backend,
            entry.endpoint,
            entry.identity,
            entry.reason,
            inbound.body.received,
            entry.sent,
            duration,
            f"{entry.upstream_ms:.1f}ms" if entry.upstream_ms >= 0 else "-",
            inbound.client[0],
            inbound.authority,
            inbound.extra.get("request_id", "-"),
            entry.grpc_status,
        )
        self.metrics.record(
            Sample(
                status=entry.status,
                protocol="grpc" if entry.grpc else "http",
                flags=entry.flags,
                duration_ms=duration,
                request_bytes=inbound.body.received,
                response_bytes=entry.sent,
                **sample,  # type: ignore[arg-type]
            )
        )


def _grpc_status(headers: Headers | tuple[()]) -> str:
    return next((v for n, v in headers if n == "grpc-status"), "-")


def _split(target: str) -> tuple[str, str]:
    """(path, query) of a request target (origin form, or absolute form from a proxy client).
    Raises ValueError for an absolute form that is not a URL (the caller answers 400)."""
    if target.startswith(("http://", "https://")):
        parts = urlsplit(target)
        return parts.path or "/", parts.query
    path, _, query = target.partition("?")
    return path or "/", query
