"""``meshctl ztunnel run`` (the supervisor) and ``meshctl ztunnel certs`` (a development CA)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import socket
import tempfile
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshctl import config, logs, options, values
from meshctl.core import certs as certs_mod
from meshctl.core import channel, proxyconfig
from meshctl.core.identity import IdentityError, SpiffeId, is_trust_domain, parse_workload_ref
from meshctl.errors import ConfigError, MeshctlError, UserError
from meshctl.output import OutputFormat, render_objects
from meshctl.process import Feed, PodFeed
from meshctl.values import format_duration

from .settings import MAX_WORKERS, InjectedConfig, ZtunnelSettings

if TYPE_CHECKING:
    from meshctl.process import Supervisor

    from .caclient import CaClient
    from .identities import Issuer

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)
log = logging.getLogger(__name__)

DATAPLANE_COMMAND = "ztunnel-dataplane"
CA_TTL = timedelta(days=3650)  # the development CA's lifetime


def _setting(field: str, help: str, metavar: str | None = None) -> Any:  # noqa: A002
    """``meshctl ztunnel run``'s option for ``ZtunnelSettings.<field>`` (env var from the field)."""
    return options.from_setting(ZtunnelSettings, field, help=help, metavar=metavar)


@app.command()
def run(
    ctx: typer.Context,
    mode: Annotated[
        str | None,
        _setting("mode", "sidecar (dedicated: one workload) or node (shared: the node's pods)."),
    ] = None,
    workload: Annotated[
        str | None, _setting("workload", "The workload served.", metavar="NS/NAME/SA")
    ] = None,
    local_config: Annotated[
        str | None, _setting("local_config", "ztunnel local config YAML.", metavar="FILE")
    ] = None,
    xds_address: Annotated[
        str | None,
        _setting(
            "xds_address",
            "Control plane to discover workloads from, instead of --local-config "
            "(Delta ADS over TLS, e.g. :15012).",
            metavar="HOST:PORT",
        ),
    ] = None,
    xds_root_ca: Annotated[
        str | None,
        _setting(
            "xds_root_ca",
            "The control plane's root certificate (/var/run/secrets/istio/root-cert.pem).",
            metavar="FILE",
        ),
    ] = None,
    cert_dir: Annotated[
        str | None,
        _setting("cert_dir", "cert-chain.pem, key.pem, root-cert.pem live here.", metavar="DIR"),
    ] = None,
    trust_domain: Annotated[
        str | None,
        _setting("trust_domain", "SPIFFE trust domain (cluster.local).", metavar="DOMAIN"),
    ] = None,
    drain_deadline: Annotated[
        float | None, _setting("drain_deadline", "How long open connections may finish (5s).")
    ] = None,
    handshake_timeout: Annotated[
        float | None,
        _setting("handshake_timeout", "How long a peer may take for the TLS handshake (5s)."),
    ] = None,
    mark: Annotated[
        int | None, _setting("mark", "SO_MARK for connections the proxy makes (0: none).")
    ] = None,
    workers: Annotated[
        int | None, _setting("workers", f"Data-plane worker processes, 1-{MAX_WORKERS} (1).")
    ] = None,
    inpod_uds: Annotated[
        str | None,
        _setting(
            "inpod_uds",
            "Node mode: the node agent's ZDS socket (/var/run/ztunnel/ztunnel.sock).",
            metavar="PATH",
        ),
    ] = None,
    ca_dir: Annotated[
        str | None,
        _setting(
            "ca_dir",
            "Node mode: mint pod certificates from this development CA (ca-cert.pem, ca-key.pem).",
            metavar="DIR",
        ),
    ] = None,
    ca_address: Annotated[
        str | None,
        _setting(
            "ca_address",
            "Mesh CA, e.g. meshctl-controlplane.meshctl-system.svc:15012.",
            metavar="HOST:PORT",
        ),
    ] = None,
    ca_root: Annotated[
        str | None,
        _setting(
            "ca_root", "Mesh root bundle (/var/run/secrets/istio/root-cert.pem).", metavar="FILE"
        ),
    ] = None,
    auth_token: Annotated[
        str | None,
        _setting(
            "auth_token",
            "Service-account token for the CA (/var/run/secrets/tokens/istio-token).",
            metavar="FILE",
        ),
    ] = None,
    secret_ttl: Annotated[
        float | None, _setting("secret_ttl", "Certificate lifetime to request (24h).")
    ] = None,
) -> None:
    """Run the HBONE proxy: supervise the data plane, feed it certificates and workloads."""
    flags = {k: v for k, v in locals().items() if k != "ctx"}
    options.daemon_logging(ctx)
    file, file_name = config.file_section(ctx.meta, "ztunnel")
    # The pod's ProxyConfig from the injector (Istio's PROXY_CONFIG): below flags and env.
    injected = config.resolve(InjectedConfig)
    try:
        pod_config = proxyconfig.parse(injected.proxy_config, source=proxyconfig.ENV)
    except ValueError as exc:
        raise ConfigError(
            str(exc), hint="the injector writes PROXY_CONFIG; re-inject the pod"
        ) from exc
    file = {**file, **pod_config.ztunnel_settings(os.cpu_count() or 1)}
    settings = config.resolve(ZtunnelSettings, flags=flags, file=file, file_name=file_name)
    # Durations, ranges and choices were checked as the settings resolved (flags, env, file).
    deadline, handshake = settings.drain_deadline, settings.handshake_timeout
    if settings.xds_address and settings.local_config:
        # An explicit file wins (tests, demos, a pod the injector pointed at a control plane).
        log.warning(
            "workloads from the local config %s; discovery at %s is not used",
            settings.local_config,
            settings.xds_address,
        )
    global_settings: config.GlobalSettings = ctx.obj
    if settings.node_mode:
        code = _run_node(settings, global_settings, deadline, handshake)
    else:
        code = _run_sidecar(settings, global_settings, deadline, handshake)
    raise typer.Exit(code)


