"""``meshctl gateway run --workers N`` (N > 1): the supervisor of N gateway worker processes.

Owns what is one per gateway: the config source (``-f`` files or xDS), the mesh identity (and
its renewal), the own ports (readiness 15021, metrics 15020, admin 15000) and the workers' life
through ``meshctl.process.Supervisor`` (each restarted with backoff when it dies; SIGTERM drains
them all). Every worker gets every ``GatewayConfig`` (``meshctl.gateway_wire`` bytes) and
certificate over its channel, the current ones first when it starts.

Listeners: the supervisor binds every listener port of the current config itself and hands the
sockets to every worker over the descriptor channel (``GatewayListeners``, SCM_RIGHTS), again
whenever the set of ports changes and in full to a worker that starts. One accept queue per
port, owned here: whichever worker is free accepts, and a worker that dies loses only the
connections it had accepted; those still queued go to the others or to its replacement
(SO_REUSEPORT, one queue per worker, would reset them). A port that cannot be bound is tried
again every reload interval and keeps the gateway not ready, named in the readiness answer.

Invariants: ready only when every worker said ready for the current config (and not draining);
the supervisor's listener copies close when the drain begins, so the kernel refuses new
connections while the workers finish theirs;
metrics are the sum over the workers (prometheus-client's multiprocess mode in this run's folder
of ``meshctl.rundir``, removed at exit or by the next start after a kill; a dead worker's
counters stay counted); ``/config_dump`` is the
supervisor's config plus the workers' pids.
"""

from __future__ import annotations

import asyncio
import base64
import functools
import json
import logging
import socket
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

from meshctl import gateway_wire, rundir
from meshctl.core.gateway.config import GatewayConfig
from meshctl.core.wire import channel
from meshctl.net.sockets import listener
from meshctl.process import Feed, PodFeed, Supervisor, self_command
from meshctl.proxy import responder

from .binding import bind_port
from .identity import MeshIdentity, mesh_identity
from .server import config_dump
from .settings import GatewaySettings
from .sources import ConfigHolder, FileSource
from .worker import SETTINGS_ENV, settings_text

log = logging.getLogger(__name__)

Source = Callable[[ConfigHolder], Coroutine[Any, Any, None]]


def update(config: GatewayConfig) -> channel.GatewayUpdate:
    data = base64.b64encode(gateway_wire.encode(config)).decode()
    return channel.GatewayUpdate(version=config.version, config=data)


class _GatewayFeed(Feed):
    """The current config and certificates for a new worker; renewed certificates after."""

    def __init__(self, holder: ConfigHolder, identity: MeshIdentity | None) -> None:
        self.holder = holder
        self.identity = identity
        self._sent: channel.Certs | None = None

    def current(self) -> list[channel.Message]:
        out: list[channel.Message] = []
        certs = self.identity.certs() if self.identity is not None else None
        if certs is not None:
            out.append(certs)
        if self.holder.current is not None:
            out.append(update(self.holder.current))
        return out

    def changes(self) -> list[channel.Message]:
        certs = self.identity.certs() if self.identity is not None else None
        if certs is None or certs is self._sent:
            return []
        self._sent = certs
        return [certs]

    async def run(self) -> None:
        if self.identity is not None:
            await self.identity.run()


class _Listeners(PodFeed):
    """The listener sockets of the current config's ports, bound here (port -> socket)."""

    def __init__(self, settings: GatewaySettings) -> None:
        self.settings = settings
        self.sockets: dict[int, socket.socket] = {}
        self.failed: dict[int, str] = {}
        self.closed = False

    def sync(self, ports: set[int]) -> bool:
        """Bind what ``ports`` adds, close what it drops; whether the set changed."""
        if self.closed:
            return False
        changed = False
        for port in list(self.sockets):
            if port not in ports:
                self.sockets.pop(port).close()
                log.info("listener port %d closed (no longer in the config)", port)
                changed = True
        for port in list(self.failed):
            if port not in ports:
                del self.failed[port]
        s = self.settings
        for port in sorted(ports - set(self.sockets)):
            actual = port + s.port_offset
            sock = bind_port(
                port,
                actual,
                self.failed,
                functools.partial(listener, s.bind_address, actual, what=f"listener {port}"),
            )
            if sock is None:
                continue
            self.sockets[port] = sock
            log.info("listening on %s:%d", s.bind_address, actual)
            changed = True
        return changed

    def message(self) -> tuple[channel.Message, tuple[int, ...]]:
        ports = tuple(sorted(self.sockets))
        fds = tuple(self.sockets[p].fileno() for p in ports)
        return channel.GatewayListeners(ports=ports), fds

    def current(self) -> list[tuple[channel.Message, tuple[int, ...]]]:
        return [] if self.closed else [self.message()]

    def close(self) -> None:
        """The drain: the kernel refuses new connections once the workers close theirs too."""
        self.closed = True
        for sock in self.sockets.values():
            sock.close()
        self.sockets.clear()


