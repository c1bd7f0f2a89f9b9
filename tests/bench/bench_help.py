"""Benchmark: ``meshctl --help`` start-up per form of meshctl, beside ``python -c pass``.

Run: python -m tests.bench.bench_help [--runs N] [--binary dist/meshctl] [--tree dist/meshctl-tree]
     [--smoke]
Prints median and p90 wall time (and median CPU time) of each command measured in the same run:
the interpreter alone, the source tree's console script, the one-file binary (unpacks itself at
every start) and the one-dir tree (the image's form: unpacks nothing), with the targets
(unfrozen and the tree <= 150 ms; the one-file binary's bound is its unpacking, reported
beside). ``--smoke``: two runs, and only checks that every figure was produced (both frozen forms
must exist). Figures, not a gate.
"""

from __future__ import annotations

import argparse
import math
import os
import resource
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.smoke import figures_produced

TARGETS_MS = {"unfrozen": 150.0, "frozen one-dir tree": 150.0, "frozen one-file": 150.0}


def measure(argv: list[str], runs: int) -> list[float]:
    """Wall-clock milliseconds of ``runs`` runs of ``argv`` (after one warm-up run)."""
    return [wall for wall, _ in measure_with_cpu(argv, runs)]


def measure_with_cpu(argv: list[str], runs: int) -> list[tuple[float, float]]:
    """(wall, CPU) milliseconds of ``runs`` runs of ``argv`` (after one warm-up run). CPU is user +
    system time of the command and every child it waited for: on a shared machine it moves far
    less with the load than wall time does (waiting for a core is not counted)."""
    subprocess.run(argv, capture_output=True, check=True)
    out = []
    for _ in range(runs):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        start = time.perf_counter()
        subprocess.run(argv, capture_output=True, check=True)
        wall = (time.perf_counter() - start) * 1000
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime) * 1000
        out.append((wall, cpu))
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=30)
    default_binary = os.environ.get("MESHCTL_FROZEN_BINARY", "dist/meshctl")
    default_tree = os.environ.get("MESHCTL_FROZEN_TREE", "dist/meshctl-tree")
    parser.add_argument("--binary", default=default_binary, help="the one-file binary")
    parser.add_argument("--tree", default=default_tree, help="the one-dir tree")
    parser.add_argument("--smoke", action="store_true", help="two runs; only check figures appear")
    args = parser.parse_args()
    runs = 2 if args.smoke else args.runs

    script = shutil.which("meshctl") or sys.exit("meshctl is not installed in this environment")
    commands: dict[str, list[str]] = {
        "python -c pass": [sys.executable, "-c", "pass"],
        "unfrozen": [script, "--help"],
    }
    for name, path in (
        ("frozen one-file", Path(args.binary)),
        ("frozen one-dir tree", Path(args.tree) / "meshctl"),
    ):
        if path.is_file():
            commands[name] = [str(path.resolve()), "--help"]
        elif args.smoke and os.environ.get("CI") == "true":  # CI builds both before this runs
            print(f"bench_help: no {name} at {path}: run bash packaging/build.sh", file=sys.stderr)
            return 1
        else:
            print(f"(no {name} at {path}: run bash packaging/build.sh)")

    print(f"meshctl --help, {runs} runs each, {os.cpu_count()} cores")
    print(
        f"{'command':<20} {'median ms':>10} {'p90 ms':>8} {'CPU ms':>7} {'target ms':>10}  verdict"
    )
    figures = {}
    for name, argv in commands.items():
        samples = measure_with_cpu(argv, runs)
        times = sorted(wall for wall, _ in samples)
        cpu = statistics.median(c for _, c in samples)
        median = figures[name] = statistics.median(times)
        p90 = times[min(len(times) - 1, math.ceil(len(times) * 0.9) - 1)]  # nearest rank
        target = TARGETS_MS.get(name)
        verdict = "" if target is None else ("meets" if median <= target else "MISSES")
        target_text = "" if target is None else f"{target:.0f}"
        print(f"{name:<20} {median:>10.1f} {p90:>8.1f} {cpu:>7.1f} {target_text:>10}  {verdict}")
    return figures_produced(figures) if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
