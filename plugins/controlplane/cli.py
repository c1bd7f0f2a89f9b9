"""The ``meshctl controlplane`` commands: ``run`` (the Deployment's process) and ``manifest``.

Invariant: settings resolve flag > env (istiod's names) > the ``controlplane:`` section of the
settings file > default, and are checked before anything connects; the injection settings the
webhook uses come from the ``inject:`` section, with the CA address, trust domain, cluster id and
revision following the control plane's own unless set there.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any

import typer

from meshctl import config, options, values
from meshctl.core.k8s import layout
from meshctl.output import OutputFormat, render_objects

from .settings import DEFAULT_REPLICAS, MAX_REPLICAS, ControlPlaneSettings

SECTION = "controlplane"

app = options.command_app(
    help="The control plane: workload CA, discovery, injection webhook and root distribution.",
    no_args_is_help=True,
)


def _settings(ctx: typer.Context, flags: Mapping[str, object]) -> ControlPlaneSettings:
    section, name = config.file_section(ctx.meta, SECTION)
    return config.resolve(ControlPlaneSettings, flags=flags, file=section, file_name=name)


def inject_settings(ctx: typer.Context, settings: ControlPlaneSettings) -> Any:
    """The webhook's injection settings: the ``inject:`` section, defaults from ``settings``."""
    from meshctl.core.k8s.inject.settings import InjectSettings

    section, name = config.file_section(ctx.meta, "inject")
    base = config.resolve(InjectSettings, file=section, file_name=name)
    defaults = InjectSettings()

    def follow(name: str, ours: str) -> str:
        """``ours``, unless the ``inject:`` section set ``name``."""
        theirs: str = getattr(base, name)
        return ours if theirs == getattr(defaults, name) else theirs

    return dataclasses.replace(
        base,
        revision=follow("revision", settings.revision),
        trust_domain=follow("trust_domain", settings.trust_domain),
        cluster_id=follow("cluster_id", settings.cluster_id),
        # This replica's own Service (its namespace may not be meshctl-system).
        ca_address=follow(
            "ca_address", layout.control_plane_address(settings.namespace, settings.revision)
        ),
    )


def _setting(field: str, *names: str, help: str, metavar: str | None = None) -> Any:  # noqa: A002
    """The option for ``ControlPlaneSettings.<field>``: its env var (istiod's name) in the help."""
    return options.from_setting(ControlPlaneSettings, field, *names, help=help, metavar=metavar)


@app.command("run")
def run_cmd(
    ctx: typer.Context,
    namespace: Annotated[
        str | None,
        _setting("namespace", "--namespace", "-n", help="Where our objects live.", metavar="NAME"),
    ] = None,
    trust_domain: Annotated[
        str | None, _setting("trust_domain", help="SPIFFE trust domain.", metavar="DOMAIN")
    ] = None,
    revision: Annotated[
        str | None, _setting("revision", help="Control-plane revision.", metavar="NAME")
    ] = None,
    trusted_node_accounts: Annotated[
        str | None,
        _setting(
            "trusted_node_accounts",
            help="Node proxies that may impersonate (comma list).",
            metavar="NS/SA",
        ),
    ] = None,
    max_workload_cert_ttl: Annotated[
        str | None,
        _setting(
            "max_workload_cert_ttl", help="Longest workload certificate (90d).", metavar="DURATION"
        ),
    ] = None,
    default_workload_cert_ttl: Annotated[
        str | None,
        _setting(
            "default_workload_cert_ttl",
            help="When a request names none (24h).",
            metavar="DURATION",
        ),
    ] = None,
    grpc_address: Annotated[
        str | None,
        _setting("grpc_address", help="CA + discovery, TLS (:15012).", metavar="HOST:PORT"),
    ] = None,
    webhook_address: Annotated[
        str | None,
        _setting("webhook_address", help="Injection webhook, HTTPS (:15017).", metavar="HOST:PORT"),
    ] = None,
    metrics_address: Annotated[
        str | None,
        _setting(
            "metrics_address",
            "--monitoring-address",
            help="Prometheus /metrics (:15014).",
            metavar="HOST:PORT",
        ),
    ] = None,
    readiness_address: Annotated[
        str | None,
        _setting("readiness_address", help="Readiness /ready (:8080).", metavar="HOST:PORT"),
    ] = None,
    serving_names: Annotated[
        str | None,
        _setting(
            "serving_names",
            help="More DNS names/IPs for the serving certificate (comma list).",
            metavar="NAMES",
        ),
    ] = None,
    self_signed_ca_key: Annotated[
        str | None, _setting("self_signed_ca_key", help="Key of a root we mint.")
    ] = None,
    drain_deadline: Annotated[
        str | None,
        _setting("drain_deadline", help="On SIGTERM, finish within (10s).", metavar="DURATION"),
    ] = None,
) -> None:
    """Run the control plane: CA and discovery on 15012, the webhook on 15017, until SIGTERM."""
    flags = {k: v for k, v in locals().items() if k != "ctx"}
    import asyncio

    from meshctl.kube.client import connect

    from .cluster import Discovery
    from .gateway_configs import GatewayConfigs
    from .gateway_controller import GatewayController
    from .plane import ControlPlane

    options.daemon_logging(ctx)
    settings = _settings(ctx, flags)
    inject = inject_settings(ctx, settings)
    kube = connect(options.kube_settings(ctx))  # --kubeconfig, --context, --request-timeout
    try:
        configs = GatewayConfigs()  # the gateway controller's, served by discovery
        discovery = Discovery(settings, configs)
        gateways = GatewayController(
            settings, configs, discovery.store, inject, store_synced=discovery.synced
        )
        plane = ControlPlane(settings, kube, inject, components=[discovery, gateways])
        code = asyncio.run(plane.run())
    finally:
        kube.api.close()
    raise typer.Exit(code)


