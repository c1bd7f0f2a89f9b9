"""``meshctl install``, ``meshctl uninstall`` and ``meshctl manifest generate``.

Invariants: values are resolved and validated, and the manifest rendered, before anything
connects (a bad ``--set`` is one line, exit 2, nothing touched); ``--dry-run`` and ``manifest
generate`` print exactly the objects install would apply and never contact a cluster; nothing is
written without a confirmation (``-y`` gives it; without a terminal to ask on, install refuses);
progress goes to stderr, data to stdout.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshctl import config, options
from meshctl.core.k8s.install import manifest as mf
from meshctl.core.k8s.install.components import PROFILE_HELP, Registry, Values
from meshctl.errors import CheckFailedError, MeshctlError, UserError
from meshctl.output import OutputFormat, render, render_objects
from meshctl.values import Duration

if TYPE_CHECKING:
    from .apply import Installer

app = options.command_app()
uninstall_app = options.command_app()
manifest_app = options.command_app(
    help="Print the manifest of an install ('manifest generate').",
    no_args_is_help=True,
)

ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        "-p",
        metavar="|".join(PROFILE_HELP),
        help="The profile (those the installed components offer; default: default).",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set",
        "-s",
        metavar="KEY=VALUE",
        help="KEY=VALUE over the profile, e.g. components.cni.enabled=false.",
    ),
]
FileOpt = Annotated[
    list[str] | None,
    options.filename(
        "Values YAML file, directory of them, or - for stdin (repeatable; later ones win)."
    ),
]
RevisionOpt = Annotated[
    str | None,
    typer.Option(
        "--revision",
        "-r",
        metavar="REVISION",
        help="Revision: names every object and the webhook's selectors.",
    ),
]
NamespaceOpt = Annotated[str | None, options.namespace("Namespace of the mesh (meshctl-system).")]
YesOpt = Annotated[bool, typer.Option("--skip-confirmation", "-y", help="Do not ask.")]
ReadinessTimeoutOpt = Annotated[
    float,
    options.option(
        "--readiness-timeout",
        parse=Duration(positive=True),
        help="How long to wait for readiness (default 5m).",
        show_default=False,
    ),
]


def resolve(
    profile: str | None,
    files: Sequence[str] | None,
    sets: Sequence[str] | None,
    revision: str | None,
    namespace: str | None,
) -> tuple[Registry, Values, list[mf.Rendered]]:
    """The registry, the validated values and the rendered manifest (no cluster access)."""
    from meshctl import components

    registry = components.load()
    values = registry.resolve(
        profile=profile,
        files=options.values_sources(files or ()),
        assignments=list(sets or ()),
        revision=revision,
        namespace=namespace,
    )
    return registry, values, mf.render(registry, values)


def print_manifest(
    rendered: Sequence[mf.Rendered], output: OutputFormat, output_file: Path | None
) -> None:
    options.write_output(render_objects(mf.documents(rendered), output), output_file)


def _connect(ctx: typer.Context) -> Any:
    from meshctl.kube.client import connect

    return connect(options.kube_settings(ctx))  # --kubeconfig, --context, --request-timeout


def _confirm(question: str, yes: bool) -> None:
    if yes:
        return
    if not sys.stdin.isatty():
        raise UserError(
            "refusing to change the cluster without a confirmation",
            hint="pass -y (--skip-confirmation); there is no terminal to ask on",
        )
    if not typer.confirm(question, default=False, err=True):
        raise MeshctlError("aborted: nothing was changed", exit_code=1)


def _say(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


@app.command(cls=options.DryRunCommand)
def install(
    ctx: typer.Context,
    profile: ProfileOpt = None,
    sets: SetOpt = None,
    files: FileOpt = None,
    revision: RevisionOpt = None,
    namespace: NamespaceOpt = None,
    dry_run: options.DryRunModeOption = "none",
    output: options.OutputOption = OutputFormat.YAML,
    output_file: options.OutputFileOption = None,
    yes: YesOpt = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Take over objects with our names that are not ours, and remove foreign "
            "webhooks that would inject the same pods (copies are saved first).",
        ),
    ] = False,
    readiness_timeout: ReadinessTimeoutOpt = 300.0,
) -> None:
    """Render the profile with your values, apply it (server-side), prune, wait until ready."""
    timeout = readiness_timeout
    registry, values, rendered = resolve(profile, files, sets, revision, namespace)
    if dry_run == "client":
        print_manifest(rendered, output, output_file)
        return
    from meshctl.kube.inventory import Inventory

    from .apply import Installer

    kube = _connect(ctx)
    if dry_run == "server":
        installer = Installer(Inventory(kube), registry, values, rendered, say=_say)
        answers = _server_dry_run(installer, force)
        options.write_output(render_objects(answers, output), output_file)
        return
    enabled = registry.enabled(values)
    titles = ", ".join(c.title for c in enabled)
    _confirm(
        f"This installs the meshctl {values.profile!r} profile (revision {values.revision!r}: "
        f"{titles}) into {kube.source} [{kube.api.configuration.host}]. Proceed?",
        yes,
    )
    apply_and_wait(Installer(Inventory(kube), registry, values, rendered, say=_say), force, timeout)
    _say(f"✔ meshctl {values.profile} profile installed (revision {values.revision})")


def apply_and_wait(installer: Installer, force: bool, timeout: float) -> None:
    """What install and upgrade do once confirmed: preflight (refused, or taken over with
    ``force``), server-side apply, prune, wait until every component is ready."""
    from .progress import Progress
    from .wait import wait_ready

    problems = installer.preflight()
    _warn_image(installer.inventory.kube, installer.values)
    if problems and not force:
        _refuse(problems)
    if problems:
        installer.take_over(problems)
    applied = installer.apply()
    counts = {
        o: sum(a.outcome == o for a in applied) for o in ("created", "configured", "unchanged")
    }
    _say(", ".join(f"{n} {o}" for o, n in counts.items()) + f" ({len(applied)} objects)")
    installer.prune()
    by_component: dict[str, list[mf.Rendered]] = {}
    for item in installer.rendered:
        by_component.setdefault(item.component, []).append(item)
    enabled = installer.registry.enabled(installer.values)
    lines = [(c.name, c.title) for c in enabled if c.name in by_component]
    progress = Progress(lines, verb="ready")
    try:
        wait_ready(installer.inventory, {n: by_component[n] for n, _ in lines}, progress, timeout)
    finally:
        progress.close()


def _delete_dry_run(inventory: Any, items: Sequence[Mapping[str, object]], *, server: bool) -> None:
    """``uninstall --dry-run``: what would be deleted, one ``kind.group/name`` a line as
    ``kubectl delete --dry-run`` says it; ``server``: each delete also goes through the API
    server's admission (``dryRun=All``), and nothing is deleted either way."""
    from meshctl.kube import objects
    from meshctl.output import object_name

    lines = []
    for obj in items:
        key = mf.key_of(obj)
        resource = inventory.resource(obj)
        namespace = key.namespace or None if resource.namespaced else None
        if server:
            objects.delete(inventory.kube, resource, key.name, namespace, dry_run=True)
        where = f" -n {namespace}" if namespace else ""
        lines.append(f"{object_name(obj)}{where} deleted ({'server ' if server else ''}dry run)")
    typer.echo("\n".join(lines))


