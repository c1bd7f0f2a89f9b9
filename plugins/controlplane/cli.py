"""The ``meshctl controlplane`` commands: ``run`` (the Deployment's process) and ``manifest``.

Invariant: settings resolve flag > env (istiod's names) > the ``controlplane:`` section of the
settings file > default, and are checked before anything connects; the injection settings the
webhook uses come from the ``inject:`` section, with the CA address, trust domain, cluster id and
revision following the control plane's own unless set there.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated, Any

import typer

from meshctl import config
from meshctl.output import OutputFormat, render_objects

from .settings import ControlPlaneSettings

SECTION = "controlplane"

app = typer.Typer(
    help="The control plane: workload CA, discovery, injection webhook and root distribution.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)


def _settings(ctx: typer.Context, flags: dict[str, Any]) -> ControlPlaneSettings:
    section, name = config.file_section(ctx.meta, SECTION)
    return config.resolve(ControlPlaneSettings, flags=flags, file=section, file_name=name)


def inject_settings(ctx: typer.Context, settings: ControlPlaneSettings) -> Any:
    """The webhook's injection settings: the ``inject:`` section, defaults from ``settings``."""
    from meshctl.core.inject.settings import InjectSettings

    section, name = config.file_section(ctx.meta, "inject")
    base = config.resolve(InjectSettings, file=section, file_name=name)
    defaults = InjectSettings()
    own: dict[str, Any] = {
        "revision": settings.revision,
        "trust_domain": settings.trust_domain,
        "cluster_id": settings.cluster_id,
        # This replica's own Service (its namespace may not be meshctl-system).
        "ca_address": f"{settings.service_name}.{settings.namespace}.svc:15012",
    }
    changes = {k: v for k, v in own.items() if getattr(base, k) == getattr(defaults, k)}
    return dataclasses.replace(base, **changes)


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    namespace: Annotated[
        str | None,
        typer.Option("--namespace", "-n", help="Where our objects live [POD_NAMESPACE]."),
    ] = None,
    trust_domain: Annotated[
        str | None, typer.Option("--trust-domain", help="SPIFFE trust domain [TRUST_DOMAIN].")
    ] = None,
    revision: Annotated[
        str | None, typer.Option("--revision", help="Control-plane revision [REVISION].")
    ] = None,
    trusted_node_accounts: Annotated[
        str | None,
        typer.Option(
            "--trusted-node-accounts",
            help="NS/SA of node proxies that may impersonate [CA_TRUSTED_NODE_ACCOUNTS].",
        ),
    ] = None,
    max_workload_cert_ttl: Annotated[
        str | None,
        typer.Option("--max-workload-cert-ttl", help="Longest workload certificate (90d)."),
    ] = None,
    default_workload_cert_ttl: Annotated[
        str | None,
        typer.Option("--default-workload-cert-ttl", help="When a request names none (24h)."),
    ] = None,
    grpc_address: Annotated[
        str | None, typer.Option("--grpc-address", help="CA + discovery, TLS (:15012).")
    ] = None,
    webhook_address: Annotated[
        str | None, typer.Option("--webhook-address", help="Injection webhook, HTTPS (:15017).")
    ] = None,
    metrics_address: Annotated[
        str | None, typer.Option("--monitoring-address", help="Prometheus /metrics (:15014).")
    ] = None,
    readiness_address: Annotated[
        str | None, typer.Option("--readiness-address", help="Readiness /ready (:8080).")
    ] = None,
    serving_names: Annotated[
        str | None,
        typer.Option(
            "--serving-names", help="More DNS names/IPs for the serving certificate (comma list)."
        ),
    ] = None,
    self_signed_ca_key: Annotated[
        str | None,
        typer.Option("--self-signed-ca-key", help="Key of a root we mint: ec-p256 or rsa-2048."),
    ] = None,
    drain_deadline: Annotated[
        str | None, typer.Option("--drain-deadline", help="On SIGTERM, finish within (10s).")
    ] = None,
) -> None:
    """Run the control plane: CA and discovery on 15012, the webhook on 15017, until SIGTERM."""
    flags = {k: v for k, v in locals().items() if k != "ctx"}
    import asyncio

    from meshctl.kube.client import KubeSettings, connect

    from .cluster import Discovery
    from .plane import ControlPlane

    settings = _settings(ctx, flags)
    inject = inject_settings(ctx, settings)
    global_settings: config.GlobalSettings = ctx.obj
    kube = connect(
        KubeSettings(kubeconfig=global_settings.kubeconfig, context=global_settings.context)
    )
    try:
        plane = ControlPlane(settings, kube, inject, components=[Discovery(settings)])
        code = asyncio.run(plane.run())
    finally:
        kube.api.close()
    raise typer.Exit(code)


@app.command("ca")
def ca_cmd(
    ctx: typer.Context,
    ca_dir: Annotated[
        Path,
        typer.Option(
            "--ca-dir",
            help="ca-cert.pem + ca-key.pem (+ cert-chain.pem, root-cert.pem); minted if empty.",
        ),
    ],
    tokens: Annotated[
        Path,
        typer.Option(
            "--tokens",
            help="Callers: token,system:serviceaccount:NS:SA,uid lines (--token-auth-file CSV).",
        ),
    ],
    trust_domain: Annotated[
        str | None, typer.Option("--trust-domain", help="SPIFFE trust domain [TRUST_DOMAIN].")
    ] = None,
    grpc_address: Annotated[
        str | None, typer.Option("--grpc-address", help="CA, TLS (:15012).")
    ] = None,
    serving_names: Annotated[
        str | None,
        typer.Option("--serving-names", help="DNS names/IPs proxies dial (comma list)."),
    ] = None,
    max_workload_cert_ttl: Annotated[
        str | None,
        typer.Option("--max-workload-cert-ttl", help="Longest workload certificate (90d)."),
    ] = None,
) -> None:
    """Run only the CA, without Kubernetes: Istio's CreateCertificate on 15012, callers
    authenticated by a static token file (a laptop, a VM, 'meshctl demo')."""
    flags = {k: v for k, v in locals().items() if k not in ("ctx", "ca_dir", "tokens")}
    import asyncio

    from .standalone import serve

    settings = _settings(ctx, flags)
    raise typer.Exit(asyncio.run(serve(settings, ca_dir, tokens)))


@app.command("manifest")
def manifest_cmd(
    ctx: typer.Context,
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "meshctl-system",
    image: Annotated[str | None, typer.Option("--image", help="meshctl image.")] = None,
    revision: Annotated[str, typer.Option("--revision")] = "default",
    replicas: Annotated[int, typer.Option("--replicas", min=1)] = 2,
    output: Annotated[OutputFormat, typer.Option("-o", "--output")] = OutputFormat.YAML,
) -> None:
    """Print the control plane's objects (RBAC, Service, Deployment, webhook configuration)."""
    from meshctl.core.image import default_image

    from .manifest import ManifestSettings, objects

    if output is OutputFormat.TABLE:
        raise typer.BadParameter("use -o yaml or -o json", param_hint="-o")
    items = objects(
        ManifestSettings(
            namespace=namespace,
            image=image or default_image(),
            revision=revision,
            replicas=replicas,
        )
    )
    typer.echo(render_objects(items, output), nl=False)
