"""``meshctl upgrade``: an installed revision moved in place to this meshctl's manifest.

Reads the revision's install record (its profile and the values the user changed), renders this
version's manifest of them (with the upgrade's own ``--set``/``-f`` on top), shows what changes
object by object and field by field, then applies it as install does (preflight, server-side
apply, prune, wait until ready) and checks that every object now matches the manifest.
Invariants: ``--dry-run`` shows the plan and changes nothing; nothing is written without a
confirmation (``-y``); an upgrade that changes nothing writes nothing.
"""

from __future__ import annotations

from typing import Annotated, Any

import typer

from meshctl import options
from meshctl.core.k8s.install import manifest as mf
from meshctl.core.k8s.install import upgrade as up
from meshctl.errors import CheckFailedError, MeshctlError
from meshctl.output import OutputFormat, render

from .cli import (
    FileOpt,
    NamespaceOpt,
    ReadinessTimeoutOpt,
    RevisionOpt,
    SetOpt,
    YesOpt,
    _confirm,
    _connect,
    _refuse,
    _say,
    apply_and_wait,
)

upgrade_app = options.command_app()


@upgrade_app.command(cls=options.DryRunCommand)
def upgrade(
    ctx: typer.Context,
    revision: RevisionOpt = None,
    namespace: NamespaceOpt = None,
    sets: SetOpt = None,
    files: FileOpt = None,
    dry_run: options.DryRunModeOption = "none",
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
    yes: YesOpt = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Take over objects in the way, as 'install --force' does (copies saved).",
        ),
    ] = False,
    readiness_timeout: ReadinessTimeoutOpt = 300.0,
) -> None:
    """Upgrade an installed revision in place to this meshctl's version and its recorded
    values: show the plan, apply, wait, check."""
    from meshctl import __version__, components
    from meshctl.kube import objects
    from meshctl.kube.inventory import Inventory
    from meshctl.kube.resources import CONFIG_MAPS

    from .apply import Installer, all_kinds

    registry = components.load()
    # Read and validated before anything connects (a bad -f or --set is exit 2, as install's);
    # the revision and namespace find the record, the values come from it.
    sources = options.values_sources(files or ())
    where = registry.resolve(
        profile=None, files=sources, assignments=list(sets or ()), revision=revision,
        namespace=namespace,
    )  # fmt: skip
    kube = _connect(ctx)
    record_name = where.revisioned(mf.RECORD_NAME)
    record = objects.get(kube, CONFIG_MAPS, record_name, where.namespace)
    if record is None:
        raise MeshctlError(
            f"revision {where.revision!r} is not installed in {where.namespace} "
            f"(no install record {record_name})",
            hint=f"install it: 'meshctl install --revision {where.revision}'",
        )
    values = up.recorded_values(
        registry,
        record,
        files=sources,
        assignments=list(sets or ()),
    )
    rendered = mf.render(registry, values)
    inventory = Inventory(kube)
    live = {item.key: inventory.get(item.object) for item in rendered}
    kinds = [k for k in all_kinds(registry, values) if k[1] not in ("Namespace",)]
    installed = inventory.list_labelled(kinds, mf.selector(values.revision))
    steps = up.plan(rendered, live, installed)
    _say(
        f"revision {values.revision!r} ({values.profile} profile): meshctl "
        f"{up.recorded_version(record)} -> {__version__}: {up.summary(steps)}"
    )
    rows = [s.row() for s in steps]
    text = render(rows, output, table=up.table(steps), names=[str(r["object"]) for r in rows])
    options.write_output(text, output_file)
    installer = Installer(inventory, registry, values, rendered, say=_say)
    if dry_run == "server":
        # What would stop the upgrade stops it here too; each object through admission.
        problems = installer.preflight()
        if problems and not force:
            _refuse(problems)
        installer.dry_run()
    if dry_run != "none":
        return
    if all(s.action == up.UNCHANGED for s in steps):
        _say(f"✔ revision {values.revision!r} is up to date: nothing to apply")
        return
    _confirm(
        f"This upgrades revision {values.revision!r} in {kube.source} "
        f"[{kube.api.configuration.host}]. Proceed?",
        yes,
    )
    apply_and_wait(installer, force, readiness_timeout)
    _check(inventory, rendered, values.revision)


def _check(inventory: Any, rendered: list[mf.Rendered], revision: str) -> None:
    """After the wait: every object of the manifest is live and holds what it sets."""
    drifted = []
    for item in rendered:
        found = inventory.get(item.object)
        if found is None or up.plan([item], {item.key: found})[0].action != up.UNCHANGED:
            drifted.append(str(item.key))
    if drifted:
        raise CheckFailedError(
            f"after the upgrade {len(drifted)} object(s) differ from the manifest: "
            + ", ".join(drifted[:5]),
            hint=f"see 'meshctl verify --revision {revision}'",
        )
    _say(f"✔ revision {revision!r} upgraded: every object matches the manifest and is ready")
