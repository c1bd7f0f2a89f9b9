"""``meshctl ztunnel run`` (the supervisor) and ``meshctl ztunnel certs`` (a development CA)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from meshctl import config, logs, options
from meshctl.core import certs as certs_mod
from meshctl.core import channel, proxyconfig
from meshctl.core.identity import IdentityError, SpiffeId, is_trust_domain, parse_workload_ref
from meshctl.errors import ConfigError, MeshctlError, UserError
from meshctl.net.sockets import address_text
from meshctl.values import format_duration

from .settings import MAX_WORKERS, InjectedConfig, ZtunnelSettings

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
        str | None, _setting("mode", "sidecar (one workload; dedicated is the same for now).")
    ] = None,
    workload: Annotated[
        str | None, _setting("workload", "The workload served.", metavar="NS/NAME/SA")
    ] = None,
    local_config: Annotated[
        str | None, _setting("local_config", "ztunnel local config YAML.", metavar="FILE")
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
) -> None:
    """Run the HBONE proxy: supervise the data plane, feed it certificates and workloads."""
    from meshctl.process import Supervisor, self_command

    from .listeners import bind_all
    from .sources import FileFeed

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
    flags = {
        "mode": mode,
        "workload": workload,
        "local_config": local_config,
        "cert_dir": cert_dir,
        "trust_domain": trust_domain,
        "drain_deadline": drain_deadline,
        "handshake_timeout": handshake_timeout,
        "mark": mark,
        "workers": workers,
    }
    settings = config.resolve(ZtunnelSettings, flags=flags, file=file, file_name=file_name)
    ref = settings.workload_ref()
    try:
        ns, _name, sa = parse_workload_ref(ref)
    except IdentityError as exc:
        raise UserError(str(exc), hint="--workload NAMESPACE/NAME/SERVICE_ACCOUNT") from exc
    identity = _identity(settings.trust_domain, ns, sa)
    feed = FileFeed(
        cert_dir=Path(settings.cert_dir),
        local_config=Path(settings.local_config) if settings.local_config else None,
        identity=identity,
    )
    listeners = bind_all(settings)
    logs.listening(
        log,
        "ztunnel",
        [f"{role} {address_text(sock)}" for role, sock in listeners.items()],
    )
    global_settings: config.GlobalSettings = ctx.obj
    # The data plane logs every connection at info (ztunnel's access log): it runs at the
    # level the user chose, and at warning when none was (the supervisor's own default is info).
    dataplane_level = "debug" if global_settings.debug else global_settings.log_level or "warning"

    def argv(channel_fd: int) -> list[str]:
        # The command name first: the data plane is a raw plugin and must not go through the
        # Typer root command, which global flags before it would (typer + pydantic: ~8 MB).
        return self_command(
            DATAPLANE_COMMAND,
            "--channel-fd",
            str(channel_fd),
            "--log-level",
            dataplane_level,
            "--log-format",
            global_settings.log_format,
        )

    # Every worker writes its counters here; worker 0 serves the sum (prometheus-client's
    # multiprocess mode, switched on for the children by the variable below).
    metrics_dir = tempfile.mkdtemp(prefix="meshctl-metrics-")

    def worker_exited(pid: int) -> None:
        from prometheus_client import multiprocess

        # Its live gauges no longer count (prometheus-client leaves this one unannotated).
        multiprocess.mark_process_dead(pid, metrics_dir)  # type: ignore[no-untyped-call]

    def proxy_config(worker: int, fds: dict[str, int]) -> channel.ProxyConfig:
        return channel.ProxyConfig(
            mode="sidecar",
            workload=ref,
            listeners=fds,
            cluster_id=settings.cluster_id,
            trust_domain=settings.trust_domain,
            pool_max_streams=settings.pool_max_streams,
            pool_idle_timeout=settings.pool_idle_timeout,
            drain_deadline=settings.drain_deadline,
            handshake_timeout=settings.handshake_timeout,
            mark=settings.mark,
            worker=worker,
            workers=settings.workers,
            metrics_dir=metrics_dir,
            app_probers=settings.app_probers,
            pod_ip=settings.instance_ip,
            app_metrics=settings.app_metrics,
        )

    supervisor = Supervisor(
        argv=argv,
        config=proxy_config,
        listeners=listeners,
        feed=feed,
        drain_deadline=settings.drain_deadline,
        workers=settings.workers,
        extra_env={"PROMETHEUS_MULTIPROC_DIR": metrics_dir},
        on_exit=worker_exited,
        poll_interval=settings.reload_interval,
        ready_line=("ztunnel", f"serving {ref} as {identity} (supervisor pid {os.getpid()})"),
    )
    try:
        code = asyncio.run(supervisor.run())
    finally:
        for sock in listeners.values():
            sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    raise typer.Exit(code)


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
