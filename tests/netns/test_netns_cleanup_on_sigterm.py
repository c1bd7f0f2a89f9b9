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
