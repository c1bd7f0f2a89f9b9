"""A proxy's run directory: files that live as long as one ``ztunnel run`` or ``gateway run
--workers N`` (the workers' multiprocess metrics), kept together so a proxy killed hard leaves
nothing elsewhere.

Each run holds ``metrics-XXXX/`` with an flock on ``metrics-XXXX/.lock`` for its life; the
kernel drops the lock when the process dies, SIGKILL included. Every start removes the
``metrics-*`` folders whose lock nobody holds (what killed runs left). Invariants: the run
directory is this user's own (created 0700, refused when it is a symlink, another user's, or
writable by others); nothing outside it is created or removed.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

from meshctl.errors import UserError

PREFIX = "metrics-"
LOCK = ".lock"
# A folder without its lock file yet is a run between mkdir and flock: left alone this long.
_YOUNG_SECONDS = 60.0


def default_run_dir(role: str) -> Path:
    """``$TMPDIR/meshctl-<role>-<uid>`` (a pod's /tmp is its own emptyDir)."""
    return Path(tempfile.gettempdir()) / f"meshctl-{role}-{os.geteuid()}"


def option_help(role: str) -> str:
    """The ``--run-dir`` help every role that keeps a run directory shows."""
    return (
        "This run's files, e.g. the workers' metrics; what a killed run left there is removed "
        f"at start ($TMPDIR/meshctl-{role}-UID)."
    )


def prepare(run_dir: Path) -> Path:
    """The run directory, created if missing; a ``UserError`` when it is not safely ours."""
    try:
        run_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        st = run_dir.lstat()
    except OSError as exc:
        raise UserError(
            f"cannot make the run directory {run_dir}: {exc.strerror or exc}",
            hint="give a writable --run-dir (MESHCTL_RUN_DIR)",
        ) from exc
    if run_dir.is_symlink() or st.st_uid != os.geteuid() or st.st_mode & 0o022:
        raise UserError(
            f"the run directory {run_dir} is not this user's own (a symlink, another user's, "
            "or writable by others)",
            hint="remove it, or give another --run-dir (MESHCTL_RUN_DIR)",
        )
    return run_dir


def sweep(run_dir: Path) -> list[Path]:
    """Remove what killed runs left (``metrics-*`` whose lock is free); returns what went."""
    removed: list[Path] = []
    with contextlib.suppress(FileNotFoundError):
        for child in run_dir.iterdir():
            if child.name.startswith(PREFIX) and child.is_dir() and _abandoned(child):
                shutil.rmtree(child, ignore_errors=True)
                removed.append(child)
    return removed


def _abandoned(folder: Path) -> bool:
    try:
        fd = os.open(folder / LOCK, os.O_RDWR | os.O_CLOEXEC)
    except FileNotFoundError:
        with contextlib.suppress(OSError):
            return time.time() - folder.stat().st_mtime > _YOUNG_SECONDS
        return False
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False  # a live run holds it
    finally:
        os.close(fd)  # closing drops the lock we may have taken
    return True


@contextlib.contextmanager
def metrics_dir(run_dir: Path) -> Iterator[Path]:
    """This run's metrics folder in ``run_dir`` (after a sweep), locked while in use and
    removed on the way out."""
    prepare(run_dir)
    sweep(run_dir)
    folder = Path(tempfile.mkdtemp(prefix=PREFIX, dir=run_dir))
    fd = os.open(folder / LOCK, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield folder
    finally:
        shutil.rmtree(folder, ignore_errors=True)
        os.close(fd)
