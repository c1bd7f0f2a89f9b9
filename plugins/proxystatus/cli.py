"""``meshctl proxy-status [POD]`` and ``meshctl proxy-config SECTION POD``: what every proxy was
sent and answered (from the control plane), and what one proxy holds (from its admin port)."""

from __future__ import annotations

import sys
from datetime import UTC, datetime
from typing import Annotated, Any

import typer

from meshctl import options
from meshctl.core.k8s import ambient, layout
from meshctl.errors import KubeError, MeshctlError, UserError
from meshctl.output import OutputFormat, render, render_table

status_app = options.command_app()
config_app = options.command_app()

NODE_PROXY = "meshctl-ztunnel"  # the node proxy DaemonSet's app.kubernetes.io/name
REDIRECTION = "ambient.istio.io/redirection"  # "enabled": the node proxy serves the pod

MeshNamespace = Annotated[
    str,
    typer.Option(
        "--mesh-namespace", metavar="NAME", help="Where the mesh is installed (meshctl-system)."
    ),
]
PodNamespace = Annotated[
    str | None, options.namespace("The pod's namespace (default: the context's).")
]


def _kube(ctx: typer.Context) -> Any:
    from meshctl.kube.client import connect

    return connect(options.kube_settings(ctx))


def _check_pod(pod: str) -> None:
    if "/" in pod:
        raise UserError(f"{pod!r} is not a pod name", hint="give the pod's namespace with -n")


def _split(pod: str, namespace: str | None, context_namespace: str) -> tuple[str, str]:
    """``POD`` with ``-n``, or istioctl's ``POD.NAMESPACE``, else the kubeconfig context's
    namespace."""
    _check_pod(pod)
    if "." in pod and namespace is None:
        name, _, ns = pod.partition(".")
        return ns, name
    return namespace or context_namespace, pod


@status_app.command("proxy-status")
def proxy_status(
    ctx: typer.Context,
    pod: Annotated[
        str | None, typer.Argument(metavar="POD", help="Show this pod's proxy in detail.")
    ] = None,
    namespace: PodNamespace = None,
    mesh_namespace: MeshNamespace = layout.MESH_NAMESPACE,
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
) -> None:
    """Every proxy connected to the control plane: per xDS type, sent / ACKed / NACKed, and
    certificate expiry (istioctl proxy-status). NACK and STALE rows come first."""
    from meshctl.core.proxystatus import report

    from . import fetch

    kube = _kube(ctx)
    reports, failures = fetch.sync_reports(kube, mesh_namespace, timeout=kube.request_timeout)
    merged = report.merge(reports, failures)
    now = datetime.now(UTC)
    for line in report.problems(merged):
        print(f"Warning: {line}", file=sys.stderr)  # noqa: T201 (messages go to stderr)
    if not reports:
        raise KubeError(
            f"no control plane replica in {mesh_namespace} answered",
            hint="see the warnings above; is the control plane ready?",
        )
    if pod is None:
        data = report.as_data(merged)
        names = [report.name_of(p) for p in merged.proxies]
        text = render(data, output, table=report.table(merged, now), names=names)
        options.write_output(text, output_file)
        return
    ns, name = _split(pod, namespace, kube.namespace)
    chosen = report.select(merged, ns, name)
    if not chosen:
        chosen = _node_proxies_of(kube, merged, ns, name)
    if not chosen:
        raise MeshctlError(
            f"no proxy of pod {ns}/{name} is connected to the control plane",
            hint="meshctl proxy-status lists the connected proxies; an ambient pod's proxy "
            "is its node's node proxy",
        )
    if output is not OutputFormat.TABLE:
        options.write_output(render(chosen, output, names=[f"{ns}/{name}"]), output_file)
        return
    text = "\n".join(
        render_table(report.summary(p, now)) + "\n" + render_table(report.detail(p, now))
        for p in chosen
    )
    options.write_output(text, output_file)


