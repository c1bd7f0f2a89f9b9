"""The ambient benchmark still runs: its ``--smoke`` mode produces every figure (no speed is
asserted; the figures come from running it for real)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness.kube import locate_binaries

pytestmark = [pytest.mark.kube, pytest.mark.netns, pytest.mark.slow]

BENCH = Path(__file__).with_name("bench_ambient.py")


def test_bench_ambient_smoke_mode_produces_every_figure():
    binaries = locate_binaries()
    if isinstance(binaries, str):
        pytest.skip(binaries)  # it starts its own kube-apiserver from the cached build
    done = subprocess.run(
        [sys.executable, str(BENCH), "--smoke"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out[-4000:]
    assert "bench_ambient: every figure produced" in done.stdout, out[-4000:]
    for figure in ("CNI ADD to listeners up", "node proxy RSS", "single stream"):
        assert figure in done.stdout
