"""``meshctl verify``: run every contributed check, print one report, exit 3 on any failure.

Invariants: the checks come from the components and the ``meshctl.checks`` group (this plugin
adds only the cluster-wide ones); a check that raises is a failure with its message, never a
traceback; a fatal failure (API unreachable, nothing installed) ends the run; the report and the
exit code are decided by ``meshctl.core.checks`` alone; ``--wait`` reruns until nothing fails or
the time is up, then reports once.
"""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Annotated, Any

import typer

from meshctl import config
from meshctl.core.checks import (
    Check,
    Outcome,
    Ran,
    Result,
    exit_code,
    report_json,
    report_text,
    selected,
)
from meshctl.errors import MeshctlError, UserError
from meshctl.output import OutputFormat, render

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)

RETRY_INTERVAL = 2.0


def run_checks(checks: Sequence[Check], ctx: Any) -> list[Ran]:
    ran: list[Ran] = []
    for check in checks:
        try:
            result = check.run(ctx)
        except MeshctlError as exc:
            result = Result.fail(exc.message, exc.hint or "see the message")
        except Exception as exc:  # noqa: BLE001 -- one broken check must not hide the others
            result = Result.fail(
                f"the check failed to run: {type(exc).__name__}: {exc}",
                hint="rerun with --debug and report it to the component's maintainers",
            )
        ran.append(Ran(check=check, result=result))
        if check.fatal and result.outcome is Outcome.FAIL:
            break
    return ran


@app.command()
def verify(
    ctx: typer.Context,
    pre: Annotated[
        bool, typer.Option("--pre", help="Before install: can this cluster take the mesh?")
    ] = False,
    output: Annotated[
        OutputFormat, typer.Option("--output", "-o", help="table (the checklist), json or yaml.")
    ] = OutputFormat.TABLE,
    wait: Annotated[
        str | None,
        typer.Option("--wait", help="Retry failing checks for up to this long (e.g. 2m)."),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option("--workload", help="NAMESPACE/POD: also check that pod's data plane."),
    ] = None,
    revision: Annotated[
        str | None, typer.Option("--revision", "-r", help="The install revision (default).")
    ] = None,
    namespace: Annotated[
        str | None, typer.Option("--namespace", "-n", help="The mesh's namespace (meshctl-system).")
    ] = None,
    profile: Annotated[
        str | None, typer.Option("--profile", "-p", help="With --pre: the profile to install.")
    ] = None,
    sets: Annotated[
        list[str] | None, typer.Option("--set", "-s", help="With --pre: install values.")
    ] = None,
    files: Annotated[
        list[Path] | None, typer.Option("--filename", "-f", help="With --pre: values files.")
    ] = None,
    request_timeout: Annotated[
        str, typer.Option("--request-timeout", help="Timeout of each API request.")
    ] = "10s",
) -> None:
    """Check the installed mesh (or, with --pre, the cluster before install)."""
    from meshctl import components
    from meshctl.core.install import manifest as mf
    from meshctl.core.install.context import CheckContext
    from meshctl.kube.client import KubeSettings, connect
    from meshctl.kube.inventory import Inventory

    from . import builtin

    deadline = config.duration(wait, "--wait") if wait else 0.0
    if not pre and (profile or sets or files):
        raise UserError(
            "--profile, --set and -f describe an install to come: use them with --pre",
            hint="without --pre verify reads the installed values from the cluster",
        )
    if workload is not None and (workload.count("/") != 1 or not all(workload.split("/"))):
        raise UserError(f"--workload {workload!r}: expected NAMESPACE/POD", hint="e.g. shop/web-1")
    if workload is not None and pre:
        raise UserError("--workload checks a running pod: not with --pre", hint="drop one of them")
    settings: config.GlobalSettings = ctx.obj
    kube = connect(
        KubeSettings(
            kubeconfig=settings.kubeconfig,
            context=settings.context,
            request_timeout=config.duration(request_timeout, "--request-timeout"),
        )
    )
    registry = components.load()
    flags = {"revision": revision, "namespace": namespace}
    record = None
    if pre:
        values = registry.resolve(
            profile=profile,
            files=config.values_files(files or ()),
            assignments=list(sets or ()),
            flags=flags,
        )
    else:
        base = registry.resolve(profile=None, flags=flags)
        record = _record(kube, base.revisioned(mf.RECORD_NAME), base.namespace)
        values = _installed_values(registry, record, flags) if record else base
    checks = list(builtin.CHECKS)
    for component in registry.components:
        checks += component.checks
    checks += components.load_checks()
    chosen = selected(checks, pre=pre, workload=workload is not None)
    give_up = time.monotonic() + deadline
    while True:
        context = CheckContext(
            kube=kube,
            cluster=Inventory(kube),
            registry=registry,
            values=values,
            rendered=mf.render(registry, values),
            pre=pre,
            workload=workload,
        )
        context.memo["record"] = record
        ran = run_checks(chosen, context)
        if exit_code(ran) == 0 or time.monotonic() + RETRY_INTERVAL > give_up:
            break
        failing = sum(r.result.outcome is Outcome.FAIL for r in ran)
        sys.stderr.write(f"{failing} check(s) failing; retrying (--wait {wait})\n")
        time.sleep(RETRY_INTERVAL)
        if not pre:
            record = _record(kube, values.revisioned(mf.RECORD_NAME), values.namespace)
    if output is OutputFormat.TABLE:
        typer.echo(report_text(ran), nl=False)
    else:
        typer.echo(render(report_json(ran), output), nl=False)
    code = exit_code(ran)
    if code:
        raise typer.Exit(code)


def _record(kube: Any, name: str, namespace: str) -> dict[str, Any] | None:
    from meshctl.kube import objects
    from meshctl.kube.resources import CONFIG_MAPS

    return objects.get(kube, CONFIG_MAPS, name, namespace)


def _installed_values(registry: Any, record: dict[str, Any], flags: dict[str, Any]) -> Any:
    """The values the install record holds: its profile, with what the user changed."""
    data = record.get("data") or {}
    try:
        changed = json.loads(data.get("values.json") or "{}")
    except ValueError as exc:
        raise MeshctlError(
            f"install record {record['metadata']['name']}: values.json is not JSON",
            hint="run 'meshctl install' again to rewrite it",
        ) from exc
    return registry.resolve(
        profile=str(data.get("profile") or "default"),
        files=[(f"install record {record['metadata']['name']}", changed)],
        flags=flags,
    )
