"""``meshctl analyze``: the checks of ``meshctl.core.analyze`` over the live cluster, files, or
files layered over the live cluster (istioctl analyze's three modes).

Invariants: with ``-f`` and without ``--use-kube=false`` the files are layered over the cluster
(as if applied); ``--use-kube=false`` never connects; a cluster that does not answer is one
``Error:``/``Hint:`` (exit 1); the report and the exit code come from ``core.analyze.run`` alone
(3 when a finding reaches ``--failure-threshold``, Error by default).
"""

from __future__ import annotations

from typing import Annotated

import typer

from meshctl import inputs, options
from meshctl.core.analyze.codes import CODES
from meshctl.core.analyze.findings import Level
from meshctl.core.analyze.run import (
    DEFAULT_NAMESPACE,
    analyze,
    exit_code,
    report_data,
    report_text,
    scope_of,
)
from meshctl.core.analyze.snapshot import Item, layered, read_documents
from meshctl.errors import KubeError, UserError
from meshctl.output import OutputFormat, render
from meshctl.values import Choice

app = options.command_app()

LEVELS = ("Info", "Warning", "Error")


@app.command(name="analyze")
def analyze_command(
    ctx: typer.Context,
    files: options.FilenameOption = None,
    recursive: options.RecursiveOption = False,
    namespace: Annotated[
        str | None,
        options.namespace(
            "Analyze this namespace (default: the context's namespace and the files' "
            "namespaces; with --use-kube=false: all)."
        ),
    ] = None,
    all_namespaces: Annotated[
        bool, typer.Option("-A", "--all-namespaces", help="Analyze every namespace.")
    ] = False,
    use_kube: Annotated[
        str,
        options.option(
            "--use-kube",
            parse=Choice(("true", "false")),
            help="Read the live cluster (with -f: the files are layered over it); false: the "
            "files alone.",
        ),
    ] = "true",
    failure_threshold: Annotated[
        str,
        options.option(
            "--failure-threshold",
            parse=Choice(LEVELS),
            help="The lowest level that makes the exit code 3.",
        ),
    ] = "Error",
    report_threshold: Annotated[
        str,
        options.option(
            "--report-threshold",
            parse=Choice(LEVELS),
            help="The lowest level the report shows (istioctl's output threshold); the exit "
            "code still counts every finding.",
        ),
    ] = "Info",
    list_codes: Annotated[
        bool, typer.Option("--list-codes", help="List every code with its level; analyze nothing.")
    ] = False,
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
) -> None:
    """Check mesh objects for mistakes: policies that select nothing, injection or ambient
    labels nothing serves, pods missing their sidecar, foreign injection webhooks, unclassified
    Service ports, conflicting revisions.

    Each finding has a stable code (docs/analyze.md explains each and its fix). Exit 3 when one
    reaches --failure-threshold (Error), 0 otherwise.
    """
    if list_codes:
        rows = [
            {"code": c.id, "name": c.name, "level": c.level.label, "summary": c.summary}
            for c in CODES
        ]
        options.write_output(render(rows, output, names=[c.id for c in CODES]), output_file)
        return
    offline = use_kube == "false"
    if offline and not files:
        raise UserError(
            "--use-kube=false analyzes files: none given",
            hint="give the manifests with -f FILE|DIR|- (or drop --use-kube=false)",
        )
    if all_namespaces and namespace:
        raise UserError("-n and --all-namespaces both given", hint="give one of them")
    limits = inputs.limits()
    sources = options.read_sources(files or (), recursive=recursive)
    texts = [(s.name, s.text) for s in sources]
    given = read_documents(texts, namespace or DEFAULT_NAMESPACE, limits)
    if files and not given:  # docs/cli.md: -f input with no object at all is an error
        raise UserError(
            f"{', '.join(s.name for s in sources)}: no Kubernetes object to analyze",
            hint="give manifests with apiVersion, kind and metadata.name",
        )
    live: list[Item] = []
    context_namespace = DEFAULT_NAMESPACE
    if not offline:
        from meshctl.kube.client import connect
        from meshctl.kube.snapshot import live_objects

        try:
            kube = connect(options.kube_settings(ctx))
            live = [Item(o) for o in live_objects(kube)]
        except KubeError as exc:
            if not files:
                raise
            raise KubeError(
                exc.message,
                hint=f"{exc.hint or 'check --kubeconfig and --context'}; or analyze the files "
                "alone with --use-kube=false",
            ) from exc
        context_namespace = kube.namespace
        if namespace is None and context_namespace != DEFAULT_NAMESPACE:
            # A file's object without a namespace lands where kubectl apply would put it.
            given = read_documents(texts, context_namespace, limits)
    scope = scope_of(
        all_namespaces=all_namespaces,
        namespace=namespace,
        files=given,
        live=not offline,
        context_namespace=context_namespace,
    )
    findings = analyze(layered(live, given), scope)
    shown = [f for f in findings if f.level >= Level.parse(report_threshold)]
    names = [f"{f.code.id} {f.subject.ref}" for f in shown]
    text = report_text(shown, scope, hidden=len(findings) - len(shown))
    options.write_output(render(report_data(shown), output, table=text, names=names), output_file)
    code = exit_code(findings, Level.parse(failure_threshold))
    if code:
        raise typer.Exit(code)
