"""``meshctl ztunnel run`` (the supervisor) and ``meshctl ztunnel certs`` (a development CA)."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import tempfile
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from meshctl import config
from meshctl.core import certs as certs_mod
from meshctl.core import channel
from meshctl.core.identity import IdentityError, SpiffeId, parse_workload_ref
from meshctl.errors import ConfigError, UserError

from .settings import ZtunnelSettings, seconds

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
        str | None, typer.Option(help="sidecar (dedicated: one workload) [env PROXY_MODE]")
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option(metavar="NS/NAME/SA", help="The workload served [env PROXY_WORKLOAD_INFO]"),
    ] = None,
    local_config: Annotated[
        str | None,
        typer.Option(metavar="FILE", help="ztunnel local config YAML [env LOCAL_XDS_PATH]"),
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
) -> None:
    """Run the HBONE proxy: supervise the data plane, feed it certificates and workloads."""
    from meshctl.process import Supervisor, self_command

    from .listeners import bind_all
    from .sources import FileFeed

    file, file_name = config.file_section(ctx.meta, "ztunnel")
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
        identity = SpiffeId(settings.trust_domain, ns, sa)
    except IdentityError as exc:
        raise UserError(str(exc), hint="--workload NAMESPACE/NAME/SERVICE_ACCOUNT") from exc
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
    feed = FileFeed(
        cert_dir=Path(settings.cert_dir),
        local_config=Path(settings.local_config) if settings.local_config else None,
        identity=identity,
    )
    listeners = bind_all(settings)
    global_settings: config.GlobalSettings = ctx.obj

    def argv(channel_fd: int) -> list[str]:
        # The command name first: the data plane is a raw plugin and must not go through the
        # Typer root command, which global flags before it would (typer + pydantic: ~8 MB).
        return self_command(
            DATAPLANE_COMMAND,
            "--channel-fd",
            str(channel_fd),
            "--log-level",
            "debug" if global_settings.debug else global_settings.log_level or "warning",
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
            pool_idle_timeout=seconds(settings.pool_idle_timeout, "pool idle timeout"),
            drain_deadline=deadline,
            handshake_timeout=handshake,
            mark=settings.mark,
            worker=worker,
            workers=settings.workers,
            metrics_dir=metrics_dir,
        )

    supervisor = Supervisor(
        argv=argv,
        config=proxy_config,
        listeners=listeners,
        feed=feed,
        drain_deadline=deadline,
        workers=settings.workers,
        extra_env={"PROMETHEUS_MULTIPROC_DIR": metrics_dir},
        on_exit=worker_exited,
        poll_interval=seconds(settings.reload_interval, "reload interval"),
    )
    log.info("serving %s as %s (pid %d)", ref, identity, os.getpid())
    try:
        code = asyncio.run(supervisor.run())
    finally:
        for sock in listeners.values():
            sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
    raise typer.Exit(code)


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