def _node_proxies_of(kube: Any, merged: Any, namespace: str, pod: str) -> list[dict[str, Any]]:
    """An ambient pod's proxies: the node proxies of its node (said on stderr), else none."""
    from meshctl.core.proxystatus import report
    from meshctl.kube import objects
    from meshctl.kube.resources import PODS

    found = objects.get(kube, PODS, pod, namespace)
    if found is None:
        raise MeshctlError(f"pod {namespace}/{pod} not found", hint="check the name and -n")
    annotations = (found.get("metadata") or {}).get("annotations") or {}
    node = str((found.get("spec") or {}).get("nodeName") or "")
    if annotations.get(REDIRECTION) != "enabled" or not node:
        return []
    proxies: list[dict[str, Any]] = report.node_proxies_on(merged, node)
    for proxy in proxies:
        print(  # noqa: T201 (a message: stderr)
            f"pod {namespace}/{pod} is ambient: served by node proxy {report.name_of(proxy)}",
            file=sys.stderr,
        )
    return proxies


@config_app.command("proxy-config")
def proxy_config(
    ctx: typer.Context,
    section: Annotated[
        str,
        typer.Argument(metavar="workloads|services|policies|certs|listeners", help="What to show."),
    ],
    pod: Annotated[str, typer.Argument(metavar="POD", help="The pod whose proxy to read.")],
    namespace: PodNamespace = None,
    node: Annotated[
        str | None,
        typer.Option(
            "--node",
            metavar="NODE",
            help="Read the node proxy on NODE and show POD's view (ambient pods: automatic).",
        ),
    ] = None,
    mesh_namespace: MeshNamespace = layout.MESH_NAMESPACE,
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
) -> None:
    """What one proxy holds, from its admin port's /config_dump (through the API server):
    -o table the section's table, json|yaml the raw section."""
    from meshctl.core.proxystatus import configdump

    from . import fetch

    if section not in configdump.SECTIONS:
        raise UserError(
            f"unknown section {section!r}", hint=f"one of: {', '.join(configdump.SECTIONS)}"
        )
    _check_pod(pod)
    kube = _kube(ctx)
    ns, name = _split(pod, namespace, kube.namespace)
    target_ns, target, view = _proxy_of(kube, ns, name, node, mesh_namespace)
    dump = fetch.config_dump(kube, target_ns, target, timeout=kube.request_timeout)
    try:
        if output is not OutputFormat.TABLE:
            raw = configdump.raw(dump, section, view)
            options.write_output(render(raw, output, names=[section]), output_file)
            return
        rows = configdump.section(dump, section, view)
    except configdump.DumpError as exc:
        raise MeshctlError(
            f"{target_ns}/{target}: {exc}", hint="-o json shows what the proxy answered"
        ) from None
    options.write_output(render(rows, output) if rows else "No entries.\n", output_file)


def _proxy_of(
    kube: Any, namespace: str, pod: str, node: str | None, mesh_namespace: str
) -> tuple[str, str, Any]:
    """(namespace, pod) of the proxy to read, and the pod whose view it is (node proxy only)."""
    from meshctl.kube import objects
    from meshctl.kube.resources import PODS

    found = objects.get(kube, PODS, pod, namespace)
    if found is None:
        raise MeshctlError(f"pod {namespace}/{pod} not found", hint="check the name and -n")
    spec = found.get("spec") or {}
    annotations = (found.get("metadata") or {}).get("annotations") or {}
    sidecar = any(
        c.get("name") == "istio-proxy"
        for c in [*(spec.get("containers") or []), *(spec.get("initContainers") or [])]
    )
    if node is None and (sidecar or annotations.get(REDIRECTION) != "enabled"):
        if not sidecar:
            raise MeshctlError(
                f"pod {namespace}/{pod} has no sidecar and is not served by a node proxy",
                hint="is its namespace enrolled in the mesh? --node NODE reads a node proxy",
            )
        return namespace, pod, None
    on = node or str(spec.get("nodeName") or "")
    proxies, _ = objects.list_objects(
        kube,
        PODS,
        mesh_namespace,
        label_selector=f"app.kubernetes.io/name={NODE_PROXY}",
        field_selector=f"spec.nodeName={on}",
    )
    if not proxies:
        raise MeshctlError(
            f"no node proxy on node {on!r} in {mesh_namespace}",
            hint="is the ambient profile installed? (--mesh-namespace names its namespace)",
        )
    # During a rollout's handover two are there: the one that serves the pods now.
    serving = ambient.serving_node_proxy(proxies) or proxies[0]
    return mesh_namespace, str(serving["metadata"]["name"]), _pod_ref(namespace, pod)


def _pod_ref(namespace: str, pod: str) -> Any:
    from meshctl.core.proxystatus.configdump import PodRef

    return PodRef(namespace=namespace, name=pod)
