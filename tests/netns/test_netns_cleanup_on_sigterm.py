"""A test run stopped with SIGTERM still removes the namespaces its tests made (the harness
turns SIGTERM into an interrupt, so fixture teardowns and finally blocks run)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.harness import netns as netns_mod

pytestmark = pytest.mark.netns

ROOT = Path(__file__).resolve().parents[2]
# The inner run is outside the repo: load the harness plugin (its fixtures) by name.
PYTEST = (
    sys.executable,
    "-m",
    "pytest",
    "-q",
    "-p",
    "no:cacheprovider",
    "-p",
    "tests.harness.plugin",
)

INNER = """
import time
from pathlib import Path

def test_waits_inside_namespaces(netns_factory, tmp_path):
    names = [netns_factory("sigt").name for _ in range(2)]
    Path({out!r}).write_text(" ".join(names))
    time.sleep(120)
"""


def test_a_run_stopped_with_sigterm_removes_its_namespaces(tmp_path):
    out = tmp_path / "names"
    test_file = tmp_path / "test_inner.py"
    test_file.write_text(INNER.format(out=str(out)))
    proc = subprocess.Popen(
        [*PYTEST, str(test_file)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        deadline = time.monotonic() + 60
        while not out.exists() or not out.read_text():
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            assert time.monotonic() < deadline, "the inner test never made its namespaces"
            time.sleep(0.1)
        names = out.read_text().split()
        assert all(netns_mod.exists(n) for n in names)
        proc.send_signal(signal.SIGTERM)
        proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert [n for n in names if netns_mod.exists(n)] == []


FORKED = """
import os, signal, time
from pathlib import Path

def test_forks_a_child_and_stops_it():
    child = os.fork()
    if child == 0:
        time.sleep(60)
        os._exit(0)
    time.sleep(0.3)
    os.kill(child, signal.SIGTERM)
    _, status = os.waitpid(child, 0)
    Path({out!r}).write_text(str(os.waitstatus_to_exitcode(status)))
"""


def test_a_fork_of_the_run_still_dies_of_sigterm_without_unwinding_the_run(tmp_path):
    """pyroute2's netns helper is a fork of the test process: SIGTERM must end it as SIGTERM
    does, not unwind the run's teardowns in the copy (which stopped the shared apiserver)."""
    out = tmp_path / "status"
    test_file = tmp_path / "test_forked.py"
    test_file.write_text(FORKED.format(out=str(out)))
    done = subprocess.run(
        [*PYTEST, str(test_file)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert out.read_text() == str(-signal.SIGTERM)
    assert "KeyboardInterrupt" not in done.stdout + done.stderr
