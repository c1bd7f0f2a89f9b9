"""``meshctl verify``: run every contributed check, print one report, exit 3 on any failure.

Invariants: the checks come from the components and the ``meshctl.checks`` group (this plugin
adds only the cluster-wide ones); a check that raises is a failure with its message, never a
traceback; a fatal failure (API unreachable, nothing installed) ends the run; the report and the
exit code are decided by ``meshctl.core.k8s.install.checks`` alone; ``--wait`` reruns until
nothing fails or the time is up, then reports once. ``--proxy`` runs the ``--workload`` checks
for every meshed pod instead, one row per pod (``proxies``).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer

from meshctl import options
from meshctl.core.k8s.install.checks import (
    Check,
    Outcome,
    Ran,
    Result,
    exit_code,
    report_json,
    report_text,
    selected,
)
from meshctl.core.k8s.install.components import PROFILE_HELP
from meshctl.errors import MeshctlError, UserError
from meshctl.output import OutputFormat, render
from meshctl.values import Duration, format_duration

if TYPE_CHECKING:
    from meshctl.core.k8s.install.components import Registry, Values

app = options.command_app()

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
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
    wait: Annotated[
        float | None,
        options.option(
            "--wait",
            parse=Duration(),
            help="Retry failing checks for up to this long (e.g. 2m).",
            show_default=False,
        ),
    ] = None,
    workload: Annotated[
        str | None,
        typer.Option(
            "--workload", metavar="NAMESPACE/POD", help="Also check that pod's data plane."
        ),
    ] = None,
    proxy: Annotated[
        bool,
        typer.Option(
            "--proxy",
            help="Run --workload's data-plane checks for every meshed pod: one row per pod.",
        ),
    ] = False,
    proxy_namespace: Annotated[
        str | None,
        typer.Option(
            "--proxy-namespace",
            metavar="NAME",
            help="With --proxy: only this namespace's pods (default: every namespace).",
        ),
    ] = None,
    revision: Annotated[
        str | None,
        typer.Option(
            "--revision", "-r", metavar="REVISION", help="The install revision (default)."
        ),
    ] = None,
    namespace: Annotated[
        str | None, options.namespace("The mesh's namespace (meshctl-system).")
    ] = None,
    profile: Annotated[
        str | None,
        typer.Option(
            "--profile",
            "-p",
            metavar="|".join(PROFILE_HELP),
            help="With --pre: the profile to install.",
        ),
    ] = None,
    sets: Annotated[
        list[str] | None,
        typer.Option("--set", "-s", metavar="KEY=VALUE", help="With --pre: install values."),
    ] = None,
    files: Annotated[
        list[str] | None,
        options.filename("With --pre: values files, directories of them, or - for stdin."),
    ] = None,
) -> None:
    """Check the installed mesh (or, with --pre, the cluster before install).

    -o table is the checklist, json/yaml the report, name the failing checks (none: healthy).
    """
    from meshctl import components
    from meshctl.core.k8s.install import manifest as mf
    from meshctl.core.k8s.install.context import CheckContext
    from meshctl.core.k8s.install.upgrade import recorded_values
    from meshctl.kube.inventory import Inventory

    from . import builtin

    deadline = wait or 0.0
    if not pre and (profile or sets or files):
        raise UserError(
            "--profile, --set and -f describe an install to come: use them with --pre",
            hint="without --pre verify reads the installed values from the cluster",
        )
    if workload is not None and (workload.count("/") != 1 or not all(workload.split("/"))):
        raise UserError(f"--workload {workload!r}: expected NAMESPACE/POD", hint="e.g. shop/web-1")
    if workload is not None and pre:
        raise UserError("--workload checks a running pod: not with --pre", hint="drop one of them")
    _proxy_options(proxy=proxy, namespace=proxy_namespace, pre=pre, workload=workload)
    registry = components.load()
    record = None
    if pre:  # what the user gave is checked before anything connects (a bad -f is exit 2)
        values = registry.resolve(
            profile=profile,
            files=options.values_sources(files or ()),
            assignments=list(sets or ()),
            revision=revision,
            namespace=namespace,
        )
    kube = _reach(ctx, deadline)
    if isinstance(kube, Ran):  # no cluster: its failed check is the whole report
        _report([kube], output, output_file)
    if not pre:
        base = registry.resolve(profile=None, revision=revision, namespace=namespace)
        record = _record(kube, base.revisioned(mf.RECORD_NAME), base.namespace)
        values = recorded_values(registry, record) if record else base
    checks = list(builtin.CHECKS)
    for component in registry.components:
        checks += component.checks
    checks += components.load_checks()
    if proxy:
        pod_checks = [c for c in selected(checks, pre=False, workload=True) if c.workload]
        _verify_proxies(
            kube,
            registry,
            values,
            record,
            pod_checks,
            proxy_namespace,
            deadline,
            output,
            output_file,
        )
        return
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
        count = sum(r.result.outcome is Outcome.FAIL for r in ran)
        sys.stderr.write(
            f"{count} check(s) failing; retrying (--wait {format_duration(deadline)})\n"
        )
        time.sleep(RETRY_INTERVAL)
        if not pre:
            record = _record(kube, values.revisioned(mf.RECORD_NAME), values.namespace)
    _report(ran, output, output_file)


def _proxy_options(*, proxy: bool, namespace: str | None, pre: bool, workload: str | None) -> None:
    if proxy and (pre or workload is not None):
        raise UserError(
            "--proxy checks every meshed pod: not with --pre or --workload",
            hint="drop one of them",
        )
    if namespace is not None and not proxy:
        raise UserError("--proxy-namespace goes with --proxy", hint="add --proxy")


def _verify_proxies(
    kube: Any,
    registry: Registry,
    values: Values,
    record: Mapping[str, object] | None,
    checks: Sequence[Check],
    namespace: str | None,
    wait: float,
    output: OutputFormat,
    output_file: Path | None,
) -> None:
    """``--proxy``: the pod checks for each meshed pod, one row each; exit 3 on any failure."""
    from meshctl.core.k8s.install import manifest as mf
    from meshctl.core.k8s.install.context import CheckContext
    from meshctl.kube import objects
    from meshctl.kube.inventory import Inventory
    from meshctl.kube.resources import PODS

    from . import proxies

    rendered = mf.render(registry, values)

    def context(workload: str) -> CheckContext:
        built = CheckContext(
            kube=kube,
            cluster=Inventory(kube),
            registry=registry,
            values=values,
            rendered=rendered,
            workload=workload,
        )
        built.memo["record"] = record
        return built

    give_up = time.monotonic() + wait
    while True:
        pods = proxies.meshed(objects.list_objects(kube, PODS, namespace)[0])
        results = proxies.check_pods(pods, checks, context, run_checks)
        code = proxies.code(results)
        if code == 0 or time.monotonic() + RETRY_INTERVAL > give_up:
            break
        failing = sum(proxies.code([r]) != 0 for r in results)
        sys.stderr.write(f"{failing} pod(s) failing; retrying (--wait {format_duration(wait)})\n")
        time.sleep(RETRY_INTERVAL)
    records = proxies.rows(results)
    names = [f"{r['namespace']}/{r['name']}" for r in records if r["result"] == "error"]
    options.write_output(
        render(records, output, table=proxies.table(records), names=names), output_file
    )
    if code:
        raise typer.Exit(code)


def _report(ran: list[Ran], output: OutputFormat, output_file: Path | None) -> None:
    failing = [r for r in ran if r.result.outcome is Outcome.FAIL]
    names = [f"{r.check.category}: {r.check.description}" for r in failing]
    options.write_output(
        render(report_json(ran), output, table=report_text(ran), names=names), output_file
    )
    code = exit_code(ran)
    if code:
        raise typer.Exit(code)


def _reach(ctx: typer.Context, wait: float) -> Any:
    """A client of a cluster that answers (``/version``), or, when none does within ``--wait``,
    the failed "can reach the cluster" check, worded as ``version --server`` words it."""
    from meshctl.kube.client import connect
    from meshctl.kube.version import server_version

    from .builtin import REACH

    give_up = time.monotonic() + wait
    while True:
        try:
            kube = connect(options.kube_settings(ctx))  # --kubeconfig, --context, timeout
            server_version(kube)
        except MeshctlError as exc:
            if time.monotonic() + RETRY_INTERVAL > give_up:
                hint = exc.hint or "check --kubeconfig and --context"
                return Ran(check=REACH, result=Result.fail(exc.message, hint))
            sys.stderr.write(
                f"cannot reach the cluster; retrying (--wait {format_duration(wait)})\n"
            )
            time.sleep(RETRY_INTERVAL)
            continue
        return kube


def _record(kube: Any, name: str, namespace: str) -> Mapping[str, object] | None:
    from meshctl.kube import objects
    from meshctl.kube.resources import CONFIG_MAPS

    return objects.get(kube, CONFIG_MAPS, name, namespace)