def _run_sidecar(
    settings: ZtunnelSettings,
    global_settings: config.GlobalSettings,
    deadline: float,
    handshake: float,
) -> int:
    from .listeners import bind_all

    ref = settings.workload_ref()
    try:
        ns, _name, sa = parse_workload_ref(ref)
    except IdentityError as exc:
        raise UserError(str(exc), hint="--workload NAMESPACE/NAME/SERVICE_ACCOUNT") from exc
    identity = _identity(settings.trust_domain, ns, sa)
    feed = _feed(settings, identity)
    if settings.xds_address and not settings.local_config:
        from .xds import XdsFeed, build_config  # grpc: only for a proxy with a control plane

        feed = XdsFeed(certs=feed, client_config=build_config(settings))
    listeners = bind_all(settings)
    run = _Run(settings, global_settings, deadline, handshake, listeners, workload=ref)
    run.ready_detail = f"serving {ref} as {identity} (supervisor pid {os.getpid()})"
    return run.serve(lambda supervisor: supervisor.run(), feed=feed)


def _run_node(
    settings: ZtunnelSettings,
    global_settings: config.GlobalSettings,
    deadline: float,
    handshake: float,
) -> int:
    from meshctl.core.capture.settings import AMBIENT_PROXY_MARK

    from .identities import Identities
    from .listeners import bind_all, pod_ports
    from .node import NodeFeed, Pods, ZdsClient
    from .sources import LocalConfigSource

    issuer = _issuer(settings)
    ttl = timedelta(seconds=_ttl(settings))
    files = LocalConfigSource(Path(settings.local_config) if settings.local_config else None)
    # The pods' capture rules exempt what carries the in-pod mark (Istio's 0x539).
    mark = settings.mark or AMBIENT_PROXY_MARK
    listeners = bind_all(settings, proxy=False)
    run = _Run(settings, global_settings, deadline, handshake, listeners, workload="", mark=mark)

    async def serve(supervisor: Supervisor) -> int:
        identities = Identities(issuer, ttl=ttl, publish=supervisor.broadcast)
        run.pods = pods = Pods(
            ports=pod_ports(settings),
            mark=mark,
            trust_domain=settings.trust_domain,
            identities=identities,
        )
        run.feed = NodeFeed(files, identities)
        if settings.xds_address:
            from .xds import XdsFeed, build_config  # grpc: only with a control plane

            # Workloads from discovery; the pods' certificates as before (broadcast as issued).
            run.feed = XdsFeed(certs=run.feed, client_config=build_config(settings))
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
        f"node proxy: pods from {settings.inpod_uds}, certificates from {issuer.name} "
        f"(supervisor pid {os.getpid()})"
    )
    return run.serve(serve, feed=None, node=True)


