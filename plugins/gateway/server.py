"""The gateway process: the listeners its config names, its own ports (readiness, metrics,
admin), config updates and the drain.

Owns the lifecycle. A new config binds the ports it adds and closes those it drops (connections
on a dropped port finish what they are doing); HTTPS certificates change behind each port's
unchanging context. Ready (/healthz/ready 200) once a config arrived and its listeners are bound.
SIGTERM: stop accepting, let requests in flight finish up to the drain deadline, then close.
Invariant: a listener port that cannot be bound is logged and retried (each reload interval),
never fatal; the gateway's own ports are bound at start, and a taken one stops it there.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import logging
import signal
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from meshctl.core.gateway import eastwest, render
from meshctl.core.gateway.config import Endpoint, GatewayConfig
from meshctl.core.gateway.model import Protocol
from meshctl.net.sockets import listener
from meshctl.proxy import responder

from . import http1
from .binding import bind_port
from .certificates import SniContexts, sni_of
from .eastwest import EastWest
from .forward import Forwarder
from .hbone import HboneDialer
from .http2 import PREFACE, Http2Connection
from .identity import MeshIdentity, mesh_identity
from .metrics import RequestMetrics, Source
from .passthrough import Passthrough, StreamLimits
from .settings import GatewaySettings
from .sources import ConfigHolder
from .upstream import Dialer, Pool, Writer, tcp_dialer

log = logging.getLogger(__name__)


async def _no_identity(host: str, port: int) -> tuple[asyncio.StreamReader, Writer]:
    raise OSError(
        "meshed endpoint, and this gateway has no mesh certificate "
        "(set POD_NAMESPACE, SERVICE_ACCOUNT and MESHCTL_CERT_DIR or CA_ADDRESS)"
    )


_FROM_SETTINGS = MeshIdentity.__new__(MeshIdentity)  # "identity not given": mesh_identity's


class Gateway:
    """One process's listeners. Alone it also serves its own ports and owns its identity; as
    a worker (``supervised``) the supervisor does both, feeds ``identity`` and binds the
    listener ports itself, handing their sockets over (``adopt``): a port's accept queue then
    belongs to the supervisor and outlives any one worker."""

    def __init__(
        self,
        settings: GatewaySettings,
        holder: ConfigHolder,
        *,
        identity: MeshIdentity | None = _FROM_SETTINGS,
        supervised: bool = False,
        name: str = "gateway",
    ) -> None:
        self.settings = settings
        # Worker mode: the sockets the supervisor passed, not yet serving (port -> socket).
        self.offered: dict[int, socket.socket] | None = {} if supervised else None
        self.holder = holder
        self.tls = SniContexts()
        self.pool = Pool(idle_timeout=settings.idle_timeout)
        principal = "unknown"
        if settings.pod_namespace and settings.service_account:
            principal = (
                f"spiffe://{settings.trust_domain}/ns/{settings.pod_namespace}"
                f"/sa/{settings.service_account}"
            )
        self.metrics = RequestMetrics(
            Source(
                workload=(settings.gateway or "gateway").rpartition("/")[2],
                namespace=settings.pod_namespace or "unknown",
                principal=principal,
            )
        )
        self.identity = mesh_identity(settings) if identity is _FROM_SETTINGS else identity
        self.hbone = (
            None
            if self.identity is None
            else HboneDialer(identity=self.identity.identity, certs=self.identity.certs)
        )
        self.forwarder = Forwarder(
            lambda: holder.current,
            pool=self.pool,
            metrics=self.metrics,
            dialer_for=self._dialer_for,
            domain="cluster.local",
            name=name,
        )
        self.passthrough = Passthrough(
            lambda: holder.current,
            limits=StreamLimits(
                header_timeout=settings.header_timeout, idle_timeout=settings.idle_timeout
            ),
            dialer_for=self._dialer_for,
            metrics=self.metrics,
            name=name,
        )
        self.eastwest = EastWest(
            lambda: holder.current,
            limits=self.passthrough.limits,
            dialer_for=self._dialer_for,
            metrics=self.metrics,
            name=name,
        )
        self.limits = http1.Limits(
            header_timeout=settings.header_timeout,
            idle_timeout=settings.idle_timeout,
            body_bytes=settings.max_request_body,
        )
        self.servers: dict[int, asyncio.Server] = {}  # listener port (as the table names it)
        self.connections: set[http1.Connection | Http2Connection] = set()
        self.failed_ports: dict[int, str] = {}
        self._binding = asyncio.Lock()
        self.draining = False
        holder.subscribe(self._on_config)

    def _dialer_for(self, endpoint: Endpoint) -> tuple[Dialer, str]:
        if not endpoint.hbone:
            return tcp_dialer, ""
        if self.hbone is None:
            return _no_identity, endpoint.identity
        return self.hbone.for_peer(endpoint.identity), endpoint.identity

    # --- config ----------------------------------------------------------------------------

    def _on_config(self, config: GatewayConfig) -> None:
        self.tls.update(config)
        asyncio.get_running_loop().create_task(self._bind(config))

    async def _bind(self, config: GatewayConfig) -> None:
        async with self._binding:  # one at a time: a port is checked, then served after an await
            await self._bind_now(config)

    async def _bind_now(self, config: GatewayConfig) -> None:
        wanted = {p.port: p.protocol for p in config.table.ports}
        for port in list(self.servers):
            if port not in wanted:
                self.servers.pop(port).close()
                log.info("listener port %d closed (no longer in the config)", port)
        for port, protocol in wanted.items():
            if port in self.servers or self.draining:
                continue
            actual = port + self.settings.port_offset
            if self.offered is not None and port not in self.offered:
                # Its socket is on the way (the two channels are read independently).
                self.failed_ports[port] = "waiting for the supervisor's socket"
                continue
            sock = bind_port(
                port, actual, self.failed_ports, functools.partial(self._socket, port, actual)
            )
            if sock is None:
                continue
            https = protocol is Protocol.HTTPS
            if protocol in (Protocol.TLS, Protocol.TCP):  # streams: TLS is the client's own
                handler = functools.partial(self._stream, port=port, tls=protocol is Protocol.TLS)
                self.servers[port] = await asyncio.start_server(handler, sock=sock, limit=64 * 1024)
                log.info("listening on %s:%d (%s)", self.settings.bind_address, actual, protocol)
                continue
            self.servers[port] = await asyncio.start_server(
                functools.partial(self._client, port=port, https=https),
                sock=sock,
                ssl=self.tls.server_context(port) if https else None,
                ssl_handshake_timeout=self.settings.header_timeout if https else None,
                limit=64 * 1024,
            )
            log.info("listening on %s:%d (%s)", self.settings.bind_address, actual, protocol)

    async def _stream(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, port: int, tls: bool
    ) -> None:
        """A TLS or TCP listener's connection; an east-west port's (Istio's 15443: the SNI names
        the Service) by the config current now, so a reload that turns one on or off needs no
        new socket."""
        config = self.holder.current
        if tls and config is not None and eastwest.auto_passthrough_port(config.table, port):
            await self.eastwest(reader, writer, port=port)
        else:
            await self.passthrough(reader, writer, port=port, tls=tls)

    def _socket(self, port: int, actual: int) -> socket.socket:
        if self.offered is None:
            return listener(self.settings.bind_address, actual, what=f"listener {port}")
        return self.offered.pop(port)

    def adopt(self, sockets: dict[int, socket.socket]) -> None:
        """Worker mode: the supervisor's current listener sockets (port -> socket). A port left
        out stops being served here; a port already served keeps its server (the copy closes)."""
        if self.offered is None:
            raise TypeError("adopt() is for a supervised gateway")
        for port in list(self.servers):
            if port not in sockets:
                self.servers.pop(port).close()
        for port in list(self.offered):
            if port not in sockets:
                self.offered.pop(port).close()
        for port, sock in sockets.items():
            if port in self.servers:
                sock.close()
                continue
            old = self.offered.get(port)
            if old is not None:
                old.close()
            self.offered[port] = sock
        config = self.holder.current
        if config is not None:
            asyncio.get_running_loop().create_task(self._bind(config))

    async def _client(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        port: int,
        https: bool,
    ) -> None:
        ssl_object = writer.get_extra_info("ssl_object")
        sock = writer.get_extra_info("socket")
        if sock is not None:
            with contextlib.suppress(OSError):
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        common: dict[str, Any] = {
            "handler": self.forwarder,
            "port": port,
            "scheme": "https" if https else "http",
            "sni": sni_of(ssl_object) if ssl_object is not None else "",
            "limits": self.limits,
        }
        conn: http1.Connection | Http2Connection
        if ssl_object is not None and ssl_object.selected_alpn_protocol() == "h2":
            conn = Http2Connection(reader, writer, **common)
        elif ssl_object is None:
            initial = await self._first_bytes(reader)
            if initial is None:
                writer.close()
                return
            if initial.startswith(PREFACE):  # h2c with prior knowledge (RFC 9113 3.3)
                conn = Http2Connection(reader, writer, initial=initial, **common)
            else:
                conn = http1.Connection(reader, writer, initial=initial, **common)
        else:
            conn = http1.Connection(reader, writer, **common)
        self.connections.add(conn)
        try:
            await conn.run()
        finally:
            self.connections.discard(conn)

    async def _first_bytes(self, reader: asyncio.StreamReader) -> bytes | None:
        """Enough of a plaintext connection's first bytes to tell the h2c preface from
        HTTP/1.1 (None: nothing came within the header timeout, or the client left)."""
        data = b""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.settings.header_timeout
        while len(data) < len(PREFACE) and PREFACE.startswith(data[: len(PREFACE)]):
            try:
                more = await asyncio.wait_for(reader.read(65536), max(deadline - loop.time(), 0))
            except (TimeoutError, ConnectionError, OSError):
                return data or None
            if not more:
                return data or None
            data += more
        return data

    @property
    def ready(self) -> bool:
        config = self.holder.current
        if config is None or self.draining:
            return False
        return all(p.port in self.servers for p in config.table.ports)

    # --- own ports ---------------------------------------------------------------------------

    async def _readiness(
        self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str]
    ) -> responder.Response:
        if path == "/healthz/ready":
            if self.ready:
                return 200, "text/plain", b"ready\n"
            why = "draining" if self.draining else "no config yet"
            if self.holder.current is not None and not self.draining:
                why = "listeners not bound: " + ", ".join(
                    f"{p}: {e}" for p, e in sorted(self.failed_ports.items())
                )
            return 503, "text/plain", f"not ready: {why}\n".encode()
        if path in ("/stats/prometheus", "/metrics"):
            return 200, "text/plain; version=0.0.4", self.metrics.render()
        return 404, "text/plain", b"not found\n"

    async def _admin(
        self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str]
    ) -> responder.Response:
        if path == "/config_dump":
            return 200, "application/json", json.dumps(self.dump(), indent=2).encode() + b"\n"
        if path == "/ready":
            return await self._readiness(method, "/healthz/ready", query, headers)
        return await self._readiness(method, path, query, headers)

    def dump(self) -> dict[str, Any]:
        out = config_dump(self.settings, self.holder.current)
        if self.holder.current is not None:
            out["listening"] = sorted(self.servers)
            out["upstreamConnectionsOpened"] = self.pool.opened
        return out

    # --- run and drain -------------------------------------------------------------------------

    async def run(self, sources: list[Callable[[], Coroutine[Any, Any, None]]]) -> None:
        """Serve until SIGTERM, then drain. ``sources`` are started once the own ports are
        bound (factories, so a port in use leaves no coroutine that never ran)."""
        own = []
        offset = self.settings.port_offset
        for port, handler, host in (
            (self.settings.readiness_port, self._readiness, self.settings.bind_address),
            (self.settings.metrics_port, self._readiness, self.settings.bind_address),
            (self.settings.admin_port, self._admin, "127.0.0.1"),
        ):
            sock = listener(host, port + offset, what=f"port {port}")
            own.append(await responder.serve(sock, handler))
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        # SIGTERM (Kubernetes) drains; Ctrl-C stays an interrupt (exit 130, docs/cli.md).
        loop.add_signal_handler(signal.SIGTERM, stop.set)
        tasks = [asyncio.create_task(start()) for start in sources]
        tasks.append(asyncio.create_task(self.retry_binds()))
        if self.identity is not None:
            tasks.append(asyncio.create_task(self.identity.run()))
        log.info("gateway %s started", self.settings.gateway or "(from the files)")
        await stop.wait()
        await self.drain()
        for task in tasks:
            task.cancel()
        for server in own:
            server.close()

    async def retry_binds(self) -> None:
        """A listener port that could not be bound is tried again (until then: not ready)."""
        while True:
            await asyncio.sleep(self.settings.reload_interval)
            if self.failed_ports and self.holder.current is not None and not self.draining:
                await self._bind(self.holder.current)

    async def drain(self) -> None:
        deadline = self.settings.drain_deadline
        log.info(
            "draining: %d connection(s), %d request(s) in flight",
            len(self.connections),
            self.forwarder.in_flight,
        )
        self.draining = True
        for server in self.servers.values():
            server.close()  # stop accepting
        for conn in list(self.connections):
            conn.drain()
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        streams = (self.passthrough, self.eastwest)
        while (self.forwarder.in_flight or any(s.open for s in streams)) and loop.time() < end:
            await asyncio.sleep(0.05)
        if self.forwarder.in_flight:
            log.warning("drain deadline: %d request(s) cut off", self.forwarder.in_flight)
        for stream in streams:
            if stream.open:
                log.warning("drain deadline: %d connection(s) cut off", len(stream.open))
                stream.drain()
        for conn in list(self.connections):
            conn.writer.transport.abort()
        self.pool.close()
        self.forwarder.h2_pool.close()


def config_dump(settings: GatewaySettings, config: GatewayConfig | None) -> dict[str, Any]:
    """``/config_dump``'s view of ``config`` (the same with one process or a supervisor)."""
    if config is None:
        return {"gateway": settings.gateway, "version": "", "routes": None}
    return {
        "gateway": config.name,
        "version": config.version,
        "portOffset": settings.port_offset,
        "routes": render.table_data(config.table),
        "certificates": sorted(str(ref) for ref in config.certificates),
        "endpoints": {
            str(key): [f"{e.address}:{e.port}" for e in found]
            for key, found in sorted(config.endpoints.items(), key=lambda kv: str(kv[0]))
        },
    }
