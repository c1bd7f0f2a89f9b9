"""The ``meshctl cni`` commands: install (the DaemonSet's node agent), uninstall, manifest.

Invariants: settings resolve flag > env (Istio's names) > the ``cni:`` section of the settings
file > default, before anything touches the node; this module only wires (decisions live in
``meshctl.core.k8s.cni``, file work in installer.py, the long-running loop in daemon.py).
The CNI plugin itself is the raw ``cni-plugin`` entry point, in ``meshctl_plugins.cni_plugin``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshctl import config, options
from meshctl.core.k8s import layout
from meshctl.output import OutputFormat, render_objects

from .installer import Installer, InstallSettings

if TYPE_CHECKING:
    from meshctl.kube.client import KubeSettings

SECTION = "cni"

app = options.command_app(
    help="Sidecar capture without init containers: the CNI plugin's node installer.",
    no_args_is_help=True,
)


def _setting(field: str, help: str, metavar: str | None = None) -> Any:  # noqa: A002
    """The option for ``InstallSettings.<field>``: flag and env var (Istio's names) from it."""
    return options.from_setting(InstallSettings, field, help=help, metavar=metavar)


def _settings(ctx: typer.Context, flags: Mapping[str, object]) -> InstallSettings:
    section, name = config.file_section(ctx.meta, SECTION)
    return config.resolve(InstallSettings, flags=flags, file=section, file_name=name)


BinDirOption = Annotated[str | None, _setting("cni_bin_dir", "Host CNI bin dir.", "DIR")]
ConfDirOption = Annotated[str | None, _setting("cni_conf_dir", "Host CNI conf dir.", "DIR")]
RunDirOption = Annotated[str | None, _setting("run_dir", "The plugin's run dir.", "DIR")]


@app.command("install")
def install_cmd(
    ctx: typer.Context,
    cni_bin_dir: BinDirOption = None,
    cni_conf_dir: ConfDirOption = None,
    cni_conf_name: Annotated[
        str | None,
        _setting("cni_conf_name", "Config file to merge into (default: first valid).", "FILE"),
    ] = None,
    run_dir: RunDirOption = None,
    service_account_dir: Annotated[
        str | None, _setting("service_account_dir", "Where token and ca.crt are.", "DIR")
    ] = None,
    kube_server: Annotated[
        str | None,
        _setting("kube_server", "API server URL for the plugin (default: in-cluster).", "URL"),
    ] = None,
    kube_ca_file: Annotated[
        str | None, _setting("kube_ca_file", "CA bundle (default: the SA's ca.crt).", "FILE")
    ] = None,
    exclude_namespaces: Annotated[
        str | None, _setting("exclude_namespaces", "Never captured.", "NAMESPACES")
    ] = None,
    iptables_backend: Annotated[
        str | None, _setting("iptables_backend", "How the plugin writes rules (iptc).")
    ] = None,
    readiness_address: Annotated[
        str | None,
        _setting(
            "readiness_address",
            "Where /readyz and /healthz answer (0.0.0.0:8000; '' off).",
            "HOST:PORT",
        ),
    ] = None,
    poll_interval: Annotated[
        float | None, _setting("poll_interval", "How often the node's files are checked (0.5s).")
    ] = None,
    plugin_tree: Annotated[
        str | None,
        _setting(
            "plugin_tree",
            "One-dir tree to install as the plugin (default: the one this binary runs from).",
            "DIR",
        ),
    ] = None,
    ambient: Annotated[
        bool | None,
        typer.Option(
            "--ambient/--no-ambient",
            help=options.env_help(
                "Also run the ambient node agent (enroll pods for the node proxy).",
                "AMBIENT_ENABLED",
            ),
            show_default=False,
        ),
    ] = None,
    node_name: Annotated[str | None, _setting("node_name", "This node's name.", "NODE")] = None,
    local_inventory: Annotated[
        str | None,
        _setting(
            "local_inventory",
            "No API server: this node's Pods and Namespaces from FILE (a v1 List YAML, re-read "
            "on change), for the agent and the plugin.",
            "FILE",
        ),
    ] = None,
    ztunnel_socket: Annotated[
        str | None,
        _setting(
            "ztunnel_socket",
            "ZDS socket the node proxy connects to (/var/run/ztunnel/ztunnel.sock).",
            "PATH",
        ),
    ] = None,
) -> None:
    """Install the plugin on this node, keep it installed, and remove it on SIGTERM."""
    flags = {k: v for k, v in locals().items() if k != "ctx"}
    import asyncio

    from . import daemon

    options.daemon_logging(ctx)
    settings = _settings(ctx, flags)
    if not settings.local_inventory:
        _ = settings.server  # an unusable API address is a usage error now, not a loop later
    installer = Installer(settings)  # so is an unusable --plugin-tree
    kube_settings = options.kube_settings(ctx)  # --kubeconfig, --context, --request-timeout
    inventory = _inventory(settings)  # so is an unusable --local-inventory

    async def main() -> int:
        agent = _agent(settings, kube_settings, inventory) if settings.ambient else None
        return await daemon.run(settings, installer, agent=agent)

    raise typer.Exit(asyncio.run(main()))


def _inventory(settings: InstallSettings) -> Any:
    """The ``--local-inventory`` file, read once now (a bad one stops the start), or None."""
    if not settings.local_inventory or not settings.ambient:
        return None
    from pathlib import Path

    from .podfile import InventoryFile

    return InventoryFile(Path(settings.local_inventory), node_name=settings.node_name)


def _agent(settings: InstallSettings, kube_settings: KubeSettings, inventory: Any) -> Any:
    """The ambient node agent, connected to the API (in-cluster, or ``--kubeconfig``), or
    reading ``--local-inventory``."""
    from meshctl.errors import ConfigError
    from meshctl.kube.client import connect
    from meshctl.kube.informer import Informers

    from .ambient import AgentSettings, AmbientAgent
    from .apiserver import ClusterPods, KubePodApi, LocalPodApi

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
    agent_settings = AgentSettings(
        node_name=settings.node_name,
        run_dir=settings.run_dir,
        zds_socket=settings.ztunnel_socket,
        exclude_namespaces=settings.exclude_namespaces,
        iptables_backend=settings.iptables_backend,
        # The node's tables: the kind its kubelet and kube-proxy use (never both on a host).
        host_backend="auto",
        dns_capture=settings.ambient_dns_capture,
        ipv6=settings.ambient_ipv6,
        netns_dir=settings.netns_dir,
        release_on_exit=settings.release_on_exit,
    )
    if inventory is not None:
        return AmbientAgent(agent_settings, inventory, LocalPodApi())
    kube = connect(kube_settings)
    own_pod = (settings.pod_namespace, settings.pod_name)
    api = KubePodApi(kube, node=settings.node_name, own_pod=own_pod)
    return AmbientAgent(agent_settings, ClusterPods(Informers(kube), settings.node_name), api)


@app.command("uninstall")
def uninstall_cmd(
    ctx: typer.Context,
    cni_bin_dir: BinDirOption = None,
    cni_conf_dir: ConfDirOption = None,
    run_dir: RunDirOption = None,
) -> None:
    """Remove the plugin's entry, binary and kubeconfig: the node's config as it was."""
    settings = _settings(ctx, {k: v for k, v in locals().items() if k != "ctx"})
    # The binary to compare against is irrelevant for removal; skip building the launcher.
    done = Installer(settings, binary=b"").cleanup(everything=True)
    typer.echo(f"uninstalled: {', '.join(done) or 'nothing was installed'}", err=True)


@app.command("manifest")
def manifest_cmd(
    namespace: Annotated[str, options.namespace("Namespace of the node agents.")] = (
        layout.MESH_NAMESPACE
    ),
    image: options.ImageOption = None,
    cni_bin_dir: Annotated[
        str, typer.Option("--cni-bin-dir", metavar="DIR", help="Host path.")
    ] = layout.HOST_CNI_BIN_DIR,
    cni_conf_dir: Annotated[
        str, typer.Option("--cni-conf-dir", metavar="DIR", help="Host path.")
    ] = layout.HOST_CNI_CONF_DIR,
    output: options.OutputOption = OutputFormat.YAML,
    output_file: options.OutputFileOption = None,
    ambient: Annotated[
        bool, typer.Option("--ambient", help="With the ambient node agent (istio-cni's).")
    ] = False,
    netns_dir: Annotated[
        str,
        typer.Option(
            "--netns-dir",
            metavar="DIR",
            help="Where the runtime pins pod netns (host path; the agent enters them).",
        ),
    ] = layout.HOST_NETNS_DIR,
) -> None:
    """Print the Namespace, RBAC and DaemonSet that run 'meshctl cni install' on every node."""
    from meshctl.core.k8s.install.components import standalone
    from meshctl.core.k8s.install.manifest import namespace_object

    from .manifest import CniValues, objects

    # The install's values type (components.cni.*), whose defaults are these options' defaults.
    own = CniValues(
        cni_bin_dir=cni_bin_dir, cni_conf_dir=cni_conf_dir, ambient=ambient, netns_dir=netns_dir
    )
    items = [namespace_object(namespace), *objects(standalone(namespace, image), own)]
    options.write_output(render_objects(items, output), output_file)
