"""``meshctl ztunnel run`` (the supervisor) and ``meshctl ztunnel certs`` (a development CA)."""

from __future__ import annotations

import logging
import os
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Annotated, Any

import typer

from meshctl import config, options, rundir, values
from meshctl.core.k8s import layout, proxyconfig
from meshctl.core.pki import certs as certs_mod
from meshctl.core.pki.identity import IdentityError, parse_workload_ref
from meshctl.errors import ConfigError, MeshctlError, UserError
from meshctl.output import OutputFormat, render_objects
from meshctl.values import format_duration

from .settings import DEFAULT_WORKERS, MAX_WORKERS, InjectedConfig, ZtunnelSettings

app = options.command_app(no_args_is_help=True)
log = logging.getLogger(__name__)

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
    run_dir: Annotated[
        str | None,
        _setting(
            "run_dir",
            rundir.option_help("ztunnel"),
            metavar="DIR",
        ),
    ] = None,
) -> None:
    """Run the HBONE proxy: supervise the data plane, feed it certificates and workloads."""
    flags = {k: v for k, v in locals().items() if k != "ctx"}  # first: only the options
    level = options.daemon_logging(ctx)  # info unless a level was given: listening, ready

    from .listeners import bind_all
    from .supervisor import modes
    from .supervisor.handover import Handover, become_supervisor

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
    # What a user can get wrong is refused here, with the CLI's errors, by building the mode's
    # sources as the supervisor will (quietly: it logs when it builds them again); then this
    # process becomes the lean supervisor (exec: same pid), leaving the CLI's libraries behind.
    checked = None
    rundir.prepare(modes.run_dir(settings))
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
        log_level=level,
        # The data plane logs every connection at info (ztunnel's access log): it runs at the
        # level the user chose, and at warning when none was.
        dataplane_log_level=level
        if global_settings.log_level or global_settings.debug
        else "warning",
        log_format=global_settings.log_format,
    )
    try:
        become_supervisor(handover)
    finally:  # only when the exec failed
        for sock in listeners.values():
            sock.close()


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
            help="CA files (ca-cert.pem, ca-key.pem; Istio's root-cert.pem, cert-chain.pem for "
            "an intermediate), minted there if absent [default: ca beside --out, i.e. OUT/../ca]",
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
    from .supervisor.modes import identity_for

    identity = identity_for(trust_domain, ns, sa)
    now = datetime.now(UTC)
    ca_dir = (ca_dir or out.parent / "ca").resolve()
    ca_cert, ca_key = ca_dir / certs_mod.CA_CERT_FILE, ca_dir / certs_mod.CA_KEY_FILE
    if ca_cert.exists() and ca_key.exists():
        from meshctl.proxy.identities import read_signing_ca

        ca = read_signing_ca(ca_dir, trust_domain)
        ca_facts = certs_mod.describe(ca.signer.cert_pem)[0]
        if now + timedelta(seconds=ttl) > ca_facts.not_after:
            raise UserError(
                f"--ttl {format_duration(ttl)}: the certificate would outlive the CA in {ca_dir} "
                f"(it expires {ca_facts.not_after:%Y-%m-%d %H:%M} UTC)",
                hint="give a shorter --ttl, or a new CA with another --ca-dir",
            )
    else:
        root = certs_mod.mint_root(trust_domain=trust_domain, now=now, ttl=CA_TTL)
        _write(ca_dir, certs_mod.CA_CERT_FILE, root.cert_pem, 0o644)
        _write(ca_dir, certs_mod.CA_KEY_FILE, root.key_pem, 0o600)
        typer.echo(
            f"minted a development CA for {trust_domain} in {ca_dir} (valid "
            f"{CA_TTL.days // 365} years; --ca-dir reuses it for other workloads)",
            err=True,
        )
        ca = certs_mod.SigningCa(signer=root, chain_pem=b"", root_pem=root.cert_pem)
    leaf = certs_mod.mint_workload(ca.signer, identity, now=now, ttl=timedelta(seconds=ttl))
    # Writes go to temporary names first and are renamed: a running proxy polling the directory
    # never reads a half-written key pair.
    _write(out, certs_mod.KEY_FILE, leaf.key_pem, 0o600)
    _write(out, certs_mod.CERT_CHAIN_FILE, leaf.cert_pem + ca.chain_pem, 0o644)
    _write(out, certs_mod.ROOT_CERT_FILE, ca.root_pem, 0o644)
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
        layout.MESH_NAMESPACE
    ),
    image: options.ImageOption = None,
    ca_address: Annotated[
        str | None,
        options.option(
            "--ca-address",
            parse=values.DIAL_ADDRESS,
            help="Mesh CA (default: meshctl-controlplane.<namespace>.svc:15012).",
        ),
    ] = None,
    xds_address: Annotated[
        str | None,
        options.option(
            "--xds-address",
            parse=values.DIAL_ADDRESS,
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
    ] = DEFAULT_WORKERS,
    output: options.OutputOption = OutputFormat.YAML,
    output_file: options.OutputFileOption = None,
) -> None:
    """Print the DaemonSet that runs the ambient node proxy ('ztunnel run --mode node')."""
    from meshctl.core.k8s.install.components import standalone
    from meshctl.core.k8s.install.manifest import namespace_object

    from .manifest import NodeProxyValues, objects

    # The install's values type (components.ztunnel.*), whose defaults are these options'.
    own = NodeProxyValues(workers=workers)
    items = [
        namespace_object(namespace),
        *objects(
            standalone(namespace, image),
            own,
            ca_address=ca_address or "",
            xds_address=xds_address or "",
        ),
    ]
    options.write_output(render_objects(items, output), output_file)
