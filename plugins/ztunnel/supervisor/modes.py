"""What each mode of ``ztunnel run`` supervises: its sources, its pods and the data plane's config.

Owns building a mode's sources from the resolved settings (sidecar: certificates from mounted
files or the mesh CA, workloads from the local config or discovery; node: pods over ZDS, their
certificates from the mesh CA by impersonation or a development CA, workloads likewise) and
running the supervisor over them in the exec'd ``ztunnel-supervisor``. ``ztunnel run`` calls the
same builders (``sidecar_feed``, ``node_sources``) before it binds a port and execs, quietly, so
whatever a user can get wrong is refused there with the CLI's one-line error.
Invariants: one construction per mode, shared by the check and the run; an explicit local config
wins over discovery in both modes; grpc and the X.509 library load only in a mode that uses them
(the CA, discovery, minting), never for a sidecar with mounted files until they change.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING

from meshctl import logs, rundir
from meshctl.core.pki.identity import IdentityError, SpiffeId, is_trust_domain, parse_workload_ref
from meshctl.core.wire import channel
from meshctl.errors import UserError
from meshctl.process import Feed, PodFeed
from meshctl.proxy.file_sources import LocalConfigSource
from meshctl.proxy.workload_feed import WorkloadFeed

from ..settings import ZtunnelSettings
from .handover import DATAPLANE_COMMAND, Handover

if TYPE_CHECKING:
    from meshctl.forkserver import ForkServer
    from meshctl.process import Supervisor
    from meshctl.proxy.ca_client import CaClient
    from meshctl.proxy.identities import Issuer
    from meshctl.proxy.xds_client import XdsConfig

log = logging.getLogger("meshctl_plugins.ztunnel.cli")  # the messages users know from 'run'


def sidecar_identity(settings: ZtunnelSettings) -> tuple[str, SpiffeId]:
    """The workload served (NS/NAME/SA) and its SPIFFE id; a ``UserError`` when malformed."""
    ref = settings.workload_ref()
    try:
        ns, _name, sa = parse_workload_ref(ref)
    except IdentityError as exc:
        raise UserError(str(exc), hint="--workload NAMESPACE/NAME/SERVICE_ACCOUNT") from exc
    return ref, identity_for(settings.trust_domain, ns, sa)


def identity_for(trust_domain: str, namespace: str, service_account: str) -> SpiffeId:
    """The SPIFFE id; a bad trust domain is told about --trust-domain, not --workload."""
    try:
        return SpiffeId(trust_domain, namespace, service_account)
    except IdentityError as exc:
        if not is_trust_domain(trust_domain):
            raise UserError(
                f"--trust-domain: invalid value {trust_domain!r}",
                hint="a trust domain is lower-case letters, digits, '.', '-' and '_', "
                "e.g. cluster.local",
            ) from exc
        raise UserError(str(exc), hint="--workload NAMESPACE/NAME/SERVICE_ACCOUNT") from exc


def mounted_certs(settings: ZtunnelSettings) -> bool:
    """Whether the sidecar's certificates come from ``cert_dir``: mounted files win over a CA
    (as Istio's file-mounted certs), and without a CA they are the only source."""
    from meshctl.proxy.file_sources import has_cert_files

    return has_cert_files(Path(settings.cert_dir)) or not settings.ca_address


def read_mounted_certs(
    settings: ZtunnelSettings, identity: SpiffeId
) -> tuple[channel.Certs, str] | None:
    """The mounted certificates, read and checked, with the files' digest taken before reading
    (a change in between is then still noticed); None when they are not the source."""
    from meshctl.proxy.file_sources import certificate_digest, read_certs

    if not mounted_certs(settings):
        return None
    cert_dir = Path(settings.cert_dir)
    digest = certificate_digest(cert_dir)
    return read_certs(cert_dir, identity, 0), digest


def sidecar_feed(
    settings: ZtunnelSettings,
    identity: SpiffeId,
    *,
    certs: tuple[channel.Certs, str] | None = None,
    quiet: bool = False,
) -> Feed:
    """The sidecar's certificates (files or the CA) and workloads (local config or discovery).

    ``certs``: the mounted certificates as ``ztunnel run`` read and checked them, with the
    files' digest then (they are then not read again). ``quiet``: the check before the exec
    (nothing logged; the supervisor builds it again and logs).
    """
    from meshctl.proxy.file_sources import FileFeed

    local_config = Path(settings.local_config) if settings.local_config else None
    feed: Feed
    if certs is not None or mounted_certs(settings):
        if settings.ca_address and not quiet:
            log.info("certificates from %s (mounted files win over the CA)", settings.cert_dir)
        feed = FileFeed(
            cert_dir=Path(settings.cert_dir),
            local_config=local_config,
            identity=identity,
            certs=certs,
            warn=not quiet,
        )
    else:
        from meshctl.proxy.ca_client import CaFeed  # grpc: only for a proxy with a CA

        ttl = _ttl(settings)
        if not quiet:
            log.info("certificates from the CA at %s", settings.ca_address)
        feed = CaFeed(
            client=_ca_client(settings),
            identity=identity,
            root_file=Path(settings.ca_root),
            ttl_seconds=int(ttl),
            local_config=local_config,
            warn=not quiet,
        )
    # Workloads: one store, fed by the local config (which the certificate feed reads) and, with
    # a control plane, discovery.
    return WorkloadFeed(certs=feed, client_config=_xds_config(settings))


@dataclass(frozen=True, slots=True)
class NodeSources:
    """What the node proxy's sources need before its event loop runs."""

    issuer: Issuer
    ttl: timedelta
    files: LocalConfigSource
    xds: XdsConfig | None  # discovery, unless a local config is given


def node_sources(settings: ZtunnelSettings, *, quiet: bool = False) -> NodeSources:
    """Node mode's certificate issuer, certificate lifetime, local config and discovery."""
    issuer = _issuer(settings)
    files = LocalConfigSource(
        Path(settings.local_config) if settings.local_config else None, warn=not quiet
    )
    return NodeSources(
        issuer=issuer,
        ttl=timedelta(seconds=_ttl(settings)),
        files=files,
        xds=_xds_config(settings),
    )


def _xds_config(settings: ZtunnelSettings) -> XdsConfig | None:
    """Discovery's client settings; None without a control plane or with a local config (an
    explicit file wins: ``ztunnel run`` warns that discovery is not used)."""
    if not settings.xds_address or settings.local_config:
        return None
    from meshctl.proxy.xds_client import build_config  # grpc: only for a proxy with a control plane

    return build_config(settings)


def _ttl(settings: ZtunnelSettings) -> float:
    return settings.secret_ttl  # at least a second (the setting's parser)


def _ca_client(settings: ZtunnelSettings) -> CaClient:
    from meshctl.proxy.ca_client import CaClient
    from meshctl.rpc import CallAuth

    assert settings.ca_address  # noqa: S101 (callers checked)
    # ztunnel's AUTH_TOKEN: a path when such a file exists (read on every call), else the token.
    auth = CallAuth.from_setting(settings.auth_token, cluster_id=settings.cluster_id)
    return CaClient(settings.ca_address, auth=auth, server_name=settings.ca_server_name)


def _issuer(settings: ZtunnelSettings) -> Issuer:
    """Node mode's pod certificates: the mesh CA by impersonation, else a development CA."""
    from meshctl.proxy.identities import CaIssuer, LocalCa

    if settings.ca_address:
        return CaIssuer(_ca_client(settings), root_file=Path(settings.ca_root))
    if settings.ca_dir:
        return LocalCa(Path(settings.ca_dir), settings.trust_domain)
    raise UserError(
        "node mode needs a source of pod certificates",
        hint="give --ca-address HOST:15012 (the mesh CA) or --ca-dir DIR (a development CA "
        "made by 'meshctl ztunnel certs')",
    )


def run_dir(settings: ZtunnelSettings) -> Path:
    """``--run-dir``, else ``$TMPDIR/meshctl-ztunnel-<uid>``."""
    return Path(settings.run_dir) if settings.run_dir else rundir.default_run_dir("ztunnel")


def node_mark(settings: ZtunnelSettings) -> int:
    """The node proxy's SO_MARK: the pods' capture rules exempt Istio's in-pod mark (0x539)."""
    from meshctl.core.capture.settings import AMBIENT_PROXY_MARK

    return settings.mark or AMBIENT_PROXY_MARK


# -- the exec'd supervisor's side --------------------------------------------------------------


def run_sidecar(handover: Handover, fork_server: ForkServer | None = None) -> int:
    """Supervise one workload's data plane until drained; the exit code."""
    settings = handover.settings
    ref, identity = sidecar_identity(settings)
    certs = None if handover.certs is None else (handover.certs, handover.cert_digest)
    feed = sidecar_feed(settings, identity, certs=certs)
    run = _Run(handover, workload=ref, mark=settings.mark, fork_server=fork_server)
    run.ready_detail = f"serving {ref} as {identity} (supervisor pid {os.getpid()})"
    return run.serve(lambda supervisor: supervisor.run(), feed=feed)


def run_node(handover: Handover, fork_server: ForkServer | None = None) -> int:
    """Supervise the node proxy (the node's ambient pods, handed over by ZDS) until drained."""
    from meshctl.proxy.identities import Identities

    from ..listeners import pod_ports
    from ..node import NodeFeed, Pods, ZdsClient

    settings = handover.settings
    sources = node_sources(settings)
    mark = node_mark(settings)
    run = _Run(handover, workload="", mark=mark, fork_server=fork_server)

    async def serve(supervisor: Supervisor) -> int:
        identities = Identities(sources.issuer, ttl=sources.ttl, publish=supervisor.broadcast)
        run.pods = pods = Pods(
            ports=pod_ports(settings),
            mark=mark,
            trust_domain=settings.trust_domain,
            identities=identities,
        )
        # The pods' certificates (broadcast as issued); workloads from the local config and,
        # with a control plane, discovery, into one store.
        run.feed = WorkloadFeed(
            certs=NodeFeed(sources.files, identities), client_config=sources.xds
        )
        pods.send = supervisor.send_pod
        client = ZdsClient(settings.inpod_uds, pods)
        task = asyncio.ensure_future(client.run())
        try:
            return await supervisor.run()
        finally:
            task.cancel()
            identities.close()
            pods.close()

    run.ready_detail = (
        f"node proxy: pods from {settings.inpod_uds}, certificates from {sources.issuer.name} "
        f"(supervisor pid {os.getpid()})"
    )
    return run.serve(serve, feed=None, node=True)


class _Run:
    """What both modes share: the data plane's argv and config, metrics dir, the supervisor."""

    def __init__(
        self, handover: Handover, *, workload: str, mark: int, fork_server: ForkServer | None
    ) -> None:
        self.handover = handover
        self.fork_server = fork_server
        self.settings = handover.settings
        self.workload = workload
        self.mark = mark
        self.feed: Feed | None = None
        self.pods: PodFeed | None = None
        self.ready_detail = ""  # the ready line's detail: what this proxy serves

    def argv(self, channel_fd: int) -> list[str]:
        from meshctl.process import self_command

        # The command name first: the data plane is a raw plugin and must not go through the
        # Typer root command, which global flags before it would (typer + pydantic: ~8 MB).
        return self_command(
            DATAPLANE_COMMAND,
            "--channel-fd",
            str(channel_fd),
            "--log-level",
            self.handover.dataplane_log_level,
            "--log-format",
            self.handover.log_format,
        )

    def serve(
        self,
        body: Callable[[Supervisor], Awaitable[int]],
        *,
        feed: Feed | None,
        node: bool = False,
    ) -> int:
        from meshctl.process import Supervisor

        from ..listeners import pod_ports

        s = self.settings
        from meshctl.net.sockets import address_text

        deadline, handshake = s.drain_deadline, s.handshake_timeout
        listeners = {role: socket.socket(fileno=fd) for role, fd in self.handover.listeners.items()}
        logs.listening(
            log, "ztunnel", [f"{role} {address_text(sock)}" for role, sock in listeners.items()]
        )
        # Every worker writes its counters here; worker 0 serves the sum (prometheus-client's
        # multiprocess mode, switched on for the children by the variable below). It lives in
        # the run directory, locked while in use: a start removes what killed runs left.
        held = contextlib.ExitStack()
        metrics_dir = str(held.enter_context(rundir.metrics_dir(run_dir(s))))

        def worker_exited(pid: int) -> None:
            from prometheus_client import multiprocess

            # Its live gauges no longer count (prometheus-client leaves this one unannotated).
            multiprocess.mark_process_dead(pid, metrics_dir)  # type: ignore[no-untyped-call]

        def proxy_config(worker: int, fds: dict[str, int]) -> channel.ProxyConfig:
            return channel.ProxyConfig(
                mode="node" if node else "sidecar",
                workload=self.workload,
                listeners=fds,
                cluster_id=s.cluster_id,
                trust_domain=s.trust_domain,
                pool_max_streams=s.pool_max_streams,
                pool_idle_timeout=s.pool_idle_timeout,
                drain_deadline=deadline,
                handshake_timeout=handshake,
                mark=self.mark,
                tproxy_mark=s.tproxy_mark if s.tproxy else 0,
                worker=worker,
                workers=s.workers,
                metrics_dir=metrics_dir,
                pod_ports=pod_ports(s) if node else {},
                # The sidecar's app probes and metrics merge (the injector's env).
                app_probers="" if node else s.app_probers,
                pod_ip="" if node else s.instance_ip,
                app_metrics="" if node else s.app_metrics,
            )

        self.feed = feed if feed is not None else self.feed

        async def main() -> int:
            supervisor = Supervisor(
                argv=self.argv,
                config=proxy_config,
                listeners=listeners,
                feed=_Deferred(self),
                drain_deadline=deadline,
                workers=s.workers,
                extra_env={"PROMETHEUS_MULTIPROC_DIR": metrics_dir},
                on_exit=worker_exited,
                poll_interval=s.reload_interval,
                pods=_DeferredPods(self) if node else None,
                ready_line=("ztunnel", self.ready_detail),
                fork_server=self.fork_server,
            )
            return await body(supervisor)

        try:
            return asyncio.run(main())
        finally:
            for sock in listeners.values():
                sock.close()
            held.close()


class _Deferred(Feed):
    """The feed of a ``_Run``, which node mode builds once the event loop runs."""

    def __init__(self, run: _Run) -> None:
        self._run = run

    def current(self) -> list[channel.Message]:
        return self._run.feed.current() if self._run.feed is not None else []

    def changes(self) -> list[channel.Message]:
        return self._run.feed.changes() if self._run.feed is not None else []

    async def run(self) -> None:
        if self._run.feed is not None:
            await self._run.feed.run()

    async def wait(self, timeout: float) -> None:
        if self._run.feed is not None:
            await self._run.feed.wait(timeout)
        else:
            await asyncio.sleep(timeout)


class _DeferredPods(PodFeed):
    def __init__(self, run: _Run) -> None:
        self._run = run

    def current(self) -> list[tuple[channel.Message, tuple[int, ...]]]:
        return self._run.pods.current() if self._run.pods is not None else []

    def stop_listening(self) -> None:
        if self._run.pods is not None:
            self._run.pods.stop_listening()
