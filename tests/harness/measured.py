"""One command run with its own cost measured: wall time and the child's peak memory.

Owns ``run_measured``: the child's output goes to files (no pipe can fill and stall it), and a
child still running at the deadline is killed and reported as such. The peak is measured by a
small launcher (``python -S``) that forks the command and reaps it with ``os.wait4``: Linux
records the high-water mark of the image a process replaces at exec, so a command forked
straight from this (large) test process would report this process's size, not its own.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path

MESHCTL = (sys.executable, "-m", "meshctl")
# argv[1]: where to write the child's peak (KiB) and CPU seconds; argv[2:]: the command. Exits as
# the child did.
_LAUNCHER = """
import os, sys
pid = os.fork()
if pid == 0:
    try:
        os.execvp(sys.argv[2], sys.argv[2:])
    finally:
        os._exit(127)
_, status, usage = os.wait4(pid, 0)
with open(sys.argv[1], "w") as out:
    out.write(f"{usage.ru_maxrss} {usage.ru_utime + usage.ru_stime}")
code = os.waitstatus_to_exitcode(status)
if code < 0:
    os.kill(os.getpid(), -code)
sys.exit(code)
"""


@dataclass(frozen=True, slots=True)
class Measured:
    """What one run did and cost."""

    argv: tuple[str, ...]
    returncode: int  # negative: killed by that signal (-9: by the deadline)
    stdout: str
    stderr: str
    seconds: float  # wall clock
    cpu_seconds: float  # the child's own user + system time: its work, whatever the machine's load
    max_rss_mib: float
    timed_out: bool

    def describe(self) -> str:
        """For assertion messages: the command, what it cost, the end of its stderr."""
        shown = " ".join(self.argv)[:200]
        return (
            f"{shown}: exit {self.returncode}, {self.seconds:.2f}s ({self.cpu_seconds:.2f}s CPU), "
            f"{self.max_rss_mib:.0f} MiB"
            f"{' (killed at the deadline)' if self.timed_out else ''}\n"
            f"stdout: {self.stdout[:300]!r}\nstderr: {self.stderr[-1500:]}"
        )


def run_measured(
    argv: tuple[str, ...] | list[str],
    *,
    stdin: bytes | Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 30.0,
    cwd: Path | None = None,
) -> Measured:
    """Run ``argv`` to completion (or ``timeout``), stdin from bytes, a file or /dev/null."""
    with tempfile.TemporaryDirectory(prefix="meshctl-measured-") as tmp:
        out_path, err_path = Path(tmp) / "out", Path(tmp) / "err"
        if isinstance(stdin, bytes):
            in_path = Path(tmp) / "in"
            in_path.write_bytes(stdin)
        else:
            in_path = stdin if stdin is not None else Path(os.devnull)
        with (
            in_path.open("rb") as stdin_file,
            out_path.open("wb") as out_file,
            err_path.open("wb") as err_file,
        ):
            peak_path = Path(tmp) / "peak"
            start = time.monotonic()
            process = subprocess.Popen(
                [sys.executable, "-S", "-c", _LAUNCHER, str(peak_path), *argv],
                stdin=stdin_file,
                stdout=out_file,
                stderr=err_file,
                env={**os.environ, **(env or {})},
                cwd=cwd,
                start_new_session=True,  # a deadline kill takes its children too
            )
            killed = threading.Event()

            def deadline() -> None:
                killed.set()
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)

            timer = threading.Timer(timeout, deadline)
            timer.start()
            try:
                returncode = process.wait()
            finally:
                timer.cancel()
            seconds = time.monotonic() - start
        peak, cpu = (peak_path.read_text() if peak_path.exists() else "0 0").split()
        return Measured(
            argv=tuple(argv),
            returncode=returncode,
            stdout=out_path.read_text(errors="replace"),
            stderr=err_path.read_text(errors="replace"),
            seconds=seconds,
            cpu_seconds=float(cpu),
            max_rss_mib=int(peak) / 1024,  # Linux reports KiB
            timed_out=killed.is_set(),
        )


def meshctl(*args: str, **kwargs: object) -> Measured:
    """``meshctl ARGS`` through the real entry point, measured."""
    return run_measured((*MESHCTL, *args), **kwargs)  # type: ignore[arg-type]
