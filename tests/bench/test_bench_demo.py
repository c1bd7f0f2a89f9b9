"""The demo benchmark still runs: ``--smoke`` produces every figure (no speed asserted)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.netns

BENCH = Path(__file__).with_name("bench_demo.py")


def test_bench_demo_smoke_mode_produces_every_figure():
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"],
        capture_output=True,
        text=True,
        timeout=400,
        check=False,
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "bench_demo: every figure produced" in done.stdout
    assert "ambient: demo start -> first encrypted byte" in done.stdout
    assert "baseline: sidecar mode, same runs" in done.stdout
