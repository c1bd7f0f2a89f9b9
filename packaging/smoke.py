"""Smoke test of the frozen binary: it starts, lists its plugins, runs one, and fails cleanly.

Usage: python packaging/smoke.py [dist/meshctl]. Exits non-zero with a one-line reason on failure.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path


def run(binary: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(binary), *args], capture_output=True, text=True, timeout=60, check=False
    )


def check(binary: Path) -> list[str]:
    """Every failed expectation, as one line each."""
    problems: list[str] = []
    helped = run(binary, "--help")
    if helped.returncode != 0 or "version" not in helped.stdout:
        problems.append(
            f"--help: exit {helped.returncode}, 'version' not listed: {helped.stderr!r}"
        )
    shown = run(binary, "version", "-o", "json")
    try:
        data = json.loads(shown.stdout)
    except ValueError:
        problems.append(f"version -o json: not JSON: {shown.stdout[:200]!r} {shown.stderr!r}")
    else:
        if data.get("frozen") is not True:
            problems.append(f"version -o json: frozen is {data.get('frozen')!r}, expected true")
        missing = [k for k, v in data.get("dependencies", {}).items() if not v]
        if missing:
            problems.append(f"version -o json: no version for {', '.join(missing)}")
    bad = run(binary, "no-such-command")
    if bad.returncode != 2 or not bad.stderr.startswith("Error: unknown command"):
        problems.append(f"unknown command: exit {bad.returncode}, stderr {bad.stderr!r}")
    if "Traceback" in bad.stderr:
        problems.append("unknown command printed a traceback")
    return problems


def main() -> int:
    binary = Path(sys.argv[1] if len(sys.argv) > 1 else "dist/meshctl")
    if not binary.is_file():
        print(f"smoke: {binary} does not exist; run bash packaging/build.sh", file=sys.stderr)
        return 1
    problems = check(binary)
    for line in problems:
        print(f"smoke: FAIL {line}", file=sys.stderr)
    if not problems:
        size = binary.stat().st_size / 2**20
        print(f"smoke: ok {binary} ({size:.1f} MiB)")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
