"""Benchmark: applying the default capture rule set into a fresh network namespace.

Run (root): python -m tests.bench.bench_capture [--runs N] [--smoke]
Measures ``meshctl.net.capture.apply`` per backend (detection, read, change, policy routing
included; ``iptc`` in-process, ``legacy``/``nft`` through the restore binaries) beside a bare
``iptables-{legacy,nft}-restore --noflush`` of the same text, all in the same run. Each sample
gets a brand-new namespace (created and removed outside the timed part). Prints the median and
p90 in ms with the targets (iptc <= 5 ms, restore <= 30 ms). Figures, not a gate.
``--smoke``: two runs each, only checks that every figure was produced (CI).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from meshctl.config import resolve
from meshctl.core.capture.plan import plan
from meshctl.core.capture.render import render_apply
from meshctl.core.capture.rules import Family
from meshctl.core.capture.settings import CaptureSettings
from meshctl.net import capture, libiptc, netns
from tests.bench.smoke import figures_produced
from tests.harness import netns as harness

TARGETS_MS = {"meshctl iptc": 5.0, "meshctl legacy": 30.0, "meshctl nft": 30.0}


def sample(action: Callable[[netns.NetnsRef], object], runs: int) -> list[float]:
    """Milliseconds of ``action`` in ``runs`` fresh namespaces (after one warm-up)."""
    times = []
    for i in range(runs + 1):
        ns = harness.create("bench")
        try:
            ref = netns.resolve(ns.name)
            assert ref is not None
            start = time.perf_counter()
            action(ref)
            elapsed = (time.perf_counter() - start) * 1000
            if i:  # the first run pays one-time costs (module loads, extension .so loads)
                times.append(elapsed)
        finally:
            harness.destroy(ns)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="two runs: are figures produced?")
    args = parser.parse_args()
    if args.smoke:
        args.runs = 2
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark creates network namespaces")

    built = plan(resolve(CaptureSettings, env={}))
    text = render_apply(built.ruleset(Family.IPV4))
    libiptc.load()  # import cost is paid once per process, not per apply

    def meshctl(backend: str) -> Callable[[netns.NetnsRef], object]:
        return lambda ref: capture.apply(built, target=ref, backend=backend)

    def bare(binary: str) -> Callable[[netns.NetnsRef], object]:
        def run(ref: netns.NetnsRef) -> object:
            with netns.entered(ref):
                return subprocess.run([binary, "--noflush"], input=text, text=True, check=True)

        return run

    cases = {
        "meshctl iptc": meshctl("iptc"),
        "meshctl legacy": meshctl("legacy"),
        "bare iptables-legacy-restore": bare("iptables-legacy-restore"),
        "meshctl nft": meshctl("nft"),
        "bare iptables-nft-restore": bare("iptables-nft-restore"),
    }
    print(f"default rule set: {built.ruleset(Family.IPV4).count()} rules, {args.runs} runs each")
    header = f"{'apply into a fresh netns':<30} {'median ms':>10} {'p90 ms':>8} {'target ms':>10}"
    print(f"{header}  verdict")
    figures = {}
    for name, action in cases.items():
        times = sorted(sample(action, args.runs))
        median = figures[name] = statistics.median(times)
        p90 = times[max(0, int(len(times) * 0.9) - 1)]
        target = TARGETS_MS.get(name)
        verdict = "" if target is None else ("meets" if median <= target else "MISSES")
        shown = "" if target is None else f"{target:.0f}"
        print(f"{name:<30} {median:>10.2f} {p90:>8.2f} {shown:>10}  {verdict}")
    return figures_produced(figures) if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