@app.command("ca")
def ca_cmd(
    ctx: typer.Context,
    ca_dir: Annotated[
        Path,
        options.output_directory(
            "--ca-dir",
            help="ca-cert.pem + ca-key.pem (+ cert-chain.pem, root-cert.pem); minted if empty.",
        ),
    ],
    tokens: Annotated[
        Path,
        options.existing_file(
            "--tokens",
            help="Callers: token,system:serviceaccount:NS:SA,uid lines (--token-auth-file CSV).",
        ),
    ],
    trust_domain: Annotated[
        str | None, _setting("trust_domain", help="SPIFFE trust domain.", metavar="DOMAIN")
    ] = None,
    grpc_address: Annotated[
        str | None, _setting("grpc_address", help="CA, TLS (:15012).", metavar="HOST:PORT")
    ] = None,
    serving_names: Annotated[
        str | None,
        _setting("serving_names", help="DNS names/IPs proxies dial (comma list).", metavar="NAMES"),
    ] = None,
    max_workload_cert_ttl: Annotated[
        str | None,
        _setting(
            "max_workload_cert_ttl", help="Longest workload certificate (90d).", metavar="DURATION"
        ),
    ] = None,
    trusted_node_accounts: Annotated[
        str | None,
        _setting(
            "trusted_node_accounts",
            help="Node proxies that may impersonate ANY identity of the trust domain (comma "
            "list; none by default): no node inventory here, so for one node only.",
            metavar="NS/SA",
        ),
    ] = None,
) -> None:
    """Run only the CA, without Kubernetes: Istio's CreateCertificate on 15012, callers
    authenticated by a static token file (a laptop, a VM, 'meshctl demo')."""
    flags = {k: v for k, v in locals().items() if k not in ("ctx", "ca_dir", "tokens")}
    options.daemon_logging(ctx)  # info unless a level was given: the listening and ready lines
    import asyncio

    from .standalone import serve

    section, name = config.file_section(ctx.meta, SECTION)
    if "trusted_node_accounts" not in section and "trusted-node-accounts" not in section:
        # Unlike ``run``, no node account is trusted unless asked for: here trust is not
        # limited to a node's pods, so it must be a deliberate choice.
        section = {**section, "trusted_node_accounts": []}
    settings = config.resolve(ControlPlaneSettings, flags=flags, file=section, file_name=name)
    raise typer.Exit(asyncio.run(serve(settings, ca_dir, tokens)))


@app.command("manifest")
def manifest_cmd(
    ctx: typer.Context,
    namespace: Annotated[str, options.namespace("Namespace of the control plane.")] = (
        layout.MESH_NAMESPACE
    ),
    image: options.ImageOption = None,
    revision: Annotated[
        str, typer.Option("--revision", metavar="NAME", help="Control-plane revision.")
    ] = layout.DEFAULT_REVISION,
    replicas: Annotated[
        int,
        options.option(
            "--replicas",
            help="Replicas of the Deployment (one leads).",
            parse=values.Integer(1, MAX_REPLICAS, what="a replica count"),
        ),
    ] = DEFAULT_REPLICAS,
    output: options.OutputOption = OutputFormat.YAML,
    output_file: options.OutputFileOption = None,
) -> None:
    """Print the control plane's objects (RBAC, Service, Deployment, webhook configuration)."""
    from meshctl.core.k8s.install.components import standalone
    from meshctl.core.k8s.install.manifest import namespace_object

    from .manifest import ControlPlaneValues, objects

    install = dataclasses.replace(standalone(namespace, image), revision=revision)
    # The install's values type (components.controlplane.*), whose defaults are these options'.
    own = ControlPlaneValues(replicas=replicas)
    items = [namespace_object(namespace), *objects(install, own)]
    options.write_output(render_objects(items, output), output_file)
