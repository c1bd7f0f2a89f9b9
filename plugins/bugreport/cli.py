"""``meshctl bug-report``: collect, redact, fit to the size cap, summarize, write one archive.

Invariants: nothing is written until everything is collected, and then atomically (``-O`` or a
timestamped name here); the summary is the archive's first member and what ``-o`` prints (the
archive's path included); the only fatal failures are a cluster that does not answer, a namespace
given with ``-n`` that does not exist, and a file that cannot be written: anything else missing
is a line of the summary.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Annotated

import typer

from meshctl import options
from meshctl.core.bugreport.layout import SUMMARY, Member, fit
from meshctl.core.bugreport.redact import redact_text
from meshctl.core.bugreport.summary import markdown, summarize
from meshctl.core.k8s.layout import MESH_NAMESPACE
from meshctl.output import OutputFormat, render

app = options.command_app()

MIB = 1024 * 1024
KIB = 1024
SUMMARY_ROOM = 256 * KIB  # of the total cap, kept for SUMMARY.md


@app.command()
def bug_report(
    ctx: typer.Context,
    namespace: Annotated[
        list[str] | None,
        options.namespace(
            "A namespace of meshed workloads to include (repeatable; default: every namespace "
            "labelled for the mesh)."
        ),
    ] = None,
    since: Annotated[
        float,
        options.duration(
            "--since", help="Logs of this long back (0: all the runtime kept).", maximum=30 * 86400
        ),
    ] = 86400.0,
    archive_file: Annotated[
        Path | None,
        options.option(
            "-O",
            "--output-file",
            parse=options.OutputFile(),
            help="The archive to write, replaced atomically (default: "
            "meshctl-bug-report-<UTC time>.tar.gz here).",
            show_default=False,
        ),
    ] = None,
    output: options.OutputOption = OutputFormat.TABLE,
    mesh_namespace: Annotated[
        str, typer.Option("--mesh-namespace", metavar="NAME", help="The mesh's namespace.")
    ] = MESH_NAMESPACE,
    max_size: Annotated[
        int,
        options.count(
            "--max-size",
            help="The report's size cap before compression, in MiB; what does not fit is cut or "
            "left out, and the summary says which.",
            minimum=1,
            maximum=4096,
            metavar="MIB",
        ),
    ] = 100,
    max_log_size: Annotated[
        int,
        options.count(
            "--max-log-size",
            help="Per log, in KiB: the newest lines are kept.",
            minimum=4,
            maximum=1024 * 1024,
            metavar="KIB",
        ),
    ] = 2048,
    concurrency: Annotated[
        int,
        options.count("--concurrency", help="Reads at once (logs, dumps).", minimum=1, maximum=64),
    ] = 8,
    proxy_timeout: Annotated[
        float,
        options.duration(
            "--proxy-timeout",
            help="How long one proxy's admin port or a node agent may take to answer.",
            positive=True,
            maximum=600,
        ),
    ] = 10.0,
) -> None:
    """Collect a bug report into one tar.gz: logs of the control plane and the proxies (previous
    runs too), the proxies' config dumps (port-forward, never exec), the install record, the
    mesh's objects and events, node CNI config, versions. Secrets, tokens and private keys are
    redacted. SUMMARY.md comes first; -o prints it (with the archive's path)."""
    from meshctl.kube.client import connect
    from meshctl.kube.version import server_version

    from . import archive
    from .collect import Collector, Settings

    target = archive_file or archive.default_name()
    kube = connect(options.kube_settings(ctx))
    version = server_version(kube)  # a cluster that does not answer ends it here, in one line
    settings = Settings(
        mesh_namespace=mesh_namespace,
        namespaces=list(namespace) if namespace else None,
        since=since or None,
        log_limit=max_log_size * KIB,
        total_limit=max_size * MIB,
        concurrency=concurrency,
        proxy_timeout=proxy_timeout,
    )
    members, collected = Collector(kube, settings).run(version)
    fitted = fit(members, max(0, settings.total_limit - SUMMARY_ROOM))
    collected = dataclasses.replace(collected, cut=fitted.cut, left_out=fitted.left_out)
    findings = summarize(collected)
    text = redact_text(markdown(findings, archive=str(target)))
    size = archive.write(target, [Member(SUMMARY, text.encode(), -1), *fitted.members])
    data = {"archive": str(target), "archiveBytes": size, **findings}
    options.write_output(render(data, output, table=text, names=[str(target)]), None)
