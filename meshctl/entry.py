"""The process entry point: dispatch raw plugins fast, everything else to the Typer root command.

A plugin whose entry point names a plain function ``main(argv: list[str]) -> int`` is "raw": it
runs without the CLI framework (no typer, no pydantic), for processes where start-up time and
memory matter (the data-plane subprocess, the CNI plugin). Everything else goes to
``meshctl.cli.main``. Invariant: errors look the same on both paths (``Error:``/``Hint:``).

The CNI plugin is this same binary installed as ``meshctl-cni``: a process whose executable is
named ``meshctl-cni``, or one started with ``CNI_COMMAND`` set and no arguments (the runtime passes
none), runs the raw plugin registered as ``cni-plugin``. Anything with arguments is the CLI, so a
stray ``CNI_COMMAND`` in a user's shell never changes what ``meshctl version`` does.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from meshctl.errors import EXIT_RUNTIME, MeshctlError, format_error

RawMain = Callable[[list[str]], int]

CNI_BINARY_NAME = "meshctl-cni"
CNI_PLUGIN_COMMAND = "cni-plugin"


def cni_invocation(argv0: str, args: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether this process is the container runtime running us as a CNI plugin."""
    return Path(argv0).name == CNI_BINARY_NAME or (bool(env.get("CNI_COMMAND")) and not args)


def cni_plugin() -> RawMain:
    """The CNI plugin's ``main``, found by its entry point alone (no other plugin is looked at)."""
    from meshctl.plugins import find, load

    info = find(CNI_PLUGIN_COMMAND)
    target = load(info) if info is not None else None
    if not isinstance(target, types.FunctionType):
        raise MeshctlError(
            f"no CNI plugin: the {CNI_PLUGIN_COMMAND!r} entry point is missing or not a function",
            hint="reinstall meshctl",
        )
    return target


def raw_plugin(argv: Sequence[str]) -> tuple[RawMain, list[str]] | None:
    """The raw plugin function ``argv`` invokes and its arguments, or None for the Typer path."""
    if not argv or argv[0].startswith("-"):
        return None
    from meshctl.plugins import find, load

    info = find(argv[0])  # one entry point, no manifests: raw plugins are start-up critical
    if info is None:
        return None
    target = load(info)
    if not isinstance(target, types.FunctionType):
        return None
    return target, list(argv[1:])


def main(argv: Sequence[str] | None = None) -> int:
    """Run meshctl with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if argv is None and cni_invocation(sys.argv[0], args, os.environ):
            return int(cni_plugin()(args))
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
