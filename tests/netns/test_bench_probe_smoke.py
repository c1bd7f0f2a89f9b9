"""The probe benchmark's ``--smoke`` run: it runs end to end and prints its figures (CI)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.netns


def test_probe_benchmark_smoke_prints_figures():
    done = subprocess.run(
        [sys.executable, "-m", "tests.bench.bench_probe", "--smoke"],
        capture_output=True,
        text=True,
        timeout=180,
        cwd=Path(__file__).resolve().parents[2],
        check=False,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [line.split() for line in done.stdout.splitlines()[2:]]
    assert [" ".join(r[:2]) for r in rows] == ["HTTP GET", "TCP socket", "gRPC health"]
    assert all(len(r) == 7 for r in rows), done.stdout
