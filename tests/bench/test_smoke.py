"""Every benchmark still runs: its ``--smoke`` mode (tiny sizes, seconds) produces its figures.

No speed is asserted here; the figures themselves come from running the benchmarks for real.
The privileged ones carry the markers of what they need, so under ``CI=true`` they run or fail.
"""

from __future__ import annotations

import pytest

from tests.bench.__main__ import run

CASES = [
    pytest.param("bench_help", id="help"),
    pytest.param("bench_cli_help", id="cli-help"),
    pytest.param("bench_inject", id="inject"),
    pytest.param("bench_inject_stream", id="inject-stream"),
    pytest.param("bench_capture", id="capture", marks=pytest.mark.netns),
    pytest.param("bench_hbone", id="hbone", marks=pytest.mark.netns),
    pytest.param("bench_hbone_core", id="hbone-core"),
    pytest.param("bench_hbone_relay", id="hbone-relay"),
    pytest.param("bench_probe", id="probe", marks=pytest.mark.netns),
    pytest.param("bench_cni", id="cni", marks=pytest.mark.kube),
]


@pytest.mark.parametrize("name", CASES)
def test_benchmark_smoke_mode_produces_its_figures(name):
    if name == "bench_cni":  # it starts its own kube-apiserver from the cached build
        from tests.harness.kube import locate_binaries

        binaries = locate_binaries()
        if isinstance(binaries, str):
            pytest.skip(binaries)
    passed, out = run(name, smoke=True, timeout=300)
    assert passed, out[-4000:]
