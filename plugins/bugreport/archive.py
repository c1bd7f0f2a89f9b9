"""Writing the report: one gzip-compressed tar, whole or not at all.

Owns the file: members written in the order given (``SUMMARY.md`` first) under one top-level
directory named after the archive, into a temporary file beside the target that is fsynced and
renamed over it only when complete. Invariants: on any failure or interruption (Ctrl-C) the
temporary file is removed and the target is untouched; the file is created 0600 (a report
describes the cluster even with its secrets taken out); members are regular files, 0644, with
one timestamp, so the archive lists and extracts the same everywhere.
"""

from __future__ import annotations

import io
import os
import tarfile
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

from meshctl.core.bugreport.layout import Member
from meshctl.errors import MeshctlError

SUFFIX = ".tar.gz"


def default_name(now: float | None = None) -> Path:
    """``meshctl-bug-report-<UTC time>.tar.gz`` in the current directory."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime(now))
    return Path(f"meshctl-bug-report-{stamp}{SUFFIX}")


def top_directory(target: Path) -> str:
    """The folder every member sits in: the archive's name without its suffix."""
    name = target.name
    for suffix in (SUFFIX, ".tgz", ".tar"):
        if name.endswith(suffix):
            return name[: -len(suffix)] or "bug-report"
    return name or "bug-report"


def write(target: Path, members: Sequence[Member], *, now: float | None = None) -> int:
    """The archive at ``target``, atomically; returns its size in bytes."""
    stamp = int(time.time() if now is None else now)
    top = top_directory(target)
    try:
        fd, temp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".tmp")
    except OSError as exc:
        raise MeshctlError(
            f"cannot write {target}: {exc.strerror or exc}",
            hint="check that the directory exists and is writable, or name another with -O",
        ) from exc
    staged = Path(temp)
    try:
        with os.fdopen(fd, "wb") as handle:
            with tarfile.open(fileobj=handle, mode="w:gz", format=tarfile.PAX_FORMAT) as tar:
                for member in members:
                    info = tarfile.TarInfo(f"{top}/{member.name}")
                    info.size = len(member.data)
                    info.mode = 0o644
                    info.mtime = stamp
                    tar.addfile(info, io.BytesIO(member.data))
            handle.flush()
            os.fsync(handle.fileno())
        staged.replace(target)
    except OSError as exc:
        staged.unlink(missing_ok=True)
        raise MeshctlError(
            f"cannot write {target}: {exc.strerror or exc}", hint="check the path and free space"
        ) from exc
    except BaseException:  # Ctrl-C or a bug: never leave a half-written archive behind
        staged.unlink(missing_ok=True)
        raise
    return target.stat().st_size
