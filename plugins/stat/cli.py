"""``meshctl stat [deploy|pod|ns] [NAME]`` and ``meshctl top``: the proxies' traffic figures.

``stat`` scrapes every proxy of the scope twice, ``--window`` apart, and prints one row per
Deployment, pod or namespace (``linkerd viz stat``'s columns); ``top`` does the same per pod,
sorted by rate, refreshed every ``--interval`` on a terminal (``--once``, or stdout not a
terminal: plain frames). Invariants: read-only; a proxy that does not answer is a row's reason,
not a failure; a NAME that does not exist is ``Error:`` with exit 1.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer

from meshctl import options
from meshctl.errors import MeshctlError, UserError
from meshctl.output import OutputFormat, render

from . import table

app = options.command_app()
top_app = options.command_app()

KINDS = {
    "deploy": "deploy",
    "deployment": "deploy",
    "deployments": "deploy",
    "pod": "pod",
    "pods": "pod",
    "po": "pod",
    "ns": "ns",
    "namespace": "ns",
    "namespaces": "ns",
}
MAX_WINDOW = 3600.0


def _connect(ctx: typer.Context) -> Any:
    from meshctl.kube.client import connect

    return connect(options.kube_settings(ctx))


def _check_scope(namespace: str | None, all_namespaces: bool) -> None:
    if all_namespaces and namespace:
        raise UserError("-n and -A name the scope twice", hint="give one of them")


def _namespace(kube: Any, namespace: str | None, all_namespaces: bool) -> str | None:
    """None: every namespace; else -n, or the kubeconfig context's namespace (kubectl's)."""
    return None if all_namespaces else (namespace or kube.namespace)


@app.command()
def stat(
    ctx: typer.Context,
    kind: Annotated[
        str,
        typer.Argument(metavar="deploy|pod|ns", help="What a row is."),
    ] = "deploy",
    name: Annotated[
        str | None, typer.Argument(metavar="NAME", help="Only this one.", show_default=False)
    ] = None,
    namespace: Annotated[
        str | None, options.namespace("Namespace of the workloads (default: the context's).")
    ] = None,
    all_namespaces: Annotated[
        bool, typer.Option("-A", "--all-namespaces", help="Every namespace.")
    ] = False,
    window: Annotated[
        float,
        options.duration(
            "--window",
            help="Time between the two scrapes the rates come from (e.g. 10s, 1m).",
            positive=True,
            maximum=MAX_WINDOW,
        ),
    ] = 10.0,
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
) -> None:
    """Success rate, requests and connections per second, latency, bytes and mTLS share per
    Deployment, pod or namespace, from the proxies' own metrics over --window."""
    from meshctl.core.stat.rows import rows

    from . import collect

    chosen = KINDS.get(kind.lower())
    if chosen is None:
        raise UserError(
            f"unknown kind {kind!r}: expected deploy, pod or ns", hint="e.g. meshctl stat deploy"
        )
    _check_scope(namespace, all_namespaces)
    kube = _connect(ctx)
    where_ns = _namespace(kube, namespace, all_namespaces)
    where = collect.scope(kube, where_ns)
    deployments = []
    if chosen == "deploy":
        from meshctl.kube.proxymetrics import deployment_names

        deployments = deployment_names(kube, where_ns)
    _exists(chosen, name, where_ns, where.pods, deployments)

    def started(count: int) -> None:
        sys.stderr.write(f"scraped {count} proxies; again in {window:g}s\n")
        sys.stderr.flush()

    before, after, seconds = collect.window(kube, where, window, started=started)
    found = rows(
        chosen,  # type: ignore[arg-type]
        pods=where.pods,
        plan=where.plan,
        before=before,
        after=after,
        window=seconds,
        deployments=deployments,
        name=name,
    )
    _write(found, output, output_file, namespaces=where_ns is None)


def _exists(kind: str, name: str | None, namespace: str | None, pods: Any, deploys: Any) -> None:
    if name is None:
        return
    where = f" in namespace {namespace}" if namespace else ""
    if kind == "deploy" and not any(d[1] == name for d in deploys):
        raise MeshctlError(f"deployment {name} not found{where}", hint="see 'kubectl get deploy'")
    if kind == "pod" and not any(p.name == name for p in pods):
        raise MeshctlError(f"pod {name} not found{where}", hint="see 'kubectl get pods'")
    if kind == "ns" and not any(p.namespace == name for p in pods):
        raise MeshctlError(f"no pods in namespace {name}", hint="see 'kubectl get pods -A'")


def _write(
    found: list[dict[str, object]],
    output: OutputFormat,
    output_file: Path | None,
    *,
    namespaces: bool,
) -> None:
    names = [f"{r['namespace']}/{r['name']}" for r in found]
    text = table.text(found, namespaces=namespaces) or "No resources found.\n"
    options.write_output(render(found, output, table=text, names=names), output_file)


@top_app.command()
def top(
    ctx: typer.Context,
    namespace: Annotated[
        str | None, options.namespace("Namespace of the pods (default: the context's).")
    ] = None,
    all_namespaces: Annotated[
        bool, typer.Option("-A", "--all-namespaces", help="Every namespace.")
    ] = False,
    interval: Annotated[
        float,
        options.duration(
            "--interval",
            help="Time between refreshes (each frame's rates are over it).",
            positive=True,
            maximum=MAX_WINDOW,
        ),
    ] = 2.0,
    once: Annotated[bool, typer.Option("--once", help="Print one frame and exit.")] = False,
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
) -> None:
    """Per pod traffic, busiest first, refreshed every --interval (plain frames off a
    terminal; --once: one frame)."""
    from meshctl.terminal import is_terminal

    from . import frames

    _check_scope(namespace, all_namespaces)
    kube = _connect(ctx)
    where_ns = _namespace(kube, namespace, all_namespaces)
    screen = not once and output is OutputFormat.TABLE and output_file is None
    screen = screen and is_terminal(sys.stdout)
    frames.run(
        kube,
        where_ns,
        interval,
        once=once,
        live=screen,
        emit=lambda found: _write(found, output, output_file, namespaces=where_ns is None),
    )
