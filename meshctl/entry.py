"""The process entry point: dispatch raw plugins fast, everything else to the Typer root command.

A plugin whose entry point names a plain function ``main(argv: list[str]) -> int`` is "raw": it
runs without the CLI framework (no typer, no pydantic), for processes where start-up time and
memory matter (the data-plane subprocess, the CNI plugin). Everything else goes to
``meshctl.cli.main``. Invariant: errors look the same on both paths (``Error:``/``Hint:``).

The CNI plugin is this same binary installed as ``meshctl-cni``: a process whose executable is
named ``meshctl-cni``, or one started with ``CNI_COMMAND`` set and no arguments (the runtime passes
none), runs the CNI plugin (imported by its fixed name: see ``cni_plugin``). Anything with
arguments is the CLI, so a stray ``CNI_COMMAND`` in a user's shell never changes what
``meshctl version`` does.
"""

from __future__ import annotations

import os
import sys
import types
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import cast

from meshctl.errors import EXIT_RUNTIME, MeshctlError, format_error

RawMain = Callable[[list[str]], int]

COMPLETE_VAR = "_MESHCTL_COMPLETE"  # set by the completion scripts: a <TAB> asks
CNI_BINARY_NAME = "meshctl-cni"
CNI_PLUGIN_COMMAND = "cni-plugin"
CNI_PLUGIN_TARGET = "meshctl_plugins.cni_plugin.main:main"  # also the cni-plugin entry point
FORK_SERVER_COMMAND = "fork-server"  # meshctl.forkserver.COMMAND (not imported at every start)


def cni_invocation(argv0: str, args: Sequence[str], env: Mapping[str, str]) -> bool:
    """Whether this process is the container runtime running us as a CNI plugin."""
    return Path(argv0).name == CNI_BINARY_NAME or (bool(env.get("CNI_COMMAND")) and not args)


def cni_plugin() -> RawMain:
    """The CNI plugin's ``main``, imported by its fixed name, not looked up among entry points.

    The runtime runs this as root on every pod start: no other distribution may take the role
    over (an entry point of the same name earlier on the path would, under "first wins"), and
    the lookup would cost more than the rest of the start-up (importing ``importlib.metadata``
    alone is 20-40 ms of the 150 ms budget). The ``cni-plugin`` entry point names the same
    function for ``meshctl cni-plugin`` and for discovery; a test keeps the two equal.
    """
    import importlib

    module_name, _, attr = CNI_PLUGIN_TARGET.partition(":")
    try:
        target = getattr(importlib.import_module(module_name), attr)
    except (ImportError, AttributeError) as exc:
        raise MeshctlError(
            f"no CNI plugin: cannot load {CNI_PLUGIN_TARGET} ({type(exc).__name__}: {exc})",
            hint="reinstall meshctl",
        ) from exc
    if not isinstance(target, types.FunctionType):
        raise MeshctlError(
            f"no CNI plugin: {CNI_PLUGIN_TARGET} is not a function", hint="reinstall meshctl"
        )
    return cast(RawMain, target)


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


def preload_raw_plugin(command: str) -> None:
    """Import what raw plugin ``command`` runs, for a fork server: its module, then the module's
    ``preload()`` when it has one (the imports its ``main`` would do lazily)."""
    raw = raw_plugin([command])
    if raw is None:
        raise MeshctlError(f"{FORK_SERVER_COMMAND}: {command!r} is not a raw plugin")
    module = sys.modules.get(getattr(raw[0], "__module__", ""))
    hook = getattr(module, "preload", None)
    if callable(hook):
        hook()


def main(argv: Sequence[str] | None = None) -> int:  # noqa: PLR0911 (one return per way in)
    """Run meshctl with ``argv`` (default ``sys.argv[1:]``) and return the exit code."""
    args = list(sys.argv[1:] if argv is None else argv)
    request = os.environ.get(COMPLETE_VAR, "")
    if not args and request.startswith("complete_"):
        # A shell's <TAB>: answered from the cached command tree, without typer or a plugin.
        from meshctl.completion import answer

        return answer(os.environ, request.removeprefix("complete_"))
    try:
        if argv is None and cni_invocation(sys.argv[0], args, os.environ):
            return int(cni_plugin()(args))
        if args[:1] == [CNI_PLUGIN_COMMAND]:  # the launcher an unfrozen install writes
            return int(cni_plugin()(args[1:]))
        if args[:1] == [FORK_SERVER_COMMAND]:  # a supervisor's, forking its workers
            from meshctl import forkserver

            return forkserver.main(args[1:], preload=preload_raw_plugin, run=main)
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
