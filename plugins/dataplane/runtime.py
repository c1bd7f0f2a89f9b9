"""The data plane's live state and its life: channel messages in, listeners served, drain out.

Owns what every traffic path reads (the workload store snapshot, the TLS contexts of the current
certificate generation, our identity, the pool, telemetry) and the order of life: hello ->
config (listeners start) -> certificates + workloads (ready) -> updates -> drain -> drained.
Invariants: updates swap whole snapshots (a connection in flight keeps what it started with);
readiness is true only with config, certificates and workloads applied and no drain begun; the
drain stops accepting first, then waits for open flows up to its deadline, then aborts the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Callable, Coroutine
from typing import Any

from meshctl.core import channel
from meshctl.core.addresses import ip as parse_ip
from meshctl.core.appprobes import parse_probers, parse_scrape
from meshctl.core.hbone import TunnelSettings
from meshctl.core.hbone.headers import format_baggage
from meshctl.core.identity import SpiffeId, parse_workload_ref
from meshctl.core.workloads import LocalConfigError, Store, Workload, parse_local_config

from . import admin, tls
from .app_probes import AppProbes
from .inbound import Inbound
from .inbound_plaintext import InboundPlaintext
from .metrics import PUBLISH_INTERVAL, Telemetry
from .outbound import Outbound
from .pool import Pool
from .relay import Accepted, accept_loop

log = logging.getLogger(__name__)

PROXY_ROLES = ("outbound", "inbound", "inbound_plaintext")


class Runtime:
    """One data-plane process."""

    def __init__(self, channel_sock: socket.socket) -> None:
        self._channel_sock = channel_sock
        self.telemetry = Telemetry()
        self.store = Store.build()
        self.config = channel.ProxyConfig(
            mode="sidecar", workload="default/unknown/default", listeners={}
        )
        self.identity = SpiffeId("cluster.local", "default", "default")
        self.me: Workload | None = None
        self.contexts: tls.TlsContexts | None = None
        self.certs: channel.Certs | None = None
        self.workloads_generation = -1
        self.tunnel_settings = TunnelSettings()
        self.own_ports: frozenset[int] = frozenset()
        self.baggage = ""
        self.draining = False
        self.ready = False
        self.inbound = Inbound(self)
        self.pool = Pool(
            contexts=self._current_contexts,
            settings=self.tunnel_settings,
            max_streams=100,
            idle_timeout=300,
            connect_timeout=10,
            handshake_timeout=5,
            new_socket=self.upstream_socket,
        )
        self.app_probes = AppProbes({}, pod_ip="", new_socket=self.upstream_socket)
        self._tasks: set[asyncio.Task[Any]] = set()
        self._listeners: list[socket.socket] = []
        self._accepting: list[asyncio.Task[None]] = []
        self._paths: list[tuple[socket.socket, Callable[[Accepted], None]]] = []
        self._http: list[asyncio.Server] = []
        self._configured = False
        self._writer: asyncio.StreamWriter | None = None
        self._quit = asyncio.Event()
        self._drain_deadline: float | None = None
        self._gathers: dict[int, asyncio.Future[channel.Gathered]] = {}
        self._gather_seq = 0

    # -- used by the traffic paths -----------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._task_done)

    def _task_done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("connection task failed", exc_info=task.exception())

    def upstream_socket(self, ip: str, *, inbound: bool = False) -> socket.socket:
        """A non-blocking TCP socket for a connection we originate (marked if configured).

        ``inbound``: the connection delivers to our own workload. It leaves from the inbound
        passthrough address (127.0.0.6 / ::6), which the sidecar capture rules RETURN first:
        otherwise a proxy running as the exempt uid reaching its pod IP over ``lo`` matches the
        hairpin rule and is redirected to :15006 again, a loop (istio-iptables does the same
        for Envoy's inbound).
        """
        family = socket.AF_INET6 if ":" in ip else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setblocking(False)
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            if self.config.mark:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, self.config.mark)
            if inbound and not parse_ip(ip).is_loopback:
                _bind_passthrough(sock, family)
        except OSError:
            sock.close()
            raise
        return sock

    def is_local_ip(self, ip: str) -> bool:
        """Whether ``ip`` is an address of this network namespace (binding to it succeeds)."""
        family = socket.AF_INET6 if parse_ip(ip).version == 6 else socket.AF_INET
        with socket.socket(family, socket.SOCK_STREAM) as probe:
            try:
                probe.bind((ip, 0))
            except OSError:
                return False
        return True

    def active_flows(self) -> int:
        return self.telemetry.active

    def not_ready_reason(self) -> str:
        if self.draining:
            return "draining"
        missing = [
            name
            for name, ok in (
                ("config", self._configured),
                ("certificates", self.contexts is not None),
                ("workloads", self.workloads_generation >= 0),
            )
            if not ok
        ]
        return "waiting for " + ", ".join(missing) if missing else "starting"

    def certificate_summary(self) -> list[dict[str, Any]]:
        if self.certs is None:
            return []
        return admin.certificate_summary(self.certs, str(self.identity))

    def connection_report(self) -> dict[str, Any]:
        """This worker's connections, as ``/config_dump`` shows them (and a ``Report`` carries)."""
        return {
            "inbound_tunnels": len(self.inbound.tunnels),
            "pooled": self.pool.connections,
            "open": self.active_flows(),
            "flows": [flow.describe() for flow in self.telemetry.flows],
        }

    async def gather_reports(self, timeout: float = 2.0) -> channel.Gathered:
        """The other workers' reports, gathered by the supervisor (none with one worker).

        Waits at most ``timeout`` (the supervisor answers within its own, shorter, deadline);
        a lost answer lists every other worker as missing rather than failing the request.
        """
        others = tuple(i for i in range(self.config.workers) if i != self.config.worker)
        if not others or self._writer is None or self._writer.is_closing():
            return channel.Gathered(request=0, missing=others)
        self._gather_seq += 1
        request = self._gather_seq
        waiter: asyncio.Future[channel.Gathered] = asyncio.get_running_loop().create_future()
        self._gathers[request] = waiter
        self._send(channel.Gather(request=request))
        try:
            async with asyncio.timeout(timeout):
                return await waiter
        except TimeoutError:
            return channel.Gathered(request=request, missing=others)
        finally:
            self._gathers.pop(request, None)

    def request_quit(self) -> None:
        """``/quitquitquit``: drain and exit, and tell the supervisor not to restart us."""
        self._quit.set()

    def _current_contexts(self) -> tls.TlsContexts:
        if self.contexts is None:
            raise ConnectionError("no workload certificate yet")
        return self.contexts

    # -- life ----------------------------------------------------------------------------------

    async def run(self) -> int:
        loop = asyncio.get_running_loop()
        reader, self._writer = await asyncio.open_connection(sock=self._channel_sock)
        self._send(channel.Hello(pid=_pid()))
        loop.add_signal_handler(signal.SIGTERM, self._quit.set)
        with contextlib.suppress(NotImplementedError):
            loop.add_signal_handler(signal.SIGINT, lambda: None)  # the supervisor decides
        decoder = channel.Decoder()
        quit_wait = asyncio.ensure_future(self._quit.wait())
        publisher = asyncio.ensure_future(self._publish_metrics())
        deadline: float | None = None
        try:
            while True:
                read = asyncio.ensure_future(reader.read(256 * 1024))
                done, _ = await asyncio.wait({read, quit_wait}, return_when=asyncio.FIRST_COMPLETED)
                if quit_wait in done:
                    read.cancel()
                    break
                data = read.result()
                if not data:
                    log.warning("supervisor went away; draining")
                    deadline = 1.0
                    break
                deadline = await self._apply_all(decoder.feed(data))
                if deadline is not None:
                    break
        except channel.ChannelError as exc:
            log.error("supervisor channel broken: %s", exc)  # noqa: TRY400 (no traceback needed)
            deadline = 1.0
        remaining = await self.drain(self.config.drain_deadline if deadline is None else deadline)
        publisher.cancel()
        self.telemetry.publish_open()
        self._send(channel.Drained(remaining=remaining))
        if self._writer is not None:
            with contextlib.suppress(ConnectionError, TimeoutError):
                await asyncio.wait_for(self._writer.drain(), 1)
        return 0

    async def _publish_metrics(self) -> None:
        """Open flows' bytes reach the shared counters at least every ``PUBLISH_INTERVAL``
        (every worker's, not only those of the worker that serves /metrics)."""
        while True:
            await asyncio.sleep(PUBLISH_INTERVAL)
            self.telemetry.publish_open()

    async def _apply_all(self, messages: list[channel.Message]) -> float | None:
        """Apply ``messages`` in order; a drain stops there and returns its deadline."""
        for message in messages:
            if isinstance(message, channel.Drain):
                return message.deadline
            await self._apply(message)
        return None

    async def _apply(self, message: channel.Message) -> None:
        if isinstance(message, channel.ReportRequest):
            report = channel.Report(
                request=message.request,
                worker=self.config.worker,
                pid=_pid(),
                connections=self.connection_report(),
            )
            self._send(report)
            return
        if isinstance(message, channel.Gathered):
            waiter = self._gathers.get(message.request)
            if waiter is not None and not waiter.done():
                waiter.set_result(message)
            return
        if isinstance(message, channel.ProxyConfig):
            if self._configured:
                log.warning("ignoring a second config message")
                return
            await self._configure(message)
        elif isinstance(message, channel.Certs):
            self._apply_certs(message)
        elif isinstance(message, channel.Workloads):
            self._apply_workloads(message)
        else:
            log.warning("unexpected %s message from the supervisor", message.TYPE)
            return
        self.ready = (
            self._configured and self.contexts is not None and self.workloads_generation >= 0
        )
        if self.ready and not self._accepting and not self.draining:
            # Accept only once every connection can be served: the listeners are shared with
            # the other workers, which take the connections while this one starts.
            for sock, path in self._paths:
                self._accepting.append(asyncio.ensure_future(accept_loop(sock, path)))
        self._send(
            channel.Status(
                ready=self.ready,
                certs_generation=self.contexts.generation if self.contexts else -1,
                workloads_generation=self.workloads_generation,
            )
        )

    async def _configure(self, cfg: channel.ProxyConfig) -> None:
        self.config = cfg
        ns, _name, sa = parse_workload_ref(cfg.workload)
        self.identity = SpiffeId(cfg.trust_domain, ns, sa)
        self.tunnel_settings = TunnelSettings(
            stream_window=cfg.stream_window,
            connection_window=cfg.connection_window,
            max_frame_size=cfg.max_frame_size,
            max_concurrent_streams=cfg.pool_max_streams,
        )
        self.pool = Pool(
            contexts=self._current_contexts,
            settings=self.tunnel_settings,
            max_streams=cfg.pool_max_streams,
            idle_timeout=cfg.pool_idle_timeout,
            connect_timeout=cfg.connect_timeout,
            handshake_timeout=cfg.handshake_timeout,
            new_socket=self.upstream_socket,
        )
        probers, scrape = {}, None
        try:
            probers, scrape = parse_probers(cfg.app_probers), parse_scrape(cfg.app_metrics)
        except ValueError as exc:  # the supervisor validated it: only a version skew gets here
            log.error("app probers refused: %s", exc)  # noqa: TRY400 (no traceback needed)
        self.app_probes = AppProbes(
            probers, pod_ip=cfg.pod_ip, new_socket=self.upstream_socket, app_metrics=scrape
        )
        ports: set[int] = set()
        paths = {
            "outbound": Outbound(self).accepted,
            "inbound": self.inbound.accepted,
            "inbound_plaintext": InboundPlaintext(self).accepted,
        }
        endpoints = admin.Endpoints(self)
        http = {
            "readiness": endpoints.readiness,
            "metrics": endpoints.metrics,
            "admin": endpoints.admin,
        }
        for role, fd in cfg.listeners.items():
            sock = socket.socket(fileno=fd)
            sock.setblocking(False)
            ports.add(sock.getsockname()[1])
            base = role.removesuffix("6")
            if base in paths:
                self._listeners.append(sock)
                self._paths.append((sock, paths[base]))
            elif base in http:
                self._http.append(await admin.serve(sock, http[base]))
            else:
                log.warning("unknown listener role %r", role)
        self.own_ports = frozenset(ports)
        self.telemetry.multiprocess_dir = cfg.metrics_dir
        self._configured = True
        self._refresh_me()

    def _apply_certs(self, certs: channel.Certs) -> None:
        try:
            self.contexts = tls.build(certs)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            log.error("certificates refused, keeping the previous ones: %s", exc)  # noqa: TRY400
            self._send(channel.Status(ready=self.ready, problem=f"certificates refused: {exc}"))
            return
        self.certs = certs
        log.info("certificates generation %d in use for new connections", certs.generation)

    def _apply_workloads(self, message: channel.Workloads) -> None:
        try:
            self.store = parse_local_config(message.document)
        except LocalConfigError as exc:
            log.error("workload update refused, keeping the previous one: %s", exc)  # noqa: TRY400
            return
        self.workloads_generation = message.generation
        self._refresh_me()

    def _refresh_me(self) -> None:
        ns, name, _ = parse_workload_ref(self.config.workload)
        self.me = self.store.find_workload(ns, name)
        me = self.me
        self.baggage = format_baggage(
            cluster=me.cluster_id if me else self.config.cluster_id,
            namespace=ns,
            workload_type=me.workload_type if me else "deployment",
            workload_name=(me.workload_name or me.name) if me else name,
            service=(me.canonical_name or me.name) if me else name,
            revision=(me.canonical_revision or "latest") if me else "latest",
        )

    async def drain(self, deadline: float) -> int:
        """Stop accepting, let open flows finish for up to ``deadline`` s, abort the rest."""
        self.draining = True
        self.ready = False
        for task in self._accepting:
            task.cancel()
        for sock in self._listeners:
            sock.close()
        for tunnel in list(self.inbound.tunnels):
            tunnel.goaway()
        self.pool.drain()
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        while self.telemetry.active > 0 and loop.time() < end:
            await asyncio.sleep(0.05)
        remaining = self.telemetry.active
        if remaining:
            log.warning("drain deadline reached with %d connections open; closing them", remaining)
        for tunnel in list(self.inbound.tunnels):
            tunnel.close()
        for task in list(self._tasks):
            task.cancel()
        for server in self._http:
            server.close()
        return remaining

    def _send(self, message: channel.Message) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(channel.encode(message))


INBOUND_PASSTHROUGH_V4 = "127.0.0.6"
INBOUND_PASSTHROUGH_V6 = "::6"
_IPV6_FREEBIND = 78  # linux/in6.h; ::6 is not an address of lo, so the bind needs freebind


def _bind_passthrough(sock: socket.socket, family: int) -> None:
    if family == socket.AF_INET:
        sock.bind((INBOUND_PASSTHROUGH_V4, 0))  # all of 127/8 is local: no setup needed
        return
    try:
        sock.setsockopt(socket.IPPROTO_IPV6, _IPV6_FREEBIND, 1)
        sock.bind((INBOUND_PASSTHROUGH_V6, 0))
    except OSError as exc:
        # Not fatal: without ::6 the connection works wherever no hairpin rule applies (a gid
        # or mark exemption); only a uid-exempt proxy would loop, and the log says why.
        log.debug("cannot bind %s for inbound passthrough: %s", INBOUND_PASSTHROUGH_V6, exc)


def _pid() -> int:
    import os

    return os.getpid()
