"""Benchmark: `meshctl --help` start-up, unfrozen and frozen, beside `python -c pass`.

Run: python -m tests.bench.bench_help [--runs N] [--binary dist/meshctl] [--smoke]
Prints median and p90 wall time of each command measured in the same run, with the targets
(unfrozen <= 150 ms, frozen <= 400 ms). Not part of the test suite: figures, not a gate.
``--smoke``: two runs each, only checks that every figure was produced (CI).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.smoke import figures_produced

TARGETS_MS = {"unfrozen": 150.0, "frozen": 400.0}


def measure(argv: list[str], runs: int) -> list[float]:
    """Wall-clock milliseconds of ``runs`` runs of ``argv`` (after one warm-up run)."""
    subprocess.run(argv, capture_output=True, check=True)
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        times.append((time.perf_counter() - start) * 1000)
    return times


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--binary", default="dist/meshctl", help="the frozen binary")
    parser.add_argument("--smoke", action="store_true", help="two runs: are figures produced?")
    args = parser.parse_args()
    if args.smoke:
        args.runs = 2

    script = shutil.which("meshctl") or sys.exit("meshctl is not installed in this environment")
    commands: dict[str, list[str]] = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "unfrozen": [script, "--help"],
    }
    if Path(args.binary).is_file():
        commands["frozen"] = [str(Path(args.binary).resolve()), "--help"]
    else:
        print(f"(no frozen binary at {args.binary}: run bash packaging/build.sh)")

    print(f"{'command':<16} {'median ms':>10} {'p90 ms':>8} {'target ms':>10}  verdict")
    figures = {}
    for name, argv in commands.items():
        times = sorted(measure(argv, args.runs))
        median = figures[name] = statistics.median(times)
        p90 = times[max(0, int(len(times) * 0.9) - 1)]
        target = TARGETS_MS.get(name)
        verdict = "" if target is None else ("meets" if median <= target else "MISSES")
        shown = "" if target is None else f"{target:.0f}"
        print(f"{name:<16} {median:>10.1f} {p90:>8.1f} {shown:>10}  {verdict}")
    return figures_produced(figures) if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
