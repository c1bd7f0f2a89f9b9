"""The ``meshctl inject`` commands: inject files, serve the webhook, print its configuration.

Invariants of ``meshctl inject -f``: documents are read, injected and written one at a time, so
memory stays flat however long the input (``--diff`` alone holds it all, to compare); the output
is staged (in a temporary file beside ``-O``, or spooled for stdout) and released only once the
whole input was read and injected, so on any error nothing is written to stdout or to ``-O``
(the file is replaced atomically, never truncated). Input that holds no object at all is an
error, not an empty success. The injection options given on ``meshctl inject`` itself reach
``webhook`` and ``webhook-config`` (``meshctl.options.hold_group_options``).
"""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Annotated, Any, BinaryIO

import typer
from typer import _click as click

from meshctl import config, inputs, options
from meshctl.core.k8s.inject import documents
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.core.k8s.inject.webhook_config import (
    REINVOCATION_POLICIES,
    WebhookTarget,
    webhook_configuration,
)
from meshctl.core.k8s.layout import MESH_NAMESPACE
from meshctl.errors import MeshctlError, UserError
from meshctl.output import OutputFormat, render_objects
from meshctl.structured import Limits
from meshctl.terminal import Progress, colour_enabled

from .diff import unified_diff
from .staged import StagedOutput, writer_for

log = logging.getLogger(__name__)

SECTION = "inject"  # the settings file's section for these commands

app = options.command_app(invoke_without_command=True, no_args_is_help=False)

ImageOption = Annotated[
    str | None,
    options.from_setting(InjectSettings, "image", metavar="IMAGE", help="Proxy and init image."),
]
RevisionOption = Annotated[
    str | None,
    options.from_setting(
        InjectSettings,
        "revision",
        metavar="REVISION",
        help="Control-plane revision, e.g. canary (default: default).",
    ),
]
ProxyUidOption = Annotated[
    int | None,
    options.from_setting(InjectSettings, "proxy_uid", help="Proxy uid (and gid) (1337)."),
]
NativeSidecarOption = Annotated[
    str | None,
    options.from_setting(
        InjectSettings,
        "native_sidecar",
        metavar="true|false",
        help="Proxy as a native sidecar (restartable init container) (true).",
    ),
]
CniOption = Annotated[
    bool | None,
    options.from_setting(
        InjectSettings,
        "cni",
        help="CNI mode: no privileged init container; annotations for the CNI plugin.",
    ),
]


def _settings(ctx: typer.Context, **flags: Any) -> InjectSettings:
    """Flags > env > the settings file's ``inject:`` section > defaults."""
    section, name = config.file_section(ctx.meta, SECTION)
    return config.resolve(InjectSettings, flags=flags, file=section, file_name=name)


