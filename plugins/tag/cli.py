"""``meshctl tag set|list|remove``: revision tags, each one MutatingWebhookConfiguration.

Invariants: the objects come from the pure core (``meshctl.core.k8s.tags``: data first, then
render, then apply); ``--dry-run`` prints exactly the object ``set`` would apply and writes
nothing; a tag never points at a revision that is not installed, never moves without
``--overwrite``, and is not removed while namespaces use it without ``--force``. Messages go to
stderr, data (the objects, the list) to stdout.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Annotated, Any

import typer

from meshctl import options
from meshctl.core.k8s import tags
from meshctl.output import OutputFormat, render, render_objects

app = options.command_app(
    help="Revision tags: move istio.io/rev=TAG namespaces between revisions.",
    no_args_is_help=True,
)

TagArg = Annotated[str, typer.Argument(metavar="TAG", help="The tag (a label value), e.g. prod.")]
RevisionOpt = Annotated[
    str,
    typer.Option(
        "--revision", "-r", metavar="REVISION", help="The installed revision the tag points at."
    ),
]
FIELD_MANAGER = "meshctl"


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def _connect(ctx: typer.Context) -> Any:
    from meshctl.kube.client import connect

    return connect(options.kube_settings(ctx))


def _configurations(kube: Any) -> list[dict[str, Any]]:
    from meshctl.kube import objects
    from meshctl.kube.resources import MUTATING_WEBHOOK_CONFIGURATIONS

    return objects.list_objects(kube, MUTATING_WEBHOOK_CONFIGURATIONS)[0]


def _namespaces(kube: Any) -> list[tuple[str, Mapping[str, str]]]:
    from meshctl.kube import objects
    from meshctl.kube.resources import NAMESPACES

    found: list[tuple[str, Mapping[str, str]]] = []
    for ns in objects.list_objects(kube, NAMESPACES)[0]:
        meta: Mapping[str, Any] = ns.get("metadata") or {}
        found.append((str(meta.get("name")), dict(meta.get("labels") or {})))
    return found


def _shown(obj: Mapping[str, Any]) -> dict[str, Any]:
    """An object as kubectl shows it (without managedFields)."""
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    meta.pop("managedFields", None)
    out["metadata"] = meta
    return out


def _row_table(row: Mapping[str, object]) -> list[dict[str, str]]:
    namespaces = row["namespaces"]
    listed = ",".join(namespaces) if isinstance(namespaces, list) else ""
    return [{"tag": str(row["tag"]), "revision": str(row["revision"]), "namespaces": listed or "-"}]


@app.command("set", cls=options.DryRunCommand)
def set_tag(
    ctx: typer.Context,
    tag: TagArg,
    revision: RevisionOpt,
    overwrite: Annotated[
        bool,
        typer.Option("--overwrite", help="Move the tag when it points at another revision."),
    ] = False,
    dry_run: options.DryRunModeOption = "none",
    output: options.OutputOption = OutputFormat.YAML,
    output_file: options.OutputFileOption = None,
) -> None:
    """Point TAG at an installed revision: namespaces labelled istio.io/rev=TAG get its proxies
    (new pods; restart the others)."""
    from meshctl.kube import objects
    from meshctl.kube.resources import MUTATING_WEBHOOK_CONFIGURATIONS

    tags.validate_tag(tag)
    kube = _connect(ctx)
    configurations = _configurations(kube)
    existing = tags.tags(configurations)
    target = tags.check_set(
        tag, revision, tags.revisions(configurations), existing, overwrite=overwrite
    )
    body = tags.webhook(tag, target)
    if dry_run == "client":
        options.write_output(render_objects([body], output), output_file)
        return
    applied = objects.apply(
        kube,
        MUTATING_WEBHOOK_CONFIGURATIONS,
        body,
        field_manager=FIELD_MANAGER,
        force=True,
        dry_run=dry_run == "server",
    )
    if dry_run == "server":
        options.write_output(render_objects([_shown(applied)], output), output_file)
        return
    before = existing.get(tag)
    if before is None:
        _say(f"tag {tag!r} set to revision {revision!r}")
    elif before.revision != revision:
        _say(f"tag {tag!r} moved from revision {before.revision!r} to {revision!r}")
    else:
        _say(f"tag {tag!r} already points at revision {revision!r}")
    using = tags.namespaces_using(tag, _namespaces(kube))
    if using and (before is None or before.revision != revision):
        _say(
            f"restart the workloads of {', '.join(using)} to move their proxies "
            f"('kubectl rollout restart deployment -n NAMESPACE')"
        )
    row = tags.rows({tag: tags.Tag(name=tag, revision=revision, configuration="")}, [])[0]
    row["namespaces"] = using
    shown = _shown(applied)
    text = (
        render(row, output, table=_row_table(row))
        if output is OutputFormat.TABLE
        else render_objects([shown], output)
    )
    options.write_output(text, output_file)


@app.command("list")
def list_tags(
    ctx: typer.Context,
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
) -> None:
    """List the tags: TAG, the REVISION it points at, the NAMESPACES that use it."""
    kube = _connect(ctx)
    found = tags.tags(_configurations(kube))
    rows = tags.rows(found, _namespaces(kube))
    table = [r for row in rows for r in _row_table(row)]
    text = render(rows, output, table=table, names=[str(r["tag"]) for r in rows])
    if output is OutputFormat.TABLE and not rows:
        text = ""
        _say("no revision tags (set one with 'meshctl tag set TAG --revision REVISION')")
    options.write_output(text, output_file)


@app.command("remove", cls=options.DryRunCommand)
def remove_tag(
    ctx: typer.Context,
    tag: TagArg,
    force: Annotated[
        bool,
        typer.Option("--force", help="Remove it even while namespaces use it."),
    ] = False,
    dry_run: options.DryRunModeOption = "none",
    output: options.OutputOption = OutputFormat.NAME,
    output_file: options.OutputFileOption = None,
) -> None:
    """Remove TAG's webhook configuration (refused while namespaces use it, unless --force)."""
    from meshctl.kube import objects
    from meshctl.kube.resources import MUTATING_WEBHOOK_CONFIGURATIONS

    tags.validate_tag(tag)
    kube = _connect(ctx)
    existing = tags.tags(_configurations(kube))
    using = tags.namespaces_using(tag, _namespaces(kube)) if tag in existing else []
    found = tags.check_remove(tag, existing, using, force=force)
    live = objects.get(kube, MUTATING_WEBHOOK_CONFIGURATIONS, found.configuration)
    if dry_run == "none":
        objects.delete(kube, MUTATING_WEBHOOK_CONFIGURATIONS, found.configuration)
        _say(f"tag {tag!r} removed (it pointed at revision {found.revision!r})")
        if using:
            _say(f"new pods of {', '.join(using)} get no proxy until the namespaces are relabelled")
    elif dry_run == "server":
        objects.delete(kube, MUTATING_WEBHOOK_CONFIGURATIONS, found.configuration, dry_run=True)
    shown = [_shown(live)] if live else []
    options.write_output(render_objects(shown, output), output_file)
