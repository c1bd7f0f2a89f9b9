"""The ``meshctl inject`` commands: inject files, serve the webhook, print its configuration.

Invariant of ``meshctl inject -f``: output is produced only after the whole input was read,
parsed and injected; on any error nothing is written to stdout or to ``-o`` (the file is
replaced atomically, never truncated).
"""

from __future__ import annotations

import logging
import os
import sys
import tempfile
from pathlib import Path
from typing import Annotated, Any

import typer
from typer import _click as click

from meshctl import config
from meshctl.core.inject import documents
from meshctl.core.inject.settings import InjectSettings
from meshctl.core.inject.webhook_config import (
    REINVOCATION_POLICIES,
    WebhookTarget,
    webhook_configuration,
)
from meshctl.errors import MeshctlError
from meshctl.output import OutputFormat, render

from .diff import unified_diff

log = logging.getLogger(__name__)

SECTION = "inject"  # the settings file's section for these commands

app = typer.Typer(
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
    invoke_without_command=True,
    no_args_is_help=False,
)

ImageOption = Annotated[
    str | None,
    typer.Option(
        "--image", metavar="IMAGE", help="Proxy and init image [env MESHCTL_INJECT_IMAGE]"
    ),
]
RevisionOption = Annotated[
    str | None,
    typer.Option("--revision", metavar="R", help="Control-plane revision [default: default]"),
]
ProxyUidOption = Annotated[
    int | None,
    typer.Option("--proxy-uid", metavar="UID", help="Proxy uid (and gid) [default: 1337]"),
]
NativeSidecarOption = Annotated[
    str | None,
    typer.Option(
        "--native-sidecar",
        metavar="true|false",
        help="Proxy as a native sidecar (restartable init container) [default: true]",
    ),
]
CniOption = Annotated[
    bool | None,
    typer.Option(
        "--cni", help="CNI mode: no privileged init container; annotations for the CNI plugin"
    ),
]


def _settings(ctx: typer.Context, **flags: Any) -> InjectSettings:
    """Flags > env > the settings file's ``inject:`` section > defaults."""
    section, name = config.file_section(ctx.meta, SECTION)
    return config.resolve(InjectSettings, flags=flags, file=section, file_name=name)


@app.callback()
def inject(
    ctx: typer.Context,
    filename: Annotated[
        str | None,
        typer.Option("-f", "--filename", metavar="FILE", help="Manifest to inject; - reads stdin."),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("-o", "--output", metavar="FILE", help="Write here instead of stdout."),
    ] = None,
    diff: Annotated[
        bool, typer.Option("--diff", help="Show a unified diff of the change instead.")
    ] = False,
    color: Annotated[
        str,
        typer.Option(
            "--color", metavar="auto|always|never", help="Colour the --diff (auto: on a terminal)."
        ),
    ] = "auto",
    uninject: Annotated[
        bool, typer.Option("--uninject", help="Remove an earlier injection instead.")
    ] = False,
    cni: CniOption = None,
    revision: RevisionOption = None,
    image: ImageOption = None,
    proxy_uid: ProxyUidOption = None,
    native_sidecar: NativeSidecarOption = None,
) -> None:
    """Add the mesh sidecar to every workload in a manifest (offline; YAML in, YAML out).

    Handles Pod, Deployment, StatefulSet, DaemonSet, ReplicaSet, ReplicationController, Job,
    CronJob and List, in multi-document files; other objects pass through unchanged. Injecting
    twice changes nothing; --uninject restores the original.

        meshctl inject -f deploy.yaml | kubectl apply -f -
    """
    if ctx.invoked_subcommand is not None:
        if filename is not None:
            raise click.exceptions.UsageError(
                f"-f belongs to 'meshctl inject' itself, not to '{ctx.invoked_subcommand}'"
            )
        return
    if filename is None:
        raise click.exceptions.UsageError("give the manifest with -f FILE (or -f - for stdin)")
    if color not in ("auto", "always", "never"):
        raise click.exceptions.BadParameter("use auto, always or never", param_hint="--color")
    settings = _settings(
        ctx,
        cni=cni,
        revision=revision,
        image=image,
        proxy_uid=proxy_uid,
        native_sidecar=native_sidecar,
    )
    source = "<stdin>" if filename == "-" else filename
    text = _read_manifest(filename)
    parsed = documents.load(text, source)
    objects, skipped = documents.inject_documents(parsed, source, settings, uninject=uninject)
    for item in skipped:
        if item.warning:
            typer.echo(f"Warning: {item.where}: {item.reason}", err=True)
        else:
            log.info("not injected: %s (%s)", item.where, item.reason)
    result = documents.dump(objects)
    if diff:
        colour = color == "always" or (color == "auto" and output is None and sys.stdout.isatty())
        result = unified_diff(
            documents.dump([d.data for d in parsed]),
            result,
            from_name=f"{source} (original)",
            to_name=f"{source} ({'uninjected' if uninject else 'injected'})",
            colour=colour,
        )
    _write(result, output)


def _read_manifest(filename: str) -> str:
    try:
        data = sys.stdin.buffer.read() if filename == "-" else Path(filename).read_bytes()
    except OSError as exc:
        raise MeshctlError(
            f"cannot read {filename}: {exc.strerror or exc}",
            hint="check the path given with -f (use -f - to read stdin)",
        ) from exc
    try:
        # utf-8-sig: a byte-order mark some editors write is not part of the YAML.
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise MeshctlError(
            f"{filename} is not UTF-8 text (byte {exc.start} cannot be decoded)",
            hint="save the manifest as UTF-8",
        ) from exc


