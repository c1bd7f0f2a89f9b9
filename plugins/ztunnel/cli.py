"""``meshctl ztunnel run`` (the supervisor) and ``meshctl ztunnel certs`` (a development CA)."""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated

import typer

from meshctl import config
from meshctl.core import certs as certs_mod
from meshctl.core import proxyconfig
from meshctl.core.identity import IdentityError, SpiffeId, parse_workload_ref
from meshctl.errors import ConfigError, MeshctlError, UserError
from meshctl.output import OutputFormat, render_objects

from .settings import InjectedConfig, ZtunnelSettings, seconds

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    no_args_is_help=True,
)
log = logging.getLogger(__name__)

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
    flags = {k: v for k, v in locals().items() if k != "ctx"}  # first: only the options
    from .listeners import bind_all
    from .supervisor import modes
    from .supervisor.main import Handover, become_supervisor

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
    seconds(settings.drain_deadline, "drain deadline")  # refused here if it is not a duration
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
    # What a user can get wrong is refused here, with the CLI's errors, by building the mode's
    # sources as the supervisor will (quietly: it logs when it builds them again); then this
    # process becomes the lean supervisor (exec: same pid), leaving the CLI's libraries behind.
    checked = None
    if settings.node_mode:
        modes.node_sources(settings, quiet=True)
    else:
        _ref, identity = modes.sidecar_identity(settings)
        checked = modes.read_mounted_certs(settings, identity)
        modes.sidecar_feed(settings, identity, certs=checked, quiet=True)
    if settings.xds_address and settings.local_config:
        # An explicit file wins (tests, demos, a pod the injector pointed at a control plane).
        log.warning(
            "workloads from the local config %s; discovery at %s is not used",
            settings.local_config,
            settings.xds_address,
        )
    listeners = bind_all(settings, proxy=not settings.node_mode)
    global_settings: config.GlobalSettings = ctx.obj
    handover = Handover(
        settings=settings,
        listeners={role: sock.fileno() for role, sock in listeners.items()},
        certs=None if checked is None else checked[0],
        cert_digest="" if checked is None else checked[1],
        log_level=global_settings.log_level if not global_settings.debug else "debug",
        log_format=global_settings.log_format,
    )
    try:
        become_supervisor(handover)
    finally:  # only when the exec failed
        for sock in listeners.values():
            sock.close()


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
        typer.Option(
            metavar="DIR",
            help="CA files (ca-cert.pem, ca-key.pem; Istio's root-cert.pem, cert-chain.pem for "
            "an intermediate); minted if absent",
        ),
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
        from .identities import read_signing_ca

        ca = read_signing_ca(ca_dir, trust_domain)
    else:
        root = certs_mod.mint_root(trust_domain=trust_domain, now=now, ttl=timedelta(days=3650))
        _write(ca_dir, certs_mod.CA_CERT_FILE, root.cert_pem, 0o644)
        _write(ca_dir, certs_mod.CA_KEY_FILE, root.key_pem, 0o600)
        typer.echo(f"minted development CA in {ca_dir}", err=True)
        ca = certs_mod.SigningCa(signer=root, chain_pem=b"", root_pem=root.cert_pem)
    leaf = certs_mod.mint_workload(
        ca.signer, identity, now=now, ttl=timedelta(seconds=to_seconds(ttl, "--ttl"))
    )
    # Writes go to temporary names first and are renamed: a running proxy polling the directory
    # never reads a half-written key pair.
    _write(out, certs_mod.KEY_FILE, leaf.key_pem, 0o600)
    _write(out, certs_mod.CERT_CHAIN_FILE, leaf.cert_pem + ca.chain_pem, 0o644)
    _write(out, certs_mod.ROOT_CERT_FILE, ca.root_pem, 0o644)
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
