"""The process entry point: dispatch raw plugins fast, everything else to the Typer root command.

A plugin whose entry point names a plain function ``main(argv: list[str]) -> int`` is "raw": it
runs without the CLI framework (no typer, no pydantic), for processes where start-up time and
memory matter (the data-plane subprocess, the CNI plugin). Everything else goes to
``meshctl.cli.main``. Invariant: errors look the same on both paths (``Error:``/``Hint:``).
"""

from __future__ import annotations

import inspect
import os
import sys
from collections.abc import Callable, Sequence

from meshctl.errors import EXIT_RUNTIME, MeshctlError, format_error

RawMain = Callable[[list[str]], int]


def raw_plugin(argv: Sequence[str]) -> tuple[RawMain, list[str]] | None:
    """The raw plugin function ``argv`` invokes and its arguments, or None for the Typer path."""
    if not argv or argv[0].startswith("-"):
        return None
    from meshctl.plugins import discover, load

    info = discover().get(argv[0])
    if info is None:
        return None
    target = load(info)
    if not inspect.isfunction(target):
        return None
    return target, list(argv[1:])


def main(argv: Sequence[str] | None = None) -> int:
    """Run meshctl with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        raw = raw_plugin(args)
        if raw is not None:
            function, rest = raw
            return int(function(rest))
    except MeshctlError as exc:
        sys.stderr.write(format_error(exc.message, exc.hint))
        return exc.exit_code
    except KeyboardInterrupt:
        return 130
    from meshctl.cli import main as cli_main

    return cli_main(args)


def run() -> None:
    """Console-script entrypoint (also ``python -m meshctl`` and the frozen binary)."""
    try:
        code = main()
        sys.stdout.flush()
    except BrokenPipeError:
        # stdout was closed early (piped into head): silence the interpreter's flush at exit.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        code = EXIT_RUNTIME
    sys.exit(code)