class GatewaySupervisor:
    def __init__(
        self, settings: GatewaySettings, workers: int, log_args: tuple[str, ...], metrics_dir: str
    ) -> None:
        self.settings = settings
        self.workers = workers
        self.metrics_dir = metrics_dir
        self.holder = ConfigHolder()
        self.listeners = _Listeners(settings)
        self.identity = mesh_identity(settings)
        workload = str(self.identity.identity) if self.identity is not None else ""

        def argv(fd: int) -> list[str]:
            return self_command(*log_args, "gateway", "run", "--channel-fd", str(fd))

        def proxy_config(index: int, fds: dict[str, int]) -> channel.ProxyConfig:
            return channel.ProxyConfig(
                mode="gateway",
                workload=workload,
                listeners=fds,
                trust_domain=settings.trust_domain,
                drain_deadline=settings.drain_deadline,
                worker=index,
                workers=workers,
                metrics_dir=metrics_dir,
            )

        self.supervisor = Supervisor(
            argv=argv,
            config=proxy_config,
            listeners={},
            feed=_GatewayFeed(self.holder, self.identity),
            drain_deadline=settings.drain_deadline,
            workers=workers,
            extra_env={
                "PROMETHEUS_MULTIPROC_DIR": metrics_dir,
                SETTINGS_ENV: settings_text(settings),
            },
            on_exit=self._worker_exited,
            poll_interval=settings.reload_interval,
            ready_line=("gateway", settings.gateway or "from the files"),
            pods=self.listeners,
            on_drain=self.listeners.close,
        )
        self.holder.subscribe(self._on_config)

    def _on_config(self, config: GatewayConfig) -> None:
        self.supervisor.broadcast(update(config))
        self._sync_listeners()

    def _sync_listeners(self) -> None:
        config = self.holder.current
        if config is None:
            return
        if self.listeners.sync({p.port for p in config.table.ports}):
            self.supervisor.send_pod(*self.listeners.message())

    async def _retry_binds(self) -> None:
        """A listener port that could not be bound is tried again (until then: not ready)."""
        while True:
            await asyncio.sleep(self.settings.reload_interval)
            if self.listeners.failed:
                self._sync_listeners()

    def _worker_exited(self, pid: int) -> None:
        from prometheus_client import multiprocess

        # Its live gauges no longer count (prometheus-client leaves this one unannotated).
        multiprocess.mark_process_dead(pid, self.metrics_dir)  # type: ignore[no-untyped-call]

    @property
    def ready(self) -> bool:
        return (
            self.holder.current is not None
            and not self.supervisor.stopping
            and not self.listeners.failed
            and self.supervisor.ready
        )

    def metrics(self) -> bytes:
        from prometheus_client import CollectorRegistry, generate_latest
        from prometheus_client.multiprocess import MultiProcessCollector

        registry = CollectorRegistry()
        MultiProcessCollector(registry, path=self.metrics_dir)  # type: ignore[no-untyped-call]
        return generate_latest(registry)

    async def _own(
        self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str]
    ) -> responder.Response:
        if path in ("/healthz/ready", "/ready"):
            if self.ready:
                return 200, "text/plain", b"ready\n"
            why = "no config yet"
            if self.supervisor.stopping:
                why = "draining"
            elif self.listeners.failed:
                why = "listeners not bound: " + ", ".join(
                    f"{p}: {e}" for p, e in sorted(self.listeners.failed.items())
                )
            elif self.holder.current is not None:
                waiting = set(range(self.workers)) - self.supervisor.ready_workers
                why = "workers not ready (config or listeners): " + ", ".join(
                    str(i) for i in sorted(waiting)
                )
            return 503, "text/plain", f"not ready: {why}\n".encode()
        if path in ("/stats/prometheus", "/metrics"):
            return 200, "text/plain; version=0.0.4", self.metrics()
        return 404, "text/plain", b"not found\n"

    async def _admin(
        self, method: str, path: str, query: dict[str, list[str]], headers: dict[str, str]
    ) -> responder.Response:
        if path == "/config_dump":
            dump = config_dump(self.settings, self.holder.current)
            dump["workers"] = [
                {"index": i, "pid": pid} for i, pid in sorted(self.supervisor.pids().items())
            ]
            return 200, "application/json", json.dumps(dump, indent=2).encode() + b"\n"
        return await self._own(method, path, query, headers)

    async def run(self, follow: Source | None) -> int:
        s = self.settings
        own = []
        for port, handler, host in (
            (s.readiness_port, self._own, s.bind_address),
            (s.metrics_port, self._own, s.bind_address),
            (s.admin_port, self._admin, "127.0.0.1"),
        ):
            sock = listener(host, port + s.port_offset, what=f"port {port}")
            own.append(await responder.serve(sock, handler))
        if follow is not None:
            source = asyncio.create_task(follow(self.holder))
        else:
            files = FileSource(s.config, s.gateway, self.holder, s.trust_domain)
            source = asyncio.create_task(files.run(s.reload_interval))
        retry = asyncio.create_task(self._retry_binds())
        try:
            return await self.supervisor.run()
        finally:
            source.cancel()
            retry.cancel()
            self.listeners.close()
            for server in own:
                server.close()


def supervise(
    settings: GatewaySettings, workers: int, log_args: tuple[str, ...], follow: Source | None
) -> int:
    """Run ``workers`` gateway workers until SIGTERM; the exit code."""
    where = Path(settings.run_dir) if settings.run_dir else rundir.default_run_dir("gateway")
    with rundir.metrics_dir(where) as metrics_dir:

        async def main() -> int:
            return await GatewaySupervisor(settings, workers, log_args, str(metrics_dir)).run(
                follow
            )

        return asyncio.run(main())