def _warn_image(kube: Any, values: Values) -> None:
    """Preflight's one warning: a ``localhost/`` image some node does not hold (it would never
    be pulled). Install goes on: the user may import it on the nodes while the pods wait."""
    from meshctl.errors import KubeError
    from meshctl.kube.nodeimages import pull_warning

    try:
        found = pull_warning(kube, values.image)
    except KubeError:
        return  # this identity may not list nodes: nothing to say either way
    if found is not None:
        _say(f"⚠ {found.message}")
        _say(f"  Hint: {found.hint}")


def _refuse(problems: Sequence[Any]) -> None:
    for problem in problems:
        _say(f"  {problem.text}")
    raise MeshctlError(
        f"{len(problems)} object(s) in the way of the install (listed above)",
        hint="delete them, or rerun with --force to take them over "
        "(a copy of each is saved under " + str(config.state_dir() / "backups") + ")",
    )


def _server_dry_run(installer: Installer, force: bool) -> list[Mapping[str, object]]:
    """``--dry-run=server``: what an install would refuse (as it would: exit 1), then every
    object as the API server would persist it; nothing is written, nothing taken over."""
    problems = installer.preflight()
    _warn_image(installer.inventory.kube, installer.values)
    if problems and not force:
        _refuse(problems)
    answers, unchecked = installer.dry_run()
    if unchecked:
        shown = "; ".join(unchecked[:5]) + (
            f"; and {len(unchecked) - 5} more" if len(unchecked) > 5 else ""
        )
        _say(
            f"{len(unchecked)} object(s) not checked by the API server (shown as rendered): {shown}"
        )
    return answers


@manifest_app.command("generate")
def generate(
    profile: ProfileOpt = None,
    sets: SetOpt = None,
    files: FileOpt = None,
    revision: RevisionOpt = None,
    namespace: NamespaceOpt = None,
    output: options.OutputOption = OutputFormat.YAML,
    output_file: options.OutputFileOption = None,
) -> None:
    """Print the manifest 'meshctl install' would apply (as 'install --dry-run')."""
    print_manifest(resolve(profile, files, sets, revision, namespace)[2], output, output_file)