def _feed(settings: ZtunnelSettings, identity: SpiffeId) -> Feed:
    """Mounted certificate files win (as Istio's file-mounted certs); else the CA if given."""
    from .sources import FileFeed, has_cert_files

    local_config = Path(settings.local_config) if settings.local_config else None
    cert_dir = Path(settings.cert_dir)
    if has_cert_files(cert_dir) or not settings.ca_address:
        if settings.ca_address:
            log.info("certificates from %s (mounted files win over the CA)", cert_dir)
        return FileFeed(cert_dir=cert_dir, local_config=local_config, identity=identity)
    from .caclient import CaFeed

    ttl = _ttl(settings)
    client = _ca_client(settings)
    log.info("certificates from the CA at %s", settings.ca_address)
    return CaFeed(
        client=client,
        identity=identity,
        root_file=Path(settings.ca_root),
        ttl_seconds=int(ttl),
        local_config=local_config,
    )


def _ttl(settings: ZtunnelSettings) -> float:
    return settings.secret_ttl  # at least a second (the setting's parser)


def _ca_client(settings: ZtunnelSettings) -> CaClient:
    from meshctl.rpc import CallAuth

    from .caclient import CaClient

    assert settings.ca_address  # noqa: S101 (callers checked)
    token = Path(settings.auth_token)
    # ztunnel's AUTH_TOKEN: a path when such a file exists (read on every call), else the token.
    looks_like_path = "/" in settings.auth_token or token.exists()
    auth = (
        CallAuth(token_file=token, cluster_id=settings.cluster_id)
        if looks_like_path
        else CallAuth(token=settings.auth_token, cluster_id=settings.cluster_id)
    )
    return CaClient(settings.ca_address, auth=auth, server_name=settings.ca_server_name)


def _issuer(settings: ZtunnelSettings) -> Issuer:
    """Node mode's pod certificates: the mesh CA by impersonation, else a development CA."""
    from .identities import CaIssuer, LocalCa

    if settings.ca_address:
        return CaIssuer(_ca_client(settings), root_file=Path(settings.ca_root))
    if settings.ca_dir:
        return LocalCa(Path(settings.ca_dir))
    raise UserError(
        "node mode needs a source of pod certificates",
        hint="give --ca-address HOST:15012 (the mesh CA) or --ca-dir DIR (a development CA "
        "made by 'meshctl ztunnel certs')",
    )