def _write(text: str, output: Path | None) -> None:
    """Writes ``text`` to stdout, or atomically to ``output`` (a reader never sees half)."""
    if output is None:
        sys.stdout.write(text)
        sys.stdout.flush()
        return
    target = output.expanduser()
    try:
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise MeshctlError(
            f"cannot write {output}: {exc.strerror or exc}",
            hint="check that the directory exists and is writable",
        ) from exc
    staged = Path(temp)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
        # mkstemp makes the file 0600; keep the mode of the file replaced, else 0644 less umask.
        try:
            mode = target.stat().st_mode & 0o777
        except FileNotFoundError:
            umask = os.umask(0)
            os.umask(umask)
            mode = 0o666 & ~umask
        staged.chmod(mode)
        staged.replace(target)
    except OSError as exc:
        staged.unlink(missing_ok=True)
        raise MeshctlError(
            f"cannot write {output}: {exc.strerror or exc}", hint="check the path and free space"
        ) from exc


@app.command("webhook")
def webhook(
    ctx: typer.Context,
    tls_cert: Annotated[
        Path, typer.Option("--tls-cert", metavar="FILE", help="Serving certificate (PEM).")
    ],
    tls_key: Annotated[Path, typer.Option("--tls-key", metavar="FILE", help="Its key (PEM).")],
    port: Annotated[int, typer.Option("--port", help="HTTPS port to listen on.")] = 15017,
    address: Annotated[
        str, typer.Option("--address", metavar="IP", help="Address to listen on.")
    ] = "0.0.0.0",  # noqa: S104 -- in a pod the API server reaches the webhook on the pod IP
    drain_seconds: Annotated[
        float,
        typer.Option(
            "--drain-seconds", metavar="S", help="On SIGTERM, let requests finish this long."
        ),
    ] = 5.0,
    reload_interval: Annotated[
        float,
        typer.Option(
            "--reload-interval",
            metavar="S",
            help="Check the certificate files this often; a rotated pair is loaded in place.",
        ),
    ] = 2.0,
    cni: CniOption = None,
    revision: RevisionOption = None,
    image: ImageOption = None,
    proxy_uid: ProxyUidOption = None,
    native_sidecar: NativeSidecarOption = None,
) -> None:
    """Serve the injection webhook over HTTPS (HTTP/2 and HTTP/1.1) at /inject until stopped."""
    from .server import ServeOptions, serve  # deferred: only the server needs hypercorn

    if not reload_interval > 0:
        raise click.exceptions.BadParameter(
            f"{reload_interval} is not a positive number of seconds", param_hint="--reload-interval"
        )
    if not 0 < port < 65536:
        raise click.exceptions.BadParameter(
            f"{port} is not a port number (1-65535)", param_hint="--port"
        )
    settings = _settings(
        ctx,
        cni=cni,
        revision=revision,
        image=image,
        proxy_uid=proxy_uid,
        native_sidecar=native_sidecar,
    )
    options = ServeOptions(
        address=address,
        port=port,
        tls_cert=tls_cert,
        tls_key=tls_key,
        graceful_seconds=drain_seconds,
        reload_seconds=reload_interval,
    )
    serve(settings, options)


@app.command("webhook-config")
def webhook_config(
    ctx: typer.Context,
    ca_bundle: Annotated[
        Path,
        typer.Option(
            "--ca-bundle", metavar="FILE", help="CA certificate (PEM) that signed the webhook's."
        ),
    ],
    url: Annotated[
        str | None,
        typer.Option("--url", metavar="URL", help="Webhook URL, e.g. https://host:15017/inject"),
    ] = None,
    service: Annotated[
        str | None, typer.Option("--service", metavar="NAME", help="Or: the webhook's Service.")
    ] = None,
    namespace: Annotated[
        str, typer.Option("--namespace", metavar="NS", help="The Service's namespace.")
    ] = "meshctl-system",
    service_port: Annotated[int, typer.Option("--service-port", help="The Service's port.")] = 443,
    revision: RevisionOption = None,
    reinvocation_policy: Annotated[
        str,
        typer.Option(
            "--reinvocation-policy",
            metavar="|".join(REINVOCATION_POLICIES),
            help="Call again after later webhooks changed the pod (injection is idempotent).",
        ),
    ] = "Never",
    timeout: Annotated[
        int, typer.Option("--timeout", metavar="SECONDS", help="API server's call timeout.")
    ] = 10,
    output: Annotated[
        OutputFormat, typer.Option("-o", "--output", help="yaml or json.")
    ] = OutputFormat.YAML,
) -> None:
    """Print the MutatingWebhookConfiguration that sends new pods to the webhook."""
    if (url is None) == (service is None):
        raise click.exceptions.UsageError("give exactly one of --url and --service")
    if output is OutputFormat.TABLE:
        raise click.exceptions.BadParameter("use yaml or json", param_hint="-o")
    settings = _settings(ctx, revision=revision)
    try:
        bundle = ca_bundle.read_bytes()
    except OSError as exc:
        raise MeshctlError(
            f"cannot read {ca_bundle}: {exc.strerror or exc}",
            hint="pass the CA certificate file with --ca-bundle",
        ) from exc
    target = WebhookTarget(url=url, service=service, namespace=namespace, port=service_port)
    configuration = webhook_configuration(
        ca_bundle=bundle,
        target=target,
        revision=settings.revision,
        reinvocation_policy=reinvocation_policy,
        timeout_seconds=timeout,
    )
    typer.echo(render(configuration, output), nl=False)
