"""The data plane's live state and its life: channel messages in, listeners served, drain out.

Owns what is process-wide (the workload store snapshot, the TLS contexts of every certificate
generation per identity, telemetry, the served workloads as ``Local``s) and the order of life:
hello -> config (listeners start) -> certificates + workloads (ready) -> updates -> drain ->
drained. In node mode the pods arrive on the pod channel (``PodAdd`` with the pod's netns and
listeners, ``PodDelete``, ``PodsSynced``). Invariants: updates swap whole snapshots (a connection
in flight keeps what it started with); readiness is true only with config, workloads and (sidecar)
certificates or (node) the agent's snapshot applied, and no drain begun; the drain stops
accepting first, then waits for open flows up to its deadline, then aborts the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import signal
import socket
from collections.abc import Coroutine
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from meshctl import descriptors
from meshctl.core.k8s.appprobes import parse_probers, parse_scrape
from meshctl.core.mesh.localconfig import parse_local_config
from meshctl.core.mesh.records import LocalConfigError
from meshctl.core.mesh.render import update_from_plain
from meshctl.core.mesh.store import Store
from meshctl.core.pki.identity import parse_workload_ref
from meshctl.core.wire import channel, ztunnel_dump
from meshctl.core.wire.hbone import TunnelSettings
from meshctl.proxy import tls
from meshctl.proxy.responder import serve
from meshctl.proxy.telemetry import PUBLISH_INTERVAL, Telemetry
from meshctl.tasks import Tasks

from . import admin
from .app_probes import AppProbes
from .local import PROXY_ROLES, Local

if TYPE_CHECKING:
    from meshctl.core.wire.dump import CertificateSummary, Connections, DiscoveryFacts, PodState

log = logging.getLogger(__name__)

__all__ = ["PROXY_ROLES", "Runtime"]


class Runtime:
    """One data-plane process."""

    def __init__(self, channel_sock: socket.socket) -> None:
        self._channel_sock = channel_sock
        self.telemetry = Telemetry()
        self.store = Store.build()
        self.config = channel.ProxyConfig(mode="sidecar", workload="", listeners={})
        self.locals: dict[str, Local] = {}  # uid ("" in sidecar mode) -> served workload
        # identity ("" = the sidecar's own) -> the latest certificates and their contexts
        self.identities: dict[str, tuple[channel.Certs, tls.TlsContexts]] = {}
        self.cert_source: channel.CertSource | None = None
        self.workloads_generation = -1
        self.xds_state: DiscoveryFacts | None = None  # the supervisor's discovery client's
        self.tunnel_settings = TunnelSettings()
        self.own_ports: frozenset[int] = frozenset()
        self.draining = False
        self.ready = False
        self.pods_synced = False
        self.pods_reason = "waiting for the node agent's snapshot"
        self._inpod: Any = None  # meshctl.net.inpod.InPod in node mode
        # No probers until configured (then the sidecar's own, from ISTIO_KUBE_APP_PROBERS).
        self.app_probes = AppProbes({}, pod_ip="", new_socket=_unconfigured_socket)
        self._tasks = Tasks(log, "connection task")
        self._http: list[asyncio.Server] = []
        self._configured = False
        self._writer: asyncio.StreamWriter | None = None
        self._pods: descriptors.Receiver | None = None
        self._quit = asyncio.Event()
        self._drain_deadline: float | None = None
        self._gathers: dict[int, asyncio.Future[channel.Gathered]] = {}
        self._gather_seq = 0

    @property
    def node_mode(self) -> bool:
        return self.config.mode == "node"

    # -- used by the traffic paths -----------------------------------------------------------

    def spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        self._tasks.spawn(coro)

    def active_flows(self) -> int:
        return self.telemetry.active

    def not_ready_reason(self) -> str:
        if self.draining:
            return "draining"
        missing = [
            name
            for name, ok in (
                ("config", self._configured),
                ("certificates", self.node_mode or "" in self.identities),
                ("workloads", self.workloads_generation >= 0),
                (self.pods_reason, not self.node_mode or self.pods_synced),
            )
            if not ok
        ]
        if "workloads" in missing and self.xds_state:
            waiting = ", ".join(self.xds_state.get("waitingFor", ())) or "its first response"
            missing[missing.index("workloads")] = f"workloads (discovery: waiting for {waiting})"
        return "waiting for " + ", ".join(missing) if missing else "starting"

    def served_identity(self) -> str | None:
        """The sidecar's own workload identity (``/config_dump``'s ``identity``); None in node
        mode, whose pods each have theirs."""
        own = self.locals.get("")
        return None if own is None else str(own.identity)

    def served_listeners(self) -> dict[str, str] | None:
        """The sidecar's own listeners (role -> address, ``/config_dump``'s ``listeners``);
        None in node mode (each pod's are in ``workloadState``)."""
        own = self.locals.get("")
        if own is None:
            return None
        return {role: _addr(sock) for role, sock in sorted(own.listeners.items())}

    def certificate_summary(self) -> list[CertificateSummary]:
        out: list[CertificateSummary] = []
        for key, (certs, _) in sorted(self.identities.items()):
            identity = key or next((str(lo.identity) for lo in self.locals.values()), "")
            source = self.cert_source if not key else None
            out.extend(admin.certificate_summary(certs, identity, source))
        return out

    def certificate_problem(self) -> str | None:
        """Why the workload certificate (sidecar mode) cannot serve (expired), or None."""
        own = self.identities.get("")
        if own is None or not own[0].chain_facts:
            return None
        end = datetime.fromisoformat(str(own[0].chain_facts[0]["expirationTime"]))
        if end > datetime.now(UTC):
            return None
        source = self.cert_source
        why = f"; renewal failing: {source.last_error}" if source and source.last_error else ""
        return f"workload certificate expired at {end.isoformat()}{why}"

    def renewal_warning(self) -> str | None:
        """A certificate still valid whose renewal fails (the CA is down), or None."""
        source = self.cert_source
        if source is None or source.renewing:
            return None
        return f"certificate renewal failing since {source.failing_since}: {source.last_error}"

    def connection_report(self) -> Connections:
        """This worker's connections, as ``/config_dump`` shows them (and a ``Report`` carries)."""
        return {
            "inbound_tunnels": sum(len(lo.inbound.tunnels) for lo in self.locals.values()),
            "pooled": sum(lo.pool.connections for lo in self.locals.values()),
            "open": self.active_flows(),
            "flows": [flow.describe() for flow in self.telemetry.flows],
        }

    def workload_state(self) -> dict[str, PodState]:
        """Node mode's ``workloadState`` (ztunnel's key): every enrolled pod, its netns, its
        listeners and its certificate."""
        out: dict[str, PodState] = {}
        for uid, lo in self.locals.items():
            if not uid:
                continue
            ns, name, sa = lo.ref
            cert = self.identities.get(str(lo.identity))
            out[uid] = {
                "info": {"name": name, "namespace": ns, "serviceAccount": sa},
                "state": lo.state(),
                "netns": lo.netns,
                "listeners": {role: _addr(sock) for role, sock in sorted(lo.listeners.items())},
                "identity": str(lo.identity),
                "certificate": admin.certificate_summary(cert[0], str(lo.identity))[0]
                if cert
                else ztunnel_dump.identity_certs(str(lo.identity), "Unavailable"),
            }
        return out

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

    def _take_note(self, message: channel.Message) -> bool:
        """Messages that change no state readiness depends on; False for any other."""
        if isinstance(message, channel.ReportRequest):
            report = channel.Report(
                request=message.request,
                worker=self.config.worker,
                pid=_pid(),
                connections=self.connection_report(),
            )
            self._send(report)
        elif isinstance(message, channel.Gathered):
            waiter = self._gathers.get(message.request)
            if waiter is not None and not waiter.done():
                waiter.set_result(message)
        elif isinstance(message, channel.CertSource):
            self.cert_source = message
        elif isinstance(message, channel.XdsState):
            self.xds_state = message.state
        else:
            return False
        return True

    async def _apply(self, message: channel.Message) -> None:
        if self._take_note(message):
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
        elif isinstance(message, channel.WorkloadUpdates):
            self._apply_updates(message)
        else:
            log.warning("unexpected %s message from the supervisor", message.TYPE)
            return
        self._update_readiness()

    def _update_readiness(self) -> None:
        served = self._configured and self.workloads_generation >= 0 and not self.draining
        if self.node_mode:
            self.ready = served and self.pods_synced
            accepting = served  # each pod accepts once its certificate is here
        else:
            self.ready = accepting = served and "" in self.identities
        if accepting:
            # Accept only once every connection can be served: the listeners are shared with
            # the other workers, which take the connections while this one starts.
            for lo in self.locals.values():
                lo.maybe_accept()
        own = self.identities.get("")
        self._send(
            channel.Status(
                ready=self.ready,
                certs_generation=own[1].generation if own else -1,
                workloads_generation=self.workloads_generation,
            )
        )

    async def _configure(self, cfg: channel.ProxyConfig) -> None:
        self.config = cfg
        self.tunnel_settings = TunnelSettings(
            stream_window=cfg.stream_window,
            connection_window=cfg.connection_window,
            max_frame_size=cfg.max_frame_size,
            max_concurrent_streams=cfg.pool_max_streams,
        )
        endpoints = admin.Endpoints(self)
        http = {
            "readiness": endpoints.readiness,
            "metrics": endpoints.metrics,
            "admin": endpoints.admin,
        }
        ports: set[int] = set(cfg.pod_ports.values())
        own: Local | None = None
        if not self.node_mode:
            own = Local(self, uid="", ref=parse_workload_ref(cfg.workload))
            self.locals[""] = own
            self.app_probes = _app_probes(cfg, own)
        for role, fd in cfg.listeners.items():
            sock = socket.socket(fileno=fd)
            ports.add(sock.getsockname()[1])
            base = role.removesuffix("6")
            if own is not None and own.attach(role, sock):
                continue
            if base in http:
                sock.setblocking(False)
                self._http.append(await serve(sock, http[base]))
            else:
                log.warning("unknown listener role %r", role)
                sock.close()
        self.own_ports = frozenset(ports)
        self.telemetry.multiprocess_dir = cfg.metrics_dir
        self._configured = True
        if self.node_mode and cfg.pod_channel >= 0:
            from meshctl.net.inpod import InPod

            self._inpod = InPod()
            self._pods = descriptors.Receiver(cfg.pod_channel, self._apply_pod, "pod")

    def _apply_certs(self, certs: channel.Certs) -> None:
        try:
            contexts = tls.build(certs)
        except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
            who = certs.identity or "this workload"
            log.error("certificates for %s refused, keeping the previous ones: %s", who, exc)  # noqa: TRY400
            self._send(channel.Status(ready=self.ready, problem=f"certificates refused: {exc}"))
            return
        self.identities[certs.identity] = (certs, contexts)
        for lo in self.locals.values():
            if not certs.identity or str(lo.identity) == certs.identity:
                lo.use_certs(certs, contexts)
        log.info(
            "certificates generation %d%s in use for new connections",
            certs.generation,
            f" of {certs.identity}" if certs.identity else "",
        )

    def _apply_workloads(self, message: channel.Workloads) -> None:
        try:
            self.store = parse_local_config(message.document)
        except LocalConfigError as exc:
            log.error("workload update refused, keeping the previous one: %s", exc)  # noqa: TRY400
            return
        self.workloads_generation = message.generation
        for lo in self.locals.values():
            lo.refresh(self.store)

    def _apply_updates(self, message: channel.WorkloadUpdates) -> None:
        if self.workloads_generation < 0:
            log.warning("workload updates before any workloads; ignored")
            return
        if message.generation <= self.workloads_generation:
            return  # already in the snapshot this worker started from
        try:
            updates = [update_from_plain(u) for u in message.updates]
            store = self.store.apply(updates)
        except (LocalConfigError, ValueError, KeyError, TypeError) as exc:
            log.error("workload update refused, keeping the previous one: %s", exc)  # noqa: TRY400
            self._send(channel.Status(ready=self.ready, problem=f"workload update refused: {exc}"))
            return
        self.store = store
        self.workloads_generation = message.generation
        for lo in self.locals.values():
            lo.refresh(self.store)

    # -- node mode: pods from the pod channel ----------------------------------------------

    def _apply_pod(self, message: channel.Message, fds: list[int]) -> None:
        if isinstance(message, channel.PodAdd):
            if len(fds) != len(message.roles) or not message.roles or message.roles[0] != "netns":
                raise channel.ChannelError(
                    f"pod {message.uid}: {len(fds)} descriptors for roles {message.roles}"
                )
            self._remove_pod(message.uid)
            lo = Local(
                self,
                uid=message.uid,
                ref=(message.namespace, message.name, message.service_account),
                netns_fd=fds[0],
                netns=message.netns,
                inpod=self._inpod,
            )
            for role, fd in zip(message.roles[1:], fds[1:], strict=True):
                sock = socket.socket(fileno=fd)
                if not lo.attach(role, sock):
                    log.warning("pod %s: unknown listener role %r", message.uid, role)
                    sock.close()
            self.locals[message.uid] = lo
            cert = self.identities.get(str(lo.identity))
            if cert is not None:
                lo.use_certs(*cert)  # accepts if the runtime is ready
            elif self.ready or self._configured:
                lo.maybe_accept()
            log.info("pod %s/%s (%s) served", message.namespace, message.name, message.uid)
        elif isinstance(message, channel.PodDelete):
            descriptors.close_fds(fds)
            if self._remove_pod(message.uid):
                log.info("pod %s no longer served", message.uid)
        elif isinstance(message, channel.PodsSynced):
            descriptors.close_fds(fds)
            self.pods_synced = message.synced
            if message.reason:
                self.pods_reason = message.reason
            self._update_readiness()
        else:  # the receiver closes its descriptors
            raise channel.ChannelError(f"unexpected {message.TYPE} on the pod channel")

    def _remove_pod(self, uid: str) -> bool:
        lo = self.locals.pop(uid, None)
        if lo is None:
            return False
        lo.stop()
        return True

    async def drain(self, deadline: float) -> int:
        """Stop accepting, let open flows finish for up to ``deadline`` s, abort the rest."""
        self.draining = True
        self.ready = False
        if self._pods is not None:
            self._pods.close()
        for lo in self.locals.values():
            lo.stop_accepting()
            for tunnel in list(lo.inbound.tunnels):
                tunnel.goaway()
            lo.pool.drain()
        loop = asyncio.get_running_loop()
        end = loop.time() + deadline
        while self.telemetry.active > 0 and loop.time() < end:
            await asyncio.sleep(0.05)
        remaining = self.telemetry.active
        if remaining:
            log.warning("drain deadline reached with %d connections open; closing them", remaining)
        for lo in self.locals.values():
            for tunnel in list(lo.inbound.tunnels):
                tunnel.close()
        self._tasks.cancel()
        for server in self._http:
            server.close()
        return remaining

    def _send(self, message: channel.Message) -> None:
        if self._writer is not None and not self._writer.is_closing():
            self._writer.write(channel.encode(message))


def _app_probes(cfg: channel.ProxyConfig, own: Local) -> AppProbes:
    """The sidecar's probers of its own pod (the kubelet's probes, rewritten by the injector)."""
    probers, scrape = {}, None
    try:
        probers, scrape = parse_probers(cfg.app_probers), parse_scrape(cfg.app_metrics)
    except ValueError as exc:  # the supervisor validated it: only a version skew gets here
        log.error("app probers refused: %s", exc)  # noqa: TRY400 (no traceback needed)
    return AppProbes(probers, pod_ip=cfg.pod_ip, new_socket=own.upstream_socket, app_metrics=scrape)


def _unconfigured_socket(ip: str, *, inbound: bool = False) -> socket.socket:
    raise OSError(f"no app probes before the proxy is configured ({ip})")


def _addr(sock: socket.socket) -> str:
    try:
        host, port = sock.getsockname()[:2]
    except OSError:
        return "closed"
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _pid() -> int:
    import os

    return os.getpid()
