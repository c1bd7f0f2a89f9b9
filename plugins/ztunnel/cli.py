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
from typing import TYPE_CHECKING, Annotated

import typer

from meshctl import config
from meshctl.core import certs as certs_mod
from meshctl.core import channel, proxyconfig
from meshctl.core.identity import IdentityError, SpiffeId, parse_workload_ref
from meshctl.errors import ConfigError, MeshctlError, UserError
from meshctl.output import OutputFormat, render_objects
from meshctl.process import Feed, PodFeed

from .settings import InjectedConfig, ZtunnelSettings, seconds

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
_MAX_WORKERS = 64


@app.command()
def run(
    ctx: typer.Context,
    mode: Annotated[
        str | None,
        typer.Option(
            help="sidecar (dedicated: one workload) or node (shared: the node's ambient pods) "
            "[env PROXY_MODE]"
        ),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option(metavar="NS/NAME/SA", help="The workload served [env PROXY_WORKLOAD_INFO]"),
    ] = None,
    local_config: Annotated[
        str | None,
        typer.Option(metavar="FILE", help="ztunnel local config YAML [env LOCAL_XDS_PATH]"),
    ] = None,
    xds_address: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            help="Control plane to discover workloads from, instead of --local-config "
            "(Delta ADS over TLS, e.g. :15012) [env XDS_ADDRESS]",
        ),
    ] = None,
    xds_root_ca: Annotated[
        str | None,
        typer.Option(
            metavar="FILE",
            help="The control plane's root certificate "
            "(/var/run/secrets/istio/root-cert.pem) [env XDS_ROOT_CA]",
        ),
    ] = None,
    cert_dir: Annotated[
        str | None,
        typer.Option(
            metavar="DIR", help="cert-chain.pem, key.pem, root-cert.pem [env MESHCTL_CERT_DIR]"
        ),
    ] = None,
    trust_domain: Annotated[str | None, typer.Option(help="[env TRUST_DOMAIN]")] = None,
    drain_deadline: Annotated[
        str | None, typer.Option(help="How long open connections may finish on SIGTERM (5s)")
    ] = None,
    handshake_timeout: Annotated[
        str | None,
        typer.Option(
            help="How long a peer may take to complete a TLS handshake (5s) "
            "[env MESHCTL_HANDSHAKE_TIMEOUT]"
        ),
    ] = None,
    mark: Annotated[
        int | None, typer.Option(help="SO_MARK for connections the proxy makes [env PACKET_MARK]")
    ] = None,
    workers: Annotated[
        int | None,
        typer.Option(help="Data-plane worker processes (1) [env ZTUNNEL_WORKER_THREADS]"),
    ] = None,
    inpod_uds: Annotated[
        str | None,
        typer.Option(
            metavar="PATH",
            help="Node mode: the node agent's ZDS socket (/var/run/ztunnel/ztunnel.sock) "
            "[env INPOD_UDS]",
        ),
    ] = None,
    ca_dir: Annotated[
        str | None,
        typer.Option(
            metavar="DIR",
            help="Node mode: mint pod certificates from this development CA "
            "(ca-cert.pem, ca-key.pem) [env MESHCTL_CA_DIR]",
        ),
    ] = None,
    ca_address: Annotated[
        str | None,
        typer.Option(
            metavar="HOST:PORT",
            help="Mesh CA, e.g. meshctl-controlplane.meshctl-system.svc:15012 [env CA_ADDRESS]",
        ),
    ] = None,
    ca_root: Annotated[
        str | None,
        typer.Option(
            metavar="FILE",
            help="Mesh root bundle (/var/run/secrets/istio/root-cert.pem) [env CA_ROOT_CA]",
        ),
    ] = None,
    auth_token: Annotated[
        str | None,
        typer.Option(
            "--token-file",
            metavar="FILE",
            help="Service-account token for the CA (/var/run/secrets/tokens/istio-token) "
            "[env AUTH_TOKEN]",
        ),
    ] = None,
    secret_ttl: Annotated[
        str | None, typer.Option(help="Certificate lifetime to request (24h) [env SECRET_TTL]")
    ] = None,
) -> None:
    """Run the HBONE proxy: supervise the data plane, feed it certificates and workloads."""
    flags = {k: v for k, v in locals().items() if k != "ctx"}
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
    deadline = seconds(settings.drain_deadline, "drain deadline")
    handshake = seconds(settings.handshake_timeout, "handshake timeout")
    if handshake <= 0:
        raise ConfigError(
            f"handshake timeout must be positive, not {settings.handshake_timeout!r}",
            hint="e.g. --handshake-timeout 5s",
        )
    if not 1 <= settings.workers <= _MAX_WORKERS:
        raise ConfigError(
            f"workers must be between 1 and {_MAX_WORKERS}, not {settings.workers}",
            hint="one per core the proxy may use, e.g. --workers 2",
        )
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
        identity = SpiffeId(settings.trust_domain, ns, sa)
    except IdentityError as exc:
        raise UserError(str(exc), hint="--workload NAMESPACE/NAME/SERVICE_ACCOUNT") from exc
    feed = _feed(settings, identity)
    if settings.xds_address and not settings.local_config:
        from .xds import XdsFeed, build_config  # grpc: only for a proxy with a control plane

        feed = XdsFeed(certs=feed, client_config=build_config(settings))
    listeners = bind_all(settings)
    log.info("serving %s as %s (pid %d)", ref, identity, os.getpid())
    run = _Run(settings, global_settings, deadline, handshake, listeners, workload=ref)
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

    log.info(
        "node proxy: pods from %s, certificates from %s (pid %d)",
        settings.inpod_uds,
        issuer.name,
        os.getpid(),
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
    ttl = seconds(settings.secret_ttl, "secret TTL")
    if ttl < 1:
        raise ConfigError(f"secret TTL {settings.secret_ttl!r} is under a second", hint="e.g. 24h")
    return ttl


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

    def argv(self, channel_fd: int) -> list[str]:
        from meshctl.process import self_command

        g = self.global_settings
        # The command name first: the data plane is a raw plugin and must not go through the
        # Typer root command, which global flags before it would (typer + pydantic: ~8 MB).
        return self_command(
            DATAPLANE_COMMAND,
            "--channel-fd",
            str(channel_fd),
            "--log-level",
            g.log_level if not g.debug else "debug",
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
                pool_idle_timeout=seconds(s.pool_idle_timeout, "pool idle timeout"),
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

        self.feed = feed if feed is not None else self.feed

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
                poll_interval=seconds(s.reload_interval, "reload interval"),
                pods=_DeferredPods(self) if node else None,
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


@app.command()
def wait(
    timeout: Annotated[str, typer.Option(help="How long to wait for readiness")] = "60s",
    port: Annotated[int, typer.Option(help="The proxy's readiness port")] = 15021,
) -> None:
    """Wait until this pod's proxy is ready (a postStart hook: the app starts after it)."""
    import http.client
    import time

    deadline = time.monotonic() + seconds(timeout, "--timeout")
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
                f"the proxy was not ready within {timeout} ({last})",
                hint=f"see the proxy's log (kubectl logs -c istio-proxy); readiness is :{port}",
            )
        time.sleep(0.5)


@app.command()
def certs(
    out: Annotated[Path, typer.Option(metavar="DIR", help="Where the workload's files go")],
    workload: Annotated[
        str, typer.Option(metavar="NS/NAME/SA", help="Whose identity the certificate carries")
    ],
    ca_dir: Annotated[
        Path | None,
        typer.Option(metavar="DIR", help="CA files (ca-cert.pem, ca-key.pem); minted if absent"),
    ] = None,
    trust_domain: Annotated[str, typer.Option(help="SPIFFE trust domain")] = "cluster.local",
    ttl: Annotated[str, typer.Option(help="Workload certificate lifetime")] = "24h",
) -> None:
    """Mint a development CA (once) and a SPIFFE workload certificate signed by it."""
    from .settings import seconds as to_seconds

    try:
        ns, _name, sa = parse_workload_ref(workload)
        identity = SpiffeId(trust_domain, ns, sa)
    except IdentityError as exc:
        raise UserError(str(exc), hint="--workload NAMESPACE/NAME/SERVICE_ACCOUNT") from exc
    now = datetime.now(UTC)
    ca_dir = ca_dir or out.parent / "ca"
    ca_cert, ca_key = ca_dir / certs_mod.CA_CERT_FILE, ca_dir / certs_mod.CA_KEY_FILE
    if ca_cert.exists() and ca_key.exists():
        ca = certs_mod.KeyPair(cert_pem=ca_cert.read_bytes(), key_pem=ca_key.read_bytes())
        ca_facts = certs_mod.describe(ca.cert_pem)[0]
        if ca_facts.subject.find(f"O={trust_domain}") < 0:
            raise UserError(
                f"the CA in {ca_dir} is not for trust domain {trust_domain!r}",
                hint="use another --ca-dir for another trust domain",
            )
    else:
        ca = certs_mod.mint_root(trust_domain=trust_domain, now=now, ttl=timedelta(days=3650))
        _write(ca_dir, certs_mod.CA_CERT_FILE, ca.cert_pem, 0o644)
        _write(ca_dir, certs_mod.CA_KEY_FILE, ca.key_pem, 0o600)
        typer.echo(f"minted development CA in {ca_dir}", err=True)
    leaf = certs_mod.mint_workload(
        ca, identity, now=now, ttl=timedelta(seconds=to_seconds(ttl, "--ttl"))
    )
    # Writes go to temporary names first and are renamed: a running proxy polling the directory
    # never reads a half-written key pair.
    _write(out, certs_mod.KEY_FILE, leaf.key_pem, 0o600)
    _write(out, certs_mod.CERT_CHAIN_FILE, leaf.cert_pem, 0o644)
    _write(out, certs_mod.ROOT_CERT_FILE, ca.cert_pem, 0o644)
    typer.echo(f"{identity} -> {out}")


def _write(folder: Path, name: str, data: bytes, mode: int) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / f".{name}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, mode)
    with os.fdopen(fd, "wb") as handle:
        handle.write(data)
    tmp.replace(folder / name)


@app.command("manifest")
def manifest_cmd(
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "meshctl-system",
    image: Annotated[str | None, typer.Option("--image", help="meshctl image.")] = None,
    ca_address: Annotated[
        str | None,
        typer.Option(help="Mesh CA (default: meshctl-controlplane.<namespace>.svc:15012)."),
    ] = None,
    xds_address: Annotated[
        str | None,
        typer.Option(help="Discovery (default: meshctl-controlplane.<namespace>.svc:15012)."),
    ] = None,
    workers: Annotated[int, typer.Option(help="Data-plane worker processes per node.")] = 1,
    output: Annotated[OutputFormat, typer.Option("-o", "--output")] = OutputFormat.YAML,
) -> None:
    """Print the DaemonSet that runs the ambient node proxy ('ztunnel run --mode node')."""
    from meshctl.core.image import default_image

    from .manifest import objects

    items = objects(
        namespace=namespace,
        image=image or default_image(),
        ca_address=ca_address or "",
        xds_address=xds_address or "",
        workers=workers,
    )
    if output is OutputFormat.TABLE:
        raise typer.BadParameter("use -o yaml or -o json", param_hint="-o")
    typer.echo(render_objects(items, output), nl=False)