class _Run:
    """What both modes share: the data plane's argv and config, metrics dir, the supervisor."""

    def __init__(
        self,
        settings: ZtunnelSettings,
        global_settings: config.GlobalSettings,
        deadline: float,
        handshake: float,
        listeners: dict[str, socket.socket],
        *,
        workload: str,
        mark: int | None = None,
    ) -> None:
        self.settings = settings
        self.global_settings = global_settings
        self.deadline = deadline
        self.handshake = handshake
        self.listeners = listeners
        self.workload = workload
        self.mark = settings.mark if mark is None else mark
        self.feed: Feed | None = None
        self.pods: PodFeed | None = None
        self.ready_detail = ""  # the ready line's detail: what this proxy serves

    def argv(self, channel_fd: int) -> list[str]:
        from meshctl.process import self_command

        g = self.global_settings
        # The data plane logs every connection at info (ztunnel's access log): it runs at the
        # level the user chose, and at warning when none was (the supervisor's default is info).
        level = "debug" if g.debug else g.log_level or "warning"
        # The command name first: the data plane is a raw plugin and must not go through the
        # Typer root command, which global flags before it would (typer + pydantic: ~8 MB).
        return self_command(
            DATAPLANE_COMMAND,
            "--channel-fd",
            str(channel_fd),
            "--log-level",
            level,
            "--log-format",
            g.log_format,
        )

    def serve(
        self,
        body: Callable[[Supervisor], Awaitable[int]],
        *,
        feed: Feed | None,
        node: bool = False,
    ) -> int:
        from meshctl.process import Supervisor

        from .listeners import pod_ports

        s = self.settings
        # Every worker writes its counters here; worker 0 serves the sum (prometheus-client's
        # multiprocess mode, switched on for the children by the variable below).
        metrics_dir = tempfile.mkdtemp(prefix="meshctl-metrics-")

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
                drain_deadline=self.deadline,
                handshake_timeout=self.handshake,
                mark=self.mark,
                worker=worker,
                workers=s.workers,
                metrics_dir=metrics_dir,
                pod_ports=pod_ports(s) if node else {},
                # The sidecar's app probes and metrics merge (the injector's env).
                app_probers="" if node else s.app_probers,
                pod_ip="" if node else s.instance_ip,
                app_metrics="" if node else s.app_metrics,
            )

        from meshctl.net.sockets import address_text  # ctypes: not on --help's path

        self.feed = feed if feed is not None else self.feed
        logs.listening(
            log,
            "ztunnel",
            [f"{role} {address_text(sock)}" for role, sock in self.listeners.items()],
        )

        async def main() -> int:
            supervisor = Supervisor(
                argv=self.argv,
                config=proxy_config,
                listeners=self.listeners,
                feed=_Deferred(self),
                drain_deadline=self.deadline,
                workers=s.workers,
                extra_env={"PROMETHEUS_MULTIPROC_DIR": metrics_dir},
                on_exit=worker_exited,
                poll_interval=s.reload_interval,
                pods=_DeferredPods(self) if node else None,
                ready_line=("ztunnel", self.ready_detail),
            )
            return await body(supervisor)

        try:
            return asyncio.run(main())
        finally:
            for sock in self.listeners.values():
                sock.close()
            shutil.rmtree(metrics_dir, ignore_errors=True)


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


def _identity(trust_domain: str, namespace: str, service_account: str) -> SpiffeId:
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


@app.command()
def wait(
    timeout: Annotated[
        float, options.duration("--timeout", positive=True, help="How long to wait for readiness.")
    ] = 60.0,
    port: Annotated[int, options.port("--port", help="The proxy's readiness port.")] = 15021,
) -> None:
    """Wait until this pod's proxy is ready (a postStart hook: the app starts after it)."""
    import http.client
    import time

    deadline = time.monotonic() + timeout
    last = "no answer"
    while True:
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz/ready")
            status = conn.getresponse().status
            conn.close()
            if status == 200:
                return
            last = f"HTTP {status}"
        except OSError as exc:
            last = exc.strerror or str(exc)
        if time.monotonic() >= deadline:
            raise MeshctlError(
                f"the proxy was not ready within {format_duration(timeout)} ({last})",
                hint=f"see the proxy's log (kubectl logs -c istio-proxy); readiness is :{port}",
            )
        time.sleep(0.5)