@app.callback()
def inject(
    ctx: typer.Context,
    filename: options.FilenameOption = None,
    recursive: options.RecursiveOption = False,
    output: options.OutputOption = OutputFormat.YAML,
    output_file: options.OutputFileOption = None,
    diff: Annotated[
        bool, typer.Option("--diff", help="Show a unified diff of the change instead.")
    ] = False,
    color: options.ColorOption = "auto",
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
        return  # its options were handed down (or refused) before this runs
    if not filename:
        raise click.exceptions.UsageError("give the manifest with -f FILE (or -f - for stdin)")
    if diff and output not in (OutputFormat.YAML, OutputFormat.JSON):
        raise click.exceptions.UsageError("--diff compares text: use it with -o yaml or -o json")
    settings = _settings(
        ctx,
        cni=cni,
        revision=revision,
        image=image,
        proxy_uid=proxy_uid,
        native_sidecar=native_sidecar,
    )
    names = options.source_names(filename, recursive=recursive)
    transform = documents.pod_transform(settings, uninject=uninject)
    limits = inputs.limits()
    verb = "uninjecting" if uninject else "injecting"
    if diff:
        text = _diff(names, transform, limits, output, uninject, color, output_file)
        _write(text, output_file)
        return
    with Progress() as progress, StagedOutput(output_file) as staged:
        out = writer_for(output, staged.handle)
        for name in names:
            stream, source = _open(name)
            progress.phase(f"{verb} {source}")
            try:
                for obj, skipped in documents.transform_stream(
                    documents.read(stream, source, limits), source, transform
                ):
                    _report(skipped)
                    out.add(obj)
                    progress.advance()
            except OSError as exc:
                raise options.cannot_read(name, exc) from exc
            finally:
                if name != "-":
                    stream.close()
        if not out.count:
            raise _nothing(names)
        out.finish()
        staged.commit()


def _open(name: str) -> tuple[BinaryIO, str]:
    try:
        return inputs.open_stream(name)
    except OSError as exc:
        raise options.cannot_read(name, exc) from exc


def _report(skipped: list[documents.Skipped]) -> None:
    for item in skipped:
        if item.warning:
            typer.echo(f"Warning: {item.where}: {item.reason}", err=True)
        else:
            log.info("not injected: %s (%s)", item.where, item.reason)


def _nothing(names: list[str]) -> MeshctlError:
    """Input with no object in it: the user's file is unusable, a usage error (2)."""
    shown = ", ".join(inputs.STDIN_NAME if n == "-" else n for n in names)
    return UserError(
        f"nothing to inject: no Kubernetes object was read from {shown}",
        hint="pass a manifest with objects, e.g. kubectl get deploy web -o yaml | "
        "meshctl inject -f -",
    )


def _diff(
    names: list[str],
    transform: documents.PodTransform,
    limits: Limits,
    output: OutputFormat,
    uninject: bool,
    color: str,
    output_file: Path | None,
) -> str:
    """The unified diff of the whole input against its injection (holds both in memory)."""
    with Progress() as progress:
        originals: list[Any] = []
        results: list[Any] = []
        for source in options.read_sources(names):
            progress.phase(f"{'uninjecting' if uninject else 'injecting'} {source.name}")
            parsed = list(documents.read(source.text, source.name, limits))
            for obj, skipped in documents.transform_stream(parsed, source.name, transform):
                _report(skipped)
                results.append(obj)
                progress.advance()
            originals.extend(d.data for d in parsed)
        if not results:
            raise _nothing(names)
        where = "input"
        if len(names) == 1:
            where = inputs.STDIN_NAME if names[0] == "-" else names[0]
        return unified_diff(
            _render(originals, output),
            _render(results, output),
            from_name=f"{where} (original)",
            to_name=f"{where} ({'uninjected' if uninject else 'injected'})",
            colour=colour_enabled(color, sys.stdout) if output_file is None else color == "always",
        )


def _render(objects: list[Any], fmt: OutputFormat) -> str:
    if fmt is OutputFormat.YAML:
        return documents.dump(objects)
    return render_objects(objects, fmt)


def _write(text: str, output: Path | None) -> None:
    """Writes ``text`` to stdout, or atomically to ``output`` (a reader never sees half)."""
    with StagedOutput(output) as staged:
        staged.handle.write(text)
        staged.commit()


@app.command("webhook")
def webhook(
    ctx: typer.Context,
    tls_cert: Annotated[
        Path, options.existing_file("--tls-cert", help="Serving certificate (PEM).")
    ],
    tls_key: Annotated[Path, options.existing_file("--tls-key", help="Its key (PEM).")],
    port: Annotated[int, options.port("--port", help="HTTPS port to listen on.")] = 15017,
    address: Annotated[
        str, options.address("--address", help="Address to listen on (:: for IPv6).")
    ] = "0.0.0.0",  # noqa: S104 -- in a pod the API server reaches the webhook on the pod IP
    drain_deadline: Annotated[
        float,
        options.duration(
            "--drain-deadline",
            maximum=3600,
            help="On SIGTERM, let requests finish this long.",
        ),
    ] = 5.0,
    # The name this option had before it was spelled as the other daemons spell it; kept so
    # that manifests written then keep working, and out of the help.
    drain_seconds: Annotated[
        float | None,
        options.duration(
            "--drain-seconds", maximum=3600, hidden=True, help="Old name of --drain-deadline."
        ),
    ] = None,
    reload_interval: Annotated[
        float,
        options.duration(
            "--reload-interval",
            positive=True,
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

    options.daemon_logging(ctx)
    settings = _settings(
        ctx,
        cni=cni,
        revision=revision,
        image=image,
        proxy_uid=proxy_uid,
        native_sidecar=native_sidecar,
    )
    serve_options = ServeOptions(
        address=address,
        port=port,
        tls_cert=tls_cert,
        tls_key=tls_key,
        graceful_seconds=drain_deadline if drain_seconds is None else drain_seconds,
        reload_seconds=reload_interval,
    )
    code = serve(settings, serve_options)
    if code:
        raise typer.Exit(code)


@app.command("webhook-config")
def webhook_config(
    ctx: typer.Context,
    ca_bundle: Annotated[
        Path,
        options.existing_file(
            "--ca-bundle", help="CA certificate (PEM) that signed the webhook's."
        ),
    ],
    url: Annotated[
        str | None,
        typer.Option("--url", metavar="URL", help="Webhook URL, e.g. https://host:15017/inject"),
    ] = None,
    service: Annotated[
        str | None, typer.Option("--service", metavar="NAME", help="Or: the webhook's Service.")
    ] = None,
    namespace: Annotated[str, options.namespace("The Service's namespace.")] = MESH_NAMESPACE,
    service_port: Annotated[int, options.port("--service-port", help="The Service's port.")] = 443,
    revision: RevisionOption = None,
    reinvocation_policy: Annotated[
        str,
        options.choice(
            "--reinvocation-policy",
            choices=REINVOCATION_POLICIES,
            help="Call again after later webhooks changed the pod (injection is idempotent).",
        ),
    ] = "Never",
    timeout: Annotated[
        float,
        options.duration(
            "--timeout",
            minimum=1,
            maximum=30,
            whole=True,
            help="API server's call timeout, whole seconds (the API allows 1s-30s; a bare "
            "number is seconds).",
        ),
    ] = 10.0,
    output: options.OutputOption = OutputFormat.YAML,
    output_file: options.OutputFileOption = None,
) -> None:
    """Print the MutatingWebhookConfiguration that sends new pods to the webhook."""
    if (url is None) == (service is None):
        raise click.exceptions.UsageError("give exactly one of --url and --service")
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
        timeout_seconds=int(timeout),
    )
    options.write_output(render_objects([configuration], output), output_file)
