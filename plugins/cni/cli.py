"""The ``meshctl cni`` commands: install (the DaemonSet's node agent), uninstall, manifest.

Invariants: settings resolve flag > env (Istio's names) > the ``cni:`` section of the settings
file > default, before anything touches the node; this module only wires (decisions live in
``meshctl.core.cni``, file work in installer.py, the long-running loop in daemon.py).
The CNI plugin itself is the raw ``cni-plugin`` entry point, in ``meshctl_plugins.cni_plugin``.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from meshctl import config
from meshctl.output import OutputFormat, render_objects

from .installer import Installer, InstallSettings

SECTION = "cni"

app = typer.Typer(
    help="Sidecar capture without init containers: the CNI plugin's node installer.",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

_Dir = Annotated[str | None, typer.Option(show_default=False)]


def _settings(ctx: typer.Context, flags: dict[str, Any]) -> InstallSettings:
    section, name = config.file_section(ctx.meta, SECTION)
    return config.resolve(InstallSettings, flags=flags, file=section, file_name=name)


@app.command("install")
def install_cmd(
    ctx: typer.Context,
    cni_bin_dir: Annotated[
        str | None, typer.Option("--cni-bin-dir", help="Host CNI bin dir [CNI_BIN_DIR].")
    ] = None,
    cni_conf_dir: Annotated[
        str | None,
        typer.Option("--cni-conf-dir", help="Host CNI conf dir [MOUNTED_CNI_NET_DIR]."),
    ] = None,
    cni_conf_name: Annotated[
        str | None,
        typer.Option("--cni-conf-name", help="Config file to merge into (default: first valid)."),
    ] = None,
    run_dir: Annotated[
        str | None, typer.Option("--run-dir", help="Plugin run dir [CNI_AGENT_RUN_DIR].")
    ] = None,
    service_account_dir: Annotated[
        str | None, typer.Option("--service-account-dir", help="Where token and ca.crt are.")
    ] = None,
    kube_server: Annotated[
        str | None,
        typer.Option("--kube-server", help="API server URL for the plugin (default: in-cluster)."),
    ] = None,
    kube_ca_file: Annotated[
        str | None, typer.Option("--kube-ca-file", help="CA bundle (default: the SA's ca.crt).")
    ] = None,
    exclude_namespaces: Annotated[
        str | None,
        typer.Option("--exclude-namespaces", help="Never captured [EXCLUDE_NAMESPACES]."),
    ] = None,
    iptables_backend: Annotated[
        str | None, typer.Option("--iptables-backend", help="iptc (default), legacy, nft, auto.")
    ] = None,
    readiness_address: Annotated[
        str | None,
        typer.Option("--readiness-address", help="HOST:PORT of /readyz (0.0.0.0:8000; '' off)."),
    ] = None,
    poll_interval: Annotated[
        str | None, typer.Option("--poll-interval", help="Seconds between checks (0.5).")
    ] = None,
    plugin_tree: Annotated[
        str | None,
        typer.Option(
            "--plugin-tree",
            help="One-dir tree to install as the plugin (default: the one this binary runs "
            "from) [MESHCTL_CNI_PLUGIN_TREE].",
        ),
    ] = None,
    ambient: Annotated[
        bool | None,
        typer.Option(
            "--ambient/--no-ambient",
            help="Also run the ambient node agent (enroll pods for the node proxy) "
            "[AMBIENT_ENABLED].",
            show_default=False,
        ),
    ] = None,
    node_name: Annotated[
        str | None, typer.Option("--node-name", help="This node's name [NODE_NAME].")
    ] = None,
    ztunnel_socket: Annotated[
        str | None,
        typer.Option(
            "--ztunnel-socket",
            help="ZDS socket the node proxy connects to (/var/run/ztunnel/ztunnel.sock) "
            "[ZTUNNEL_UDS_ADDRESS].",
        ),
    ] = None,
) -> None:
    """Install the plugin on this node, keep it installed, and remove it on SIGTERM."""
    import asyncio

    from . import daemon

    settings = _settings(ctx, {k: v for k, v in locals().items() if k != "ctx"})
    _ = settings.server  # an unusable API address is a usage error now, not a warning loop later
    global_settings: config.GlobalSettings = ctx.obj
    installer = Installer(settings)  # so is an unusable --plugin-tree

    async def main() -> int:
        agent = _agent(settings, global_settings) if settings.ambient else None
        return await daemon.run(settings, installer, agent=agent)

    raise typer.Exit(asyncio.run(main()))


def _agent(settings: InstallSettings, global_settings: config.GlobalSettings) -> Any:
    """The ambient node agent, connected to the API (in-cluster, or ``--kubeconfig``)."""
    from meshctl.errors import ConfigError
    from meshctl.kube.client import KubeSettings, connect

    from .ambient import AgentSettings, AmbientAgent

    if not settings.node_name:
        raise ConfigError(
            "ambient mode needs this node's name",
            hint="pass --node-name or set NODE_NAME (the DaemonSet sets it from spec.nodeName)",
        )
    if settings.ambient_dns_capture:
        raise ConfigError(
            "AMBIENT_DNS_CAPTURE=true: the node proxy has no DNS proxy on 15053 yet, so capturing "
            "the pods' DNS would break their name resolution",
            hint="unset AMBIENT_DNS_CAPTURE (pods resolve names directly)",
        )
    kube = connect(
        KubeSettings(kubeconfig=global_settings.kubeconfig, context=global_settings.context)
    )
    return AmbientAgent(
        AgentSettings(
            node_name=settings.node_name,
            run_dir=settings.run_dir,
            zds_socket=settings.ztunnel_socket,
            exclude_namespaces=settings.exclude_namespaces,
            iptables_backend=settings.iptables_backend,
            # The node's tables too: in-process, so an image without iptables binaries works.
            host_backend=settings.iptables_backend,
            dns_capture=settings.ambient_dns_capture,
            ipv6=settings.ambient_ipv6,
        ),
        kube,
    )


@app.command("uninstall")
def uninstall_cmd(
    ctx: typer.Context,
    cni_bin_dir: Annotated[str | None, typer.Option("--cni-bin-dir")] = None,
    cni_conf_dir: Annotated[str | None, typer.Option("--cni-conf-dir")] = None,
    run_dir: Annotated[str | None, typer.Option("--run-dir")] = None,
) -> None:
    """Remove the plugin's entry, binary and kubeconfig: the node's config as it was."""
    settings = _settings(ctx, {k: v for k, v in locals().items() if k != "ctx"})
    # The binary to compare against is irrelevant for removal; skip building the launcher.
    done = Installer(settings, binary=b"").cleanup(everything=True)
    typer.echo(f"uninstalled: {', '.join(done) or 'nothing was installed'}", err=True)


@app.command("manifest")
def manifest_cmd(
    namespace: Annotated[str, typer.Option("--namespace", "-n")] = "meshctl-system",
    image: Annotated[
        str | None, typer.Option("--image", help="meshctl image (localhost/meshctl:<version>).")
    ] = None,
    cni_bin_dir: Annotated[str, typer.Option("--cni-bin-dir", help="Host path.")] = "/opt/cni/bin",
    cni_conf_dir: Annotated[
        str, typer.Option("--cni-conf-dir", help="Host path.")
    ] = "/etc/cni/net.d",
    output: Annotated[OutputFormat, typer.Option("-o", "--output")] = OutputFormat.YAML,
    ambient: Annotated[
        bool, typer.Option("--ambient", help="With the ambient node agent (istio-cni's).")
    ] = False,
    netns_dir: Annotated[
        str,
        typer.Option("--netns-dir", help="Ambient: where the runtime pins pod netns (host path)."),
    ] = "/var/run/netns",
) -> None:
    """Print the DaemonSet (and its RBAC) that runs 'meshctl cni install' on every node."""
    from .manifest import objects

    items = objects(
        namespace=namespace,
        image=image,
        cni_bin_dir=cni_bin_dir,
        cni_conf_dir=cni_conf_dir,
        ambient=ambient,
        netns_dir=netns_dir,
    )
    if output is OutputFormat.TABLE:
        raise typer.BadParameter("use -o yaml or -o json", param_hint="-o")
    typer.echo(render_objects(items, output), nl=False)
