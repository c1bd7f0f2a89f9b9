"""One connection through a TLS passthrough listener (``protocol: TLS``, ``tls.mode:
Passthrough``: its ClientHello read, never terminated, the connection routed by the hello's SNI
and spliced to an endpoint of the chosen backend with the bytes read replayed) or a TCP listener
(``protocol: TCP``: the port's route, nothing read).

Owns these traffic paths and their outcomes (docs/gateway.md, "TLS passthrough"): a hello not
complete within the header timeout is dropped (slowloris); a refused hello closes the
connection, after a fatal alert when the client spoke TLS records (``meshctl.core.tls.alerts``);
no route for the name, no route on TCP, no backend, no ready endpoint or none answering: the
connection closes without an alert (as Envoy does for a name no filter chain takes, and as the
Gateway API conformance suite requires: a FIN or a reset, not a TLS alert). Invariants: the
bytes the client sent are forwarded unchanged and in order, the hello's first; each direction's
end is passed on as a half-close (the other keeps flowing); a connection quiet both ways for the
idle timeout is closed; one access-log line per connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from meshctl.core.gateway.config import Endpoint, GatewayConfig
from meshctl.core.gateway.matching import (
    Decision,
    Outcome,
    choose_backend,
    passthrough,
    tcp,
    unresolved,
)
from meshctl.core.gateway.model import Backend
from meshctl.core.tls import alerts
from meshctl.core.tls.clienthello import ClientHello, ClientHelloReader, NeedMore, Refused
from meshctl.proxy.telemetry import access_log

from .forward import DialerFor, plain
from .metrics import RequestMetrics, Sample
from .upstream import Writer

log = logging.getLogger(__name__)
_READ = 64 * 1024
_BROKEN = ("DC", "UC", "IT")  # flags of a connection cut off: reset, not closed


@dataclass(slots=True)
class StreamLog:
    protocol: str = "TLS"
    sni: str = "-"
    alpn: str = "-"
    route: str = "-"
    backend: str = "-"
    endpoint: str = "-"
    identity: str = "-"
    reason: str = "-"
    flags: str = "-"
    received: int = 0  # bytes from the client (the hello included)
    sent: int = 0  # bytes to the client
    opened: bool = False  # counted in istio_tcp_connections_opened (the backend answered)
    sample: dict[str, Any] = field(default_factory=dict)  # the metrics' destination labels


@dataclass(frozen=True, slots=True, kw_only=True)
class StreamLimits:
    header_timeout: float = 10.0  # for the whole ClientHello
    idle_timeout: float = 60.0  # no byte either way for this long: closed
    connect_timeout: float = 5.0  # per endpoint tried


class Passthrough:
    """The handler of TLS passthrough and TCP listeners' connections (``__call__`` each)."""

    def __init__(
        self,
        current: Callable[[], GatewayConfig | None],
        *,
        limits: StreamLimits,
        dialer_for: DialerFor = plain,
        metrics: RequestMetrics | None = None,
        domain: str = "cluster.local",
        name: str = "gateway",
    ) -> None:
        self.current = current
        self.metrics = metrics
        self.domain = domain
        self.limits = limits
        self.dialer_for = dialer_for
        self.name = name
        self.open: set[asyncio.StreamWriter] = set()  # client sides, for the drain

    async def __call__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        port: int,
        tls: bool = True,
    ) -> None:
        loop = asyncio.get_running_loop()
        began = loop.time()
        entry = StreamLog(protocol="TLS" if tls else "TCP")
        self.open.add(writer)
        try:
            if tls:
                await self._serve(reader, writer, port, entry)
            else:
                await self._serve_tcp(reader, writer, port, entry)
        except (ConnectionError, OSError) as exc:
            entry.reason, entry.flags = f"client ({exc})", "DC"
        finally:
            self.open.discard(writer)
            if entry.flags in _BROKEN:
                writer.transport.abort()
            else:
                writer.close()
            peer = writer.get_extra_info("peername")
            self._finish(port, entry, (loop.time() - began) * 1000, peer[0] if peer else "-")

    async def _greeting(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, entry: StreamLog
    ) -> tuple[ClientHello, bytearray, GatewayConfig] | None:
        """The client's hello (its SNI and ALPN logged), the bytes read so far and the config
        now; ``None`` once the connection is answered (a refused hello, no config yet)."""
        read = await self._hello(reader, entry)
        if read is None:
            return None
        hello, data = read
        if isinstance(hello, Refused):
            entry.reason, entry.flags = f"{hello.reason} ({hello.detail})", "NR"
            description = alerts.FOR_REFUSAL.get(hello.reason)
            if description is not None:
                await _alert(writer, reader, description, data)
            return None
        entry.sni = hello.server_name or "-"
        entry.alpn = ",".join(p.decode("ascii", "replace") for p in hello.alpn) or "-"
        config = self.current()
        if config is None:
            entry.reason, entry.flags = "no config yet", "NR"
            await _alert(writer, reader, alerts.Description.INTERNAL_ERROR, data)
            return None
        return hello, data, config

    async def _serve(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        port: int,
        entry: StreamLog,
    ) -> None:
        greeting = await self._greeting(reader, writer, entry)
        if greeting is None:
            return
        hello, data, config = greeting
        decision = passthrough(config.table, port, hello.server_name)
        entry.route = decision.entry.label if decision.entry is not None else "-"
        entry.reason = decision.reason
        if decision.outcome is Outcome.NO_ROUTE:
            entry.flags = "NR"  # closed, no alert: the conformance suite wants a FIN or a reset
            return
        await self._forward(config, decision, reader, writer, bytes(data), entry)

    async def _serve_tcp(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        port: int,
        entry: StreamLog,
    ) -> None:
        config = self.current()
        if config is None:
            entry.reason, entry.flags = "no config yet", "NR"
            return
        decision = tcp(config.table, port)
        entry.route = decision.entry.label if decision.entry is not None else "-"
        entry.reason = decision.reason
        await self._forward(config, decision, reader, writer, b"", entry)

    async def _forward(
        self,
        config: GatewayConfig,
        decision: Decision,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        first: bytes,
        entry: StreamLog,
    ) -> None:
        """To a backend of a FORWARD decision, ``first`` (what was read already) ahead."""
        if decision.outcome is not Outcome.FORWARD:
            entry.flags = "NR"
            return
        upstream = await self._upstream(config, decision.backends, entry)
        if upstream is not None:
            up_reader, up_writer = upstream
            entry.reason = decision.reason
            if first:
                up_writer.write(first)  # the hello and whatever followed it, unchanged
            await splice(reader, writer, up_reader, up_writer, self.limits.idle_timeout, entry)

    async def _upstream(
        self, config: GatewayConfig, backends: tuple[Backend, ...], entry: StreamLog
    ) -> tuple[asyncio.StreamReader, Writer] | None:
        """A connection to an endpoint of a backend drawn by weight (None: said in ``entry``)."""
        backend = choose_backend(backends, random.random())  # noqa: S311 (load spread)
        entry.backend = backend.label
        entry.sample.update(
            service_host=f"{backend.name}.{backend.namespace}.svc.{self.domain}",
            service_name=backend.name,
            service_namespace=backend.namespace,
        )
        if not backend.resolved:
            entry.reason, entry.flags = f"no-backend ({unresolved(backend)})", "NR"
            return None
        endpoints = config.endpoints_of(backend)
        if not endpoints:
            entry.reason = f"no-endpoint ({backend.label} has no ready endpoint)"
            entry.flags = "UH"
            return None
        upstream = await self._dial(endpoints, entry)
        if upstream is None:
            entry.reason = f"no-healthy-upstream (every endpoint of {backend.label} refused)"
            entry.flags = "UF"
        elif self.metrics is not None:
            entry.opened = True
            self.metrics.connection_opened(Sample(status=0, protocol="tcp", **entry.sample))
        return upstream

    async def _hello(
        self, reader: asyncio.StreamReader, entry: StreamLog
    ) -> tuple[ClientHello | Refused, bytearray] | None:
        """The hello's answer and every byte read for it (None: timed out or the client left,
        said in ``entry``)."""
        parser = ClientHelloReader()
        data = bytearray()
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.limits.header_timeout
        while True:
            try:
                chunk = await asyncio.wait_for(reader.read(_READ), max(deadline - loop.time(), 0.0))
            except TimeoutError:
                entry.reason = (
                    f"hello-timeout ({len(data)} bytes in {self.limits.header_timeout:g}s)"
                )
                entry.flags, entry.received = "DC", len(data)
                return None
            if not chunk:
                entry.reason = f"client closed before a whole ClientHello ({len(data)} bytes)"
                entry.flags, entry.received = "DC", len(data)
                return None
            data += chunk
            answer = parser.feed(chunk)
            if not isinstance(answer, NeedMore):
                entry.received = len(data)
                return answer, data

    async def _dial(
        self, endpoints: tuple[Endpoint, ...], entry: StreamLog
    ) -> tuple[asyncio.StreamReader, Writer] | None:
        start = random.randrange(len(endpoints))  # noqa: S311 (load spread)
        for i in range(len(endpoints)):
            endpoint = endpoints[(start + i) % len(endpoints)]
            dialer, identity = self.dialer_for(endpoint)
            entry.endpoint = f"{endpoint.address}:{endpoint.port}"
            entry.identity = identity or "-"
            entry.sample.update(workload=endpoint.workload, principal=identity, mtls=bool(identity))
            try:
                return await asyncio.wait_for(
                    dialer(endpoint.address, endpoint.port), self.limits.connect_timeout
                )
            except (TimeoutError, OSError) as exc:
                log.debug("passthrough: %s:%d: %s", endpoint.address, endpoint.port, exc)
                continue
        return None

    def drain(self) -> None:
        """Stop every connection now (the drain deadline passed)."""
        for writer in list(self.open):
            writer.transport.abort()

    def _finish(self, port: int, entry: StreamLog, duration_ms: float, client: str) -> None:
        if self.metrics is not None:
            sample = Sample(status=0, protocol="tcp", flags=entry.flags, **entry.sample)
            if not entry.opened:
                self.metrics.connection_opened(sample)
            self.metrics.connection_closed(sample, received=entry.received, sent=entry.sent)
        access_log.info(
            '[%s] %s :%d sni=%s alpn=%s route="%s" backend=%s endpoint=%s identity=%s '
            'flags=%s reason="%s" received=%d sent=%d duration=%.1fms client=%s',
            self.name,
            entry.protocol,
            port,
            entry.sni,
            entry.alpn,
            entry.route,
            entry.backend,
            entry.endpoint,
            entry.identity,
            entry.flags,
            entry.reason,
            entry.received,
            entry.sent,
            duration_ms,
            client,
        )