@app.command()
def certs(
    out: Annotated[
        Path, options.output_directory("--out", help="Where the workload's files go (created).")
    ],
    workload: Annotated[
        str,
        typer.Option(metavar="NS/NAME/SA", help="Whose identity the certificate carries."),
    ],
    ca_dir: Annotated[
        Path | None,
        options.output_directory(
            "--ca-dir",
            help="CA files (ca-cert.pem, ca-key.pem), minted there if absent "
            "[default: ca beside --out, i.e. OUT/../ca]",
            show_default=False,
        ),
    ] = None,
    trust_domain: Annotated[
        str, typer.Option(metavar="DOMAIN", help="SPIFFE trust domain.")
    ] = "cluster.local",
    ttl: Annotated[
        float,
        options.duration(
            "--ttl",
            positive=True,
            maximum=CA_TTL.total_seconds(),
            help="Workload certificate lifetime (e.g. 24h, 90m, 30d).",
        ),
    ] = 86400.0,
) -> None:
    """Mint a development CA (once) and a SPIFFE workload certificate signed by it."""
    try:
        ns, _name, sa = parse_workload_ref(workload)
    except IdentityError as exc:
        raise UserError(str(exc), hint="--workload NAMESPACE/NAME/SERVICE_ACCOUNT") from exc
    identity = _identity(trust_domain, ns, sa)
    now = datetime.now(UTC)
    ca_dir = (ca_dir or out.parent / "ca").resolve()
    ca_cert, ca_key = ca_dir / certs_mod.CA_CERT_FILE, ca_dir / certs_mod.CA_KEY_FILE
    if ca_cert.exists() and ca_key.exists():
        ca = certs_mod.KeyPair(cert_pem=ca_cert.read_bytes(), key_pem=ca_key.read_bytes())
        ca_facts = certs_mod.describe(ca.cert_pem)[0]
        if ca_facts.subject.find(f"O={trust_domain}") < 0:
            raise UserError(
                f"the CA in {ca_dir} is not for trust domain {trust_domain!r}",
                hint="use another --ca-dir for another trust domain",
            )
        if now + timedelta(seconds=ttl) > ca_facts.not_after:
            raise UserError(
                f"--ttl {format_duration(ttl)}: the certificate would outlive the CA in {ca_dir} "
                f"(it expires {ca_facts.not_after:%Y-%m-%d %H:%M} UTC)",
                hint="give a shorter --ttl, or a new CA with another --ca-dir",
            )
    else:
        ca = certs_mod.mint_root(trust_domain=trust_domain, now=now, ttl=CA_TTL)
        _write(ca_dir, certs_mod.CA_CERT_FILE, ca.cert_pem, 0o644)
        _write(ca_dir, certs_mod.CA_KEY_FILE, ca.key_pem, 0o600)
        typer.echo(
            f"minted a development CA for {trust_domain} in {ca_dir} (valid "
            f"{CA_TTL.days // 365} years; --ca-dir reuses it for other workloads)",
            err=True,
        )
    leaf = certs_mod.mint_workload(ca, identity, now=now, ttl=timedelta(seconds=ttl))
    # Writes go to temporary names first and are renamed: a running proxy polling the directory
    # never reads a half-written key pair.
    _write(out, certs_mod.KEY_FILE, leaf.key_pem, 0o600)
    _write(out, certs_mod.CERT_CHAIN_FILE, leaf.cert_pem, 0o644)
    _write(out, certs_mod.ROOT_CERT_FILE, ca.cert_pem, 0o644)
    typer.echo(f"{identity} -> {out}")


def _write(folder: Path, name: str, data: bytes, mode: int) -> None:
    tmp = folder / f".{name}.tmp"
    try:
        folder.mkdir(parents=True, exist_ok=True)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
        tmp.replace(folder / name)
    except OSError as exc:
        tmp.unlink(missing_ok=True)
        raise MeshctlError(
            f"cannot write {folder / name}: {exc.strerror or exc}",
            hint="check that the directory (and every folder above it) is writable",
        ) from exc


@app.command("manifest")
def manifest_cmd(
    namespace: Annotated[str, options.namespace("Namespace of the node proxies.")] = (
        "meshctl-system"
    ),
    image: options.ImageOption = None,
    ca_address: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            help="Mesh CA (default: meshctl-controlplane.<namespace>.svc:15012).",
        ),
    ] = None,
    xds_address: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            help="Discovery (default: meshctl-controlplane.<namespace>.svc:15012).",
        ),
    ] = None,
    workers: Annotated[
        int,
        options.option(
            "--workers",
            help=f"Data-plane worker processes per node, 1-{MAX_WORKERS}.",
            parse=values.Integer(1, MAX_WORKERS, what="a count"),
        ),
    ] = 1,
    output: options.OutputOption = OutputFormat.YAML,
) -> None:
    """Print the DaemonSet that runs the ambient node proxy ('ztunnel run --mode node')."""
    from meshctl.core.inject.settings import DEFAULT_IMAGE

    from .manifest import objects

    items = objects(
        namespace=namespace,
        image=image or DEFAULT_IMAGE,
        ca_address=ca_address or "",
        xds_address=xds_address or "",
        workers=workers,
    )
    typer.echo(render_objects(items, output), nl=False)
