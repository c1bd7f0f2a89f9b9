"""The ``meshctl demo`` commands: run the demo (``--check``: assert it), ``down``, ``exec``.

Invariants: a run first undoes what an earlier, killed run left (its state record), and refuses
while another run is alive; SIGINT/SIGTERM end a run through the same teardown as a normal exit;
``--check`` exits 0 when every step passed, 3 otherwise, after printing the summary; this module
only wires: the scenario is ``scenario.py``, the record and teardown ``state.py``.
"""

from __future__ import annotations

import contextlib
import enum
import os
import shutil
import signal
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING, Annotated

import typer

from meshctl import options
from meshctl.errors import (
    EXIT_INTERRUPTED,
    EXIT_NOT_EXECUTABLE,
    EXIT_NOT_FOUND,
    CheckFailedError,
    MeshctlError,
    UserError,
)

if TYPE_CHECKING:
    from .scenario import Demo
    from .state import Record

app = options.command_app(
    help="A whole mesh on this machine: pods, CA, proxies, mTLS, policy (--check: assert it).",
    invoke_without_command=True,
)


class _Pod(enum.StrEnum):
    """The demo's pods (``exec`` refuses any other name before looking at the state)."""

    CLIENT = "client"
    SERVER = "server"
    LEGACY = "legacy"
    NODE = "node"  # the node's namespace: the CA, and in ambient mode the agent and node proxy


StateDir = Annotated[
    Path | None,
    options.output_directory(
        "--state-dir", help="Where the run's record lives.", env="MESHCTL_DEMO_STATE_DIR"
    ),
]


class _Stopped(Exception):  # noqa: N818 -- a signal, not an error
    """SIGINT or SIGTERM arrived: tear down and exit."""


def _on_signal(signum: int, _frame: FrameType | None) -> None:
    raise _Stopped(signal.Signals(signum).name)


def _need_root() -> None:
    if os.geteuid() != 0:
        raise UserError(
            "only a demo run as root outlives its command (--keep)",
            hint="run it with sudo; a demo run without root ends, and is removed, with Ctrl-C",
        )


def _clean_previous(folder: Path, say: Callable[[str], None]) -> None:
    from .state import Record, alive, still_up, teardown

    old = Record.load(folder)
    if old is None:
        return
    if alive(old.pid):
        raise UserError(
            f"a demo is already running (pid {old.pid}, state in {folder})",
            hint="stop it with Ctrl-C or 'meshctl demo down'",
        )
    if still_up(old):
        raise UserError(
            f"a demo left running with --keep is up (run {old.run_id}, state in {folder})",
            hint="use it ('meshctl demo exec client -- ...'), or remove it with "
            "'meshctl demo down' first",
        )
    errors = teardown(old)
    if errors:
        raise MeshctlError(
            f"could not remove what an earlier run left: {errors[0]}", hint="see 'ip netns list'"
        )
    say(f"cleaned up what an earlier run left (run {old.run_id})")


@app.callback()
def demo(
    ctx: typer.Context,
    check: Annotated[
        bool, typer.Option("--check", help="Run every step non-interactively; exit 0 or 3.")
    ] = False,
    keep: Annotated[
        bool, typer.Option("--keep", help="Leave the mesh running and print how to reach it.")
    ] = False,
    mode: Annotated[
        str,
        options.choice(
            "--mode",
            choices=("ambient", "sidecar"),
            help="ambient: one node proxy, pods enrolled by the node agent; sidecar: a proxy "
            "per pod.",
        ),
    ] = "ambient",
    state_dir: StateDir = None,
) -> None:
    """Build a small mesh from meshctl's real parts in network namespaces and show it working."""
    if ctx.invoked_subcommand is not None:
        return
    from . import rootless
    from .state import LOGS, Record, default_dir

    if os.geteuid() != 0:
        if keep:
            raise UserError(
                "--keep needs root: without root the demo lives in namespaces that end with it",
                hint="run 'sudo meshctl demo --keep', or 'meshctl demo' and stop it with Ctrl-C",
            )
        rootless.preflight()
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the inner demo's to handle
        # The state dir is chosen out here: inside, /run is the demo's own (and a failed run's
        # logs must outlive it).
        args = ["--mode", mode, "--state-dir", str(state_dir or default_dir())]
        raise typer.Exit(rootless.reexec([*args, *(["--check"] if check else [])]))
    if rootless.inside():
        rootless.become_init()  # PID 1 stays behind and reaps; this process runs the demo
        rootless.private_run()
    from .scenario import Demo

    folder = state_dir or default_dir()

    out = _Lines()

    def say(line: str) -> None:
        out.write(line)

    _clean_previous(folder, say)
    shutil.rmtree(folder / LOGS, ignore_errors=True)  # this run's logs only
    record = Record(folder=folder)
    record.save()
    run = Demo(record=record, say=say, mode=mode)
    previous = {s: signal.signal(s, _on_signal) for s in (signal.SIGINT, signal.SIGTERM)}
    kept = False
    stopped: str | None = None
    try:
        with contextlib.ExitStack() as screen:
            if sys.stdout.isatty() and not check:
                screen.enter_context(_live(run))
            kept = _run(run, check=check, keep=keep)
        if kept:
            record.kept = True
            record.save()
    except _Stopped as stop:
        stopped = str(stop)
        say(f"{stop}: removing the demo")
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if not kept:
            _teardown(record)
    if stopped is not None:
        logs = folder / LOGS
        if logs.is_dir() and any(logs.iterdir()):
            sys.stderr.write(f"removed the demo; its logs stay in {logs}\n")
        # Ctrl-C is an interruption (130, as a shell reports it); SIGTERM asked it to stop.
        raise typer.Exit(EXIT_INTERRUPTED if stopped == "SIGINT" else 0)