async def _alert(
    writer: asyncio.StreamWriter,
    reader: asyncio.StreamReader,
    description: alerts.Description,
    first: bytes | bytearray,
) -> None:
    """A fatal alert, then our end closed gently: the client's unread bytes are read away for a
    moment, so the close is a FIN after the alert and not a reset that could destroy it."""
    writer.write(alerts.fatal(description, alerts.record_version(first)))
    with contextlib.suppress(ConnectionError, OSError, TimeoutError):
        await asyncio.wait_for(writer.drain(), 1.0)
        if writer.can_write_eof():
            writer.write_eof()
        async with asyncio.timeout(1.0):
            while await reader.read(_READ):
                pass


async def splice(
    client_reader: asyncio.StreamReader,
    client_writer: asyncio.StreamWriter,
    up_reader: asyncio.StreamReader,
    up_writer: Writer,
    idle_timeout: float,
    entry: StreamLog,
) -> None:
    """Both directions until both ended (each end passed on as a half-close), one failed (both
    aborted), or neither moved for ``idle_timeout``. Counts land in ``entry``."""
    loop = asyncio.get_running_loop()
    last = [loop.time()]

    async def upward() -> None:
        while chunk := await client_reader.read(_READ):
            last[0] = loop.time()
            entry.received += len(chunk)
            up_writer.write(chunk)
            await up_writer.drain()
        up_writer.write_eof()

    async def downward() -> None:
        while chunk := await up_reader.read(_READ):
            last[0] = loop.time()
            client_writer.write(chunk)
            entry.sent += len(chunk)
            await client_writer.drain()
        if client_writer.can_write_eof():
            client_writer.write_eof()

    tasks = {asyncio.create_task(upward()), asyncio.create_task(downward())}
    pending = set(tasks)
    try:
        while pending:
            wait = max(last[0] + idle_timeout - loop.time(), 0.0)
            done, pending = await asyncio.wait(
                pending, timeout=wait, return_when=asyncio.FIRST_COMPLETED
            )
            failed = [t for t in done if t.exception() is not None]
            if failed:
                entry.reason, entry.flags = f"connection reset ({failed[0].exception()})", "UC"
                break
            if not done and loop.time() - last[0] >= idle_timeout:
                entry.reason, entry.flags = f"idle for {idle_timeout:g}s", "IT"
                break
    finally:
        for task in pending:
            task.cancel()
        for task in pending:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
        if entry.flags == "-":
            up_writer.close()
        else:
            up_writer.abort()
