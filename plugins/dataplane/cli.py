"""``meshctl ztunnel-dataplane``: the hidden subcommand the supervisor starts (never by hand).

A raw plugin (a plain ``main(argv) -> int``, see meshctl/entry.py): the data plane starts without
typer and pydantic, which would cost start-up time and ~8 MB of resident memory per worker. So the
supervisor passes the log settings as this command's own flags, after the command name: global
flags before it would send the process through the Typer root command.
"""

from __future__ import annotations

import argparse

from meshctl import logs
from meshctl.config import LOG_FORMATS, LOG_LEVELS
from meshctl.errors import UserError


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(
            f"ztunnel-dataplane: {message}",
            hint="this command is started by 'meshctl ztunnel run', not by hand",
        )


def preload() -> None:
    """Import what ``main`` runs, for a fork server (meshctl/forkserver.py): its workers then
    start with the runtime, the event loop and their libraries already in memory, shared."""
    import uvloop  # noqa: F401

    from .main import libc_name
    from .runtime import Runtime  # noqa: F401

    libc_name()


def main(argv: list[str]) -> int:
    """Parse ``--channel-fd N`` and run the data plane fed over that inherited socket."""
    parser = _Parser(
        prog="meshctl ztunnel-dataplane",
        description="Run the HBONE data plane, fed by 'meshctl ztunnel run' over a socket.",
    )
    parser.add_argument("--channel-fd", type=int, required=True)
    parser.add_argument("--log-level", default="info", choices=LOG_LEVELS)
    parser.add_argument("--log-format", default="text", choices=LOG_FORMATS)
    args = parser.parse_args(argv)
    logs.configure(args.log_level, args.log_format)
    from .main import run

    return run(args.channel_fd)
