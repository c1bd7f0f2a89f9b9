"""The ``meshctl version`` command: client facts, and the API server's version with --server."""

from __future__ import annotations

from typing import Annotated, Any

import typer

from meshctl.config import GlobalSettings
from meshctl.output import OutputFormat, render

from .info import client_info

app = typer.Typer(add_completion=False, pretty_exceptions_enable=False, rich_markup_mode=None)


@app.command()
def version(
    ctx: typer.Context,
    output: Annotated[
        OutputFormat, typer.Option("-o", "--output", help="Output format.")
    ] = OutputFormat.TABLE,
    server: Annotated[
        bool, typer.Option("--server", help="Also ask the Kubernetes API server for its version.")
    ] = False,
) -> None:
    """Print meshctl's version, Python and key dependency versions."""
    data: dict[str, Any] = client_info()
    if server:
        # Deferred: only --server pays for the Kubernetes client.
        from meshctl.kube.client import KubeSettings, connect
        from meshctl.kube.version import server_version

        settings: GlobalSettings = ctx.obj
        kube = connect(KubeSettings(kubeconfig=settings.kubeconfig, context=settings.context))
        data["server"] = server_version(kube)
    typer.echo(render(data, output), nl=False)