class _Lines:
    """The run's lines on stdout; once the reader is gone (``demo --check | head -1``) the
    rest are dropped and the run goes on, so its teardown and exit code are the same."""

    def __init__(self) -> None:
        self.closed = False

    def write(self, line: str) -> None:
        if self.closed:
            return
        try:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()
        except BrokenPipeError:
            self.closed = True
            # Nothing more reaches the reader; the interpreter's last flush must not fail either.
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
            os.close(devnull)


@contextlib.contextmanager
def _live(run: Demo) -> Iterator[None]:
    """The rich live view for a terminal; the run's lines feed it instead of stdout."""
    from rich.live import Live

    from .view import Screen

    screen = Screen(run)
    run.say = screen.say
    with Live(screen, refresh_per_second=4):
        yield


def _run(run: Demo, *, check: bool, keep: bool) -> bool:
    """The scenario, the summary, then: exit (--check), leave it running (--keep: True), or
    keep showing it until a signal."""
    from . import view

    try:
        run.build()
        run.start_client()
    except MeshctlError as exc:
        run.record_step("setup", False, exc.message)
        raise  # nothing to show or check without the mesh: Error/Hint, then teardown
    run.run_checks()
    for line in view.summary(run):
        run.say(line)
    failed = [s for s in run.steps if not s.ok]
    if check:
        if failed:
            raise CheckFailedError(
                f"{len(failed)} of {len(run.steps)} demo steps failed: "
                + ", ".join(s.name for s in failed),
                hint=f"the proxies' logs are in {run.folder / 'logs'}",
            )
        return False
    if keep:
        for line in view.how_to_poke(run):
            run.say(line)
        return True
    run.say("the mesh keeps running; Ctrl-C stops it and removes everything")
    while True:
        time.sleep(3)
        run.say(run.traffic())


def _teardown(record: Record) -> None:
    from .state import teardown

    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not cut teardown short
    try:
        errors = teardown(record)
    finally:
        signal.signal(signal.SIGINT, signal.default_int_handler)
    if errors:
        sys.stderr.write(f"Error: teardown left something behind: {errors[0]}\n")


@app.command("down")
def down(state_dir: StateDir = None) -> None:
    """Stop a demo left running (--keep) or killed, and remove everything it made."""
    _need_root()
    from .state import Record, alive, default_dir, teardown

    folder = state_dir or default_dir()
    record = Record.load(folder)
    if record is None:
        typer.echo("no demo to remove", err=True)
        return
    if alive(record.pid):
        os.kill(record.pid, signal.SIGTERM)  # it tears down itself; wait for it
        end = time.monotonic() + 10
        while alive(record.pid) and time.monotonic() < end:
            time.sleep(0.05)
    errors = teardown(record)
    if errors:
        raise MeshctlError(f"could not remove everything: {errors[0]}", hint="see 'ip netns list'")
    typer.echo(f"removed demo run {record.run_id}", err=True)


@app.command("exec", context_settings={"allow_extra_args": True, "ignore_unknown_options": True})
def exec_cmd(
    pod: Annotated[_Pod, typer.Argument(metavar="POD", help="The pod.", show_default=False)],
    command: Annotated[
        list[str], typer.Argument(metavar="COMMAND", help="The command to run in the pod")
    ],
    state_dir: StateDir = None,
) -> None:
    """Run a command inside one of the demo's pods (its network namespace)."""
    from meshctl.net import netns

    from .state import Record, default_dir

    folder = state_dir or default_dir()
    record = Record.load(folder)
    if record is None:
        raise UserError("no demo is running", hint="start one with 'meshctl demo --keep'")
    names = {info.get("name"): name for name, info in record.pods.items()}
    if record.node:
        names[_Pod.NODE.value] = record.node
    if pod not in names:
        raise UserError(
            f"no pod {pod.value!r} in the demo", hint=f"pods: {', '.join(map(str, names))}"
        )
    ref = netns.resolve(str(names[pod]))
    with netns.entered(ref):
        try:
            os.execvp(command[0], command)  # noqa: S606 -- the user's own command, on purpose
        except OSError as exc:
            # The command's own exit code once it runs; a shell's (and kubectl exec's) when it
            # cannot: 127 not found, 126 found but not runnable.
            missing = isinstance(exc, FileNotFoundError)
            raise MeshctlError(
                f"cannot run {command[0]!r} in pod {pod.value}: {exc.strerror}",
                hint="is it installed on this machine (the pod shares its files)?"
                if missing
                else "is it an executable file?",
                exit_code=EXIT_NOT_FOUND if missing else EXIT_NOT_EXECUTABLE,
            ) from exc
