"""Run benchmarks: ``python -m tests.bench --smoke [NAME ...]`` runs each one's smoke mode.

Each benchmark runs as its own process (``python -m tests.bench.<name> --smoke``) from the
repository root and passes when it exits 0 having printed ``smoke.MARKER``. Without ``--smoke``
the benchmarks run for real, one after another (figures take minutes; run them when the
machine is quiet).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

from tests.bench.smoke import MARKER

ROOT = Path(__file__).resolve().parents[2]
BENCHMARKS = (
    "bench_help", "bench_cli_help", "bench_inject", "bench_inject_stream", "bench_capture",
    "bench_hbone", "bench_hbone_core", "bench_hbone_relay", "bench_probe", "bench_cni",
)  # fmt: skip


def run(name: str, *, smoke: bool, timeout: float = 600) -> tuple[bool, str]:
    """Run one benchmark; (passed, its output). Smoke: exit 0 and the marker line printed."""
    argv = [sys.executable, "-m", f"tests.bench.{name}", *(["--smoke"] if smoke else [])]
    try:
        done = subprocess.run(
            argv, cwd=ROOT, capture_output=True, text=True, timeout=timeout, check=False
        )
    except subprocess.TimeoutExpired as exc:
        return False, f"{name}: no result after {timeout:.0f}s\n{exc.stdout or ''}"
    out = done.stdout + done.stderr
    passed = done.returncode == 0 and (not smoke or MARKER in done.stdout)
    return passed, out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: does each one run?")
    parser.add_argument("names", nargs="*", metavar="NAME", help=f"any of {', '.join(BENCHMARKS)}")
    args = parser.parse_args()
    unknown = sorted(set(args.names) - set(BENCHMARKS))
    if unknown:
        parser.error(f"unknown benchmark {unknown[0]!r}; pick from {', '.join(BENCHMARKS)}")
    failed = []
    for name in args.names or BENCHMARKS:
        start = time.monotonic()
        passed, out = run(name, smoke=args.smoke)
        print(out.rstrip())
        print(f"== {name}: {'ok' if passed else 'FAILED'} ({time.monotonic() - start:.1f}s)")
        if not passed:
            failed.append(name)
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
