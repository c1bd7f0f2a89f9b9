"""The ``meshctl version`` command: client facts, and the API server's version with --server."""

from __future__ import annotations

from typing import Annotated

import typer

from meshctl import options
from meshctl.errors import MeshctlError
from meshctl.output import OutputFormat, render

from .info import VersionInfo, client_info

app = options.command_app()


@app.command()
def version(
    ctx: typer.Context,
    output: options.OutputOption = OutputFormat.TABLE,
    output_file: options.OutputFileOption = None,
    server: Annotated[
        bool, typer.Option("--server", help="Also ask the Kubernetes API server for its version.")
    ] = False,
) -> None:
    """Print meshctl's version, Python and key dependency versions (and the API server's)."""
    data = client_info()
    failure: MeshctlError | None = None
    if server:
        # Deferred: only --server pays for the Kubernetes client.
        from meshctl.kube.client import connect
        from meshctl.kube.version import server_version

        try:
            data["server"] = server_version(connect(options.kube_settings(ctx)))
        except MeshctlError as exc:  # the client's half is printed first, as kubectl does
            failure = exc
    options.write_output(render(data, output, table=_table(data), names=_names(data)), output_file)
    if failure is not None:
        raise failure


def _table(data: VersionInfo) -> dict[str, str | bool]:
    """One row per component: meshctl, the interpreter, each dependency, the server."""
    rows: dict[str, str | bool] = {
        "meshctl": data["meshctl"],
        "python": f"{data['python']} ({data['implementation']})",
        "platform": data["platform"],
        "frozen": data["frozen"],
    }
    rows.update({name: v or "not installed" for name, v in data["dependencies"].items()})
    facts = data.get("server")
    if facts is not None:
        rows["server"] = f"{facts.get('gitVersion', '?')} ({facts.get('platform', '?')})"
    return rows


def _names(data: VersionInfo) -> list[str]:
    names = [f"meshctl/{data['meshctl']}"]
    facts = data.get("server")
    if facts is not None:
        names.append(f"kubernetes/{facts.get('gitVersion', '?')}")
    return names
