"""The proxy's run directory: a folder another run holds survives a sweep, an abandoned one
goes, and a directory that is not this user's own is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from meshctl import rundir
from meshctl.errors import UserError

HOLD = """
import fcntl, os, sys, time
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
time.sleep(60)
"""


def test_a_sweep_removes_only_folders_no_live_run_holds(tmp_path):
    with rundir.metrics_dir(tmp_path) as mine:
        abandoned = tmp_path / "metrics-dead"
        abandoned.mkdir()
        (abandoned / rundir.LOCK).touch()
        held = tmp_path / "metrics-live"
        held.mkdir()
        (held / rundir.LOCK).touch()
        holder = subprocess.Popen(
            [sys.executable, "-c", HOLD, str(held / rundir.LOCK)], stdout=subprocess.PIPE, text=True
        )
        try:
            assert holder.stdout is not None
            assert holder.stdout.readline() == "held\n"
            young = tmp_path / "metrics-starting"  # no lock file yet: a run being born
            young.mkdir()
            assert rundir.sweep(tmp_path) == [abandoned]
            assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
                [mine.name, "metrics-live", "metrics-starting"]
            )
        finally:
            holder.kill()
            holder.wait()
        old = time.time() - 3600
        os.utime(young, (old, old))
        assert sorted(rundir.sweep(tmp_path)) == sorted([held, young])
        assert mine.is_dir()  # ours is held by this process
    assert list(tmp_path.iterdir()) == []


def test_a_run_dir_others_may_write_is_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o777)
    shared.chmod(0o777)
    with pytest.raises(UserError, match="is not this user's own"):
        rundir.prepare(shared)
    link = tmp_path / "link"
    link.symlink_to(tmp_path)
    with pytest.raises(UserError, match="is not this user's own"):
        rundir.prepare(link)
    made = rundir.prepare(tmp_path / "new" / "run")
    assert made.stat().st_mode & 0o777 == 0o700