@manifest_app.command("profiles")
def profiles(
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
) -> None:
    """List the profiles the installed components offer."""
    from meshctl import components

    registry = components.load()
    rows = [
        {
            "profile": name,
            "components": ",".join(c.name for c in registry.components if name in c.profiles),
            "description": PROFILE_HELP.get(name, ""),
        }
        for name in registry.profiles()
    ]
    options.write_output(render(rows, output, names=[str(r["profile"]) for r in rows]), output_file)


@uninstall_app.command(cls=options.DryRunCommand)
def uninstall(
    ctx: typer.Context,
    revision: RevisionOpt = None,
    namespace: NamespaceOpt = None,
    purge: Annotated[
        bool,
        typer.Option(
            "--purge",
            help="Everything meshctl made in every revision: also the CRDs (and every "
            "AuthorizationPolicy), the CA secret, the root ConfigMaps and the namespace.",
        ),
    ] = False,
    yes: YesOpt = False,
    timeout: Annotated[
        float,
        options.option(
            "--timeout",
            parse=Duration(positive=True),
            help="How long to wait until everything is gone (default 5m).",
            show_default=False,
        ),
    ] = 300.0,
    dry_run: options.DryRunModeOption = "none",
) -> None:
    """Remove an install revision (default: 'default'), or with --purge all of meshctl."""
    if purge and revision is not None:
        raise UserError("--purge removes every revision", hint="drop --revision or --purge")
    wait_for = timeout
    from meshctl import components
    from meshctl.kube.inventory import Inventory

    from . import remove
    from .progress import Progress
    from .wait import wait_gone

    registry = components.load()
    values = registry.resolve(profile=None, revision=revision, namespace=namespace)
    kube = _connect(ctx)
    inventory = Inventory(kube)
    if not purge:
        _refuse_while_tagged(kube, values.revision)
    items = remove.targets(inventory, registry, values, purge=purge)
    what = (
        "everything meshctl made (all revisions, CRDs, CA secret)"
        if purge
        else (f"revision {values.revision!r}")
    )
    if not items:
        _say(f"nothing of {what} is installed in {kube.source}")
        return
    if dry_run != "none":
        _delete_dry_run(inventory, items, server=dry_run == "server")
        return
    _confirm(f"This removes {what}: {len(items)} objects from {kube.source}. Proceed?", yes)
    for stage in remove.stages(items):
        by_component: dict[str, list[Mapping[str, object]]] = {}
        for obj in stage:
            by_component.setdefault(mf.component_of(obj) or "other", []).append(obj)
        titles = {c.name: c.title for c in registry.components}
        titles.setdefault(mf.INSTALL, "Namespace and install record")
        progress = Progress(
            [(name, titles.get(name, name)) for name in by_component], verb="removed"
        )
        try:
            remove.delete(inventory, stage, lambda _text: None)
            wait_gone(inventory, by_component, progress, wait_for)
        finally:
            progress.close()
    _say(f"✔ removed {what}")
    left = remove.left_redirected(inventory)
    if left:
        raise CheckFailedError(
            f"{len(left)} pod(s) are still redirected to the removed node proxy and refuse "
            f"every connection: {', '.join(left[:10])}{' ...' if len(left) > 10 else ''}",
            hint="restart them ('kubectl delete pod', or 'kubectl rollout restart' of their "
            "workload), or install ambient mode again: its node agent releases them",
        )


def _refuse_while_tagged(kube: Any, revision: str) -> None:
    """A revision that tags still point at stays: removing it would leave their namespaces'
    new pods refused (the tags' webhooks call its injector, failurePolicy Fail)."""
    from meshctl.core.k8s import tags
    from meshctl.kube import objects
    from meshctl.kube.resources import MUTATING_WEBHOOK_CONFIGURATIONS

    selector = f"{tags.TAG_LABEL},{tags.REVISION_LABEL}={revision}"
    found, _ = objects.list_objects(kube, MUTATING_WEBHOOK_CONFIGURATIONS, label_selector=selector)
    named = sorted(t.name for t in (tags.tag_of(c) for c in found) if t is not None)
    if named:
        raise MeshctlError(
            f"revision {revision!r} is still the target of tag(s) {', '.join(named)}",
            hint=f"move them first ('meshctl tag set {named[0]} --revision OTHER --overwrite') "
            f"or remove them ('meshctl tag remove {named[0]}')",
        )
