"""``meshctl install``, ``meshctl uninstall`` and ``meshctl manifest generate``.

Invariants: values are resolved and validated, and the manifest rendered, before anything
connects (a bad ``--set`` is one line, exit 2, nothing touched); ``--dry-run`` and ``manifest
generate`` print exactly the objects install would apply and never contact a cluster; nothing is
written without a confirmation (``-y`` gives it; without a terminal to ask on, install refuses);
progress goes to stderr, data to stdout.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from meshctl import config
from meshctl.core.install import manifest as mf
from meshctl.core.install.components import PROFILE_HELP, Registry, Values
from meshctl.errors import MeshctlError, UserError
from meshctl.output import OutputFormat, render, render_objects

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)
uninstall_app = typer.Typer(
    add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None
)
manifest_app = typer.Typer(
    help="Print the manifest of an install ('manifest generate').",
    no_args_is_help=True,
    add_completion=False,
    pretty_exceptions_enable=False,
    rich_markup_mode=None,
)

ProfileOpt = Annotated[
    str | None,
    typer.Option(
        "--profile",
        "-p",
        help="default, ambient, minimal or demo (those the installed components offer).",
    ),
]
SetOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--set", "-s", help="KEY=VALUE over the profile, e.g. components.cni.enabled=false."
    ),
]
FileOpt = Annotated[
    list[Path] | None,
    typer.Option("--filename", "-f", help="Values YAML file (repeatable; later ones win)."),
]
RevisionOpt = Annotated[
    str | None,
    typer.Option(
        "--revision", "-r", help="Revision: names every object and the webhook's selectors."
    ),
]
NamespaceOpt = Annotated[
    str | None, typer.Option("--namespace", "-n", help="Namespace of the mesh (meshctl-system).")
]
OutputOpt = Annotated[
    OutputFormat, typer.Option("--output", "-o", help="yaml or json (with --dry-run).")
]
YesOpt = Annotated[bool, typer.Option("--skip-confirmation", "-y", help="Do not ask.")]
TimeoutOpt = Annotated[
    str,
    typer.Option("--request-timeout", help="Timeout of each API request (e.g. 10s)."),
]


def resolve(
    profile: str | None,
    files: Sequence[Path] | None,
    sets: Sequence[str] | None,
    revision: str | None,
    namespace: str | None,
) -> tuple[Registry, Values, list[mf.Rendered]]:
    """The registry, the validated values and the rendered manifest (no cluster access)."""
    from meshctl import components

    registry = components.load()
    values = registry.resolve(
        profile=profile,
        files=config.values_files(files or ()),
        assignments=list(sets or ()),
        flags={"revision": revision, "namespace": namespace},
    )
    return registry, values, mf.render(registry, values)


def print_manifest(rendered: Sequence[mf.Rendered], output: OutputFormat) -> None:
    if output is OutputFormat.TABLE:
        raise UserError("--output: use yaml or json for a manifest", hint="e.g. -o yaml")
    typer.echo(render_objects(mf.documents(rendered), output), nl=False)


def _connect(ctx: typer.Context, request_timeout: str) -> Any:
    from meshctl.kube.client import KubeSettings, connect

    settings: config.GlobalSettings = ctx.obj
    return connect(
        KubeSettings(
            kubeconfig=settings.kubeconfig,
            context=settings.context,
            request_timeout=config.duration(request_timeout, "--request-timeout"),
        )
    )


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


@app.command()
def install(
    ctx: typer.Context,
    profile: ProfileOpt = None,
    sets: SetOpt = None,
    files: FileOpt = None,
    revision: RevisionOpt = None,
    namespace: NamespaceOpt = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Print the manifest instead of applying it.")
    ] = False,
    output: OutputOpt = OutputFormat.YAML,
    yes: YesOpt = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Take over objects with our names that are not ours, and remove foreign "
            "webhooks that would inject the same pods (copies are saved first).",
        ),
    ] = False,
    readiness_timeout: Annotated[
        str, typer.Option("--readiness-timeout", help="How long to wait for readiness.")
    ] = "5m",
    request_timeout: TimeoutOpt = "10s",
) -> None:
    """Render the profile with your values, apply it (server-side), prune, wait until ready."""
    timeout = config.duration(readiness_timeout, "--readiness-timeout")
    registry, values, rendered = resolve(profile, files, sets, revision, namespace)
    if dry_run:
        print_manifest(rendered, output)
        return
    from meshctl.kube.inventory import Inventory

    from .apply import Installer
    from .progress import Progress
    from .wait import wait_ready

    kube = _connect(ctx, request_timeout)
    enabled = registry.enabled(values)
    titles = ", ".join(c.title for c in enabled)
    _confirm(
        f"This installs the meshctl {values.profile!r} profile (revision {values.revision!r}: "
        f"{titles}) into {kube.source} [{kube.api.configuration.host}]. Proceed?",
        yes,
    )
    inventory = Inventory(kube)
    installer = Installer(inventory, registry, values, rendered, say=_say)
    problems = installer.preflight()
    if problems and not force:
        for problem in problems:
            _say(f"  {problem.text}")
        raise MeshctlError(
            f"{len(problems)} object(s) in the way of the install (listed above)",
            hint="delete them, or rerun with --force to take them over "
            "(a copy of each is saved under " + str(config.state_dir() / "backups") + ")",
        )
    if problems:
        installer.take_over(problems)
    applied = installer.apply()
    counts = {
        o: sum(a.outcome == o for a in applied) for o in ("created", "configured", "unchanged")
    }
    _say(", ".join(f"{n} {o}" for o, n in counts.items()) + f" ({len(applied)} objects)")
    installer.prune()
    by_component: dict[str, list[mf.Rendered]] = {}
    for item in rendered:
        by_component.setdefault(item.component, []).append(item)
    lines = [(c.name, c.title) for c in enabled if c.name in by_component]
    progress = Progress(lines, verb="ready")
    try:
        wait_ready(inventory, {n: by_component[n] for n, _ in lines}, progress, timeout)
    finally:
        progress.close()
    _say(f"✔ meshctl {values.profile} profile installed (revision {values.revision})")


@manifest_app.command("generate")
def generate(
    profile: ProfileOpt = None,
    sets: SetOpt = None,
    files: FileOpt = None,
    revision: RevisionOpt = None,
    namespace: NamespaceOpt = None,
    output: OutputOpt = OutputFormat.YAML,
) -> None:
    """Print the manifest 'meshctl install' would apply (as 'install --dry-run')."""
    print_manifest(resolve(profile, files, sets, revision, namespace)[2], output)


@manifest_app.command("profiles")
def profiles(output: OutputOpt = OutputFormat.TABLE) -> None:
    """List the profiles the installed components offer."""
    from meshctl import components

    registry = components.load()
    rows = [
        {
            "profile": name,
            "components": ",".join(
                c.name for c in registry.components if c.profiles.get(name, {}).get("enabled")
            ),
            "description": PROFILE_HELP.get(name, ""),
        }
        for name in registry.profiles()
    ]
    typer.echo(render(rows, output), nl=False)


@uninstall_app.command()
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
        str, typer.Option("--timeout", help="How long to wait until everything is gone.")
    ] = "5m",
    request_timeout: TimeoutOpt = "10s",
) -> None:
    """Remove an install revision (default: 'default'), or with --purge all of meshctl."""
    if purge and revision is not None:
        raise UserError("--purge removes every revision", hint="drop --revision or --purge")
    wait_for = config.duration(timeout, "--timeout")
    from meshctl import components
    from meshctl.kube.inventory import Inventory

    from . import remove
    from .progress import Progress
    from .wait import wait_gone

    registry = components.load()
    values = registry.resolve(profile=None, flags={"revision": revision, "namespace": namespace})
    kube = _connect(ctx, request_timeout)
    inventory = Inventory(kube)
    items = remove.targets(inventory, registry, values, purge=purge)
    what = (
        "everything meshctl made (all revisions, CRDs, CA secret)"
        if purge
        else (f"revision {values.revision!r}")
    )
    if not items:
        _say(f"nothing of {what} is installed in {kube.source}")
        return
    _confirm(f"This removes {what}: {len(items)} objects from {kube.source}. Proceed?", yes)
    for stage in remove.stages(items):
        by_component: dict[str, list[dict[str, Any]]] = {}
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
