"""Benchmark: start-up of `meshctl --help`, every group's `--help` and a shell's <TAB>, beside
`python -c pass`.

(bench_help.py measures the root help per frozen form; this one every command, against a
baseline meshctl, for the rule that no help gets slower than today.)

Run: python -m tests.bench.bench_cli_help [--runs N] [--binary dist/meshctl] [--baseline MESHCTL]
Prints median and p90 CPU time (user + system) of each command measured in the same run.
``--baseline`` names another meshctl (e.g. the console script of a venv built from main): each
command is then timed for both, interleaved run by run, so a busy machine slows both alike.
Targets: the root help <= 150 ms unfrozen, <= 400 ms frozen; a <TAB> (the shell's completion
request, answered from the cached command tree) <= 100 ms; every other command within 10% of the
baseline. ``--smoke`` (CI): two runs of three commands, asserting only that figures came out.
Not part of the test suite: figures, not a gate.
"""

from __future__ import annotations

import argparse
import math
import os
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.smoke import figures_produced

TARGETS_MS = {"--help": 150.0, "frozen --help": 400.0}

# The start-up paths users hit most: the root help and version, every group's help, the leaf
# helps that load a plugin's heaviest imports, and completion (run by the shell on every <TAB>).
COMMANDS: tuple[tuple[str, ...], ...] = (
    ("--help",),
    ("--version",),
    ("version",),
    ("iptables", "--help"),
    ("iptables", "render", "--help"),
    ("inject", "--help"),
    ("inject", "webhook", "--help"),
    ("ztunnel", "--help"),
    ("cni", "--help"),
    ("controlplane", "--help"),
    ("controlplane", "run", "--help"),
    ("completion", "bash"),
)
SMOKE_COMMANDS = COMMANDS[:1] + COMMANDS[2:4]

# What a shell asks on a <TAB> (bash's request; zsh and fish send the same words otherwise): the
# root's commands, a subcommand's options, and option values, nested plugins included.
TAB_REQUESTS: tuple[str, ...] = (
    "meshctl vers",
    "meshctl ztunnel run --mo",
    "meshctl ztunnel run --mode ",
    "meshctl install --profile ",
    "meshctl inject webhook-c",
    "meshctl xyz ",
)
TAB_TARGET_MS = 100.0


def tab_env(words: str) -> dict[str, str]:
    """The variables bash's completion function sets for ``words`` (the last one incomplete)."""
    count = len(words.split()) + (1 if words.endswith(" ") else 0)
    return {"_MESHCTL_COMPLETE": "complete_bash", "COMP_WORDS": words, "COMP_CWORD": str(count - 1)}


def once(argv: list[str], env: dict[str, str] | None = None) -> float | None:
    """CPU milliseconds (user + system) of one run of ``argv``, or None if it failed (a command
    this build lacks). CPU time, not wall time: on a machine shared with other jobs it is what
    start-up costs, while the wall time mostly measures the neighbours."""
    process = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env={**os.environ, **env} if env else None,
    )
    _, status, usage = os.wait4(process.pid, 0)
    process.returncode = os.waitstatus_to_exitcode(status)
    elapsed = (usage.ru_utime + usage.ru_stime) * 1000
    return elapsed if process.returncode == 0 else None


def measure(
    variants: dict[str, list[str]], runs: int, env: dict[str, str] | None = None
) -> dict[str, list[float]]:
    """``runs`` timings per variant, interleaved, after one warm-up run of each (for a <TAB>:
    the run that builds the cached tree)."""
    times: dict[str, list[float]] = {name: [] for name in variants}
    alive = {name for name, argv in variants.items() if once(argv, env) is not None}
    for _ in range(runs):
        for name in sorted(alive):
            elapsed = once(variants[name], env)
            if elapsed is None:
                alive.discard(name)
                times[name] = []
            else:
                times[name].append(elapsed)
    return times


def summary(times: list[float]) -> tuple[float, float]:
    ordered = sorted(times)
    return statistics.median(ordered), ordered[max(0, math.ceil(len(ordered) * 0.9) - 1)]


def row(label: str, words: tuple[str, ...], times: dict[str, list[float]]) -> str:
    """One printed line: this build's figures, the baseline's and the change, and a verdict."""
    median, p90 = summary(times["this"])
    line = f"{label:<30} {median:>10.1f} {p90:>8.1f}"
    target = TAB_TARGET_MS if label.startswith("<TAB>") else TARGETS_MS.get(" ".join(words))
    verdict = "" if target is None else ("meets" if median <= target else "MISSES")
    if "baseline" in times:
        if times["baseline"]:
            base, base_p90 = summary(times["baseline"])
            change = (median - base) / base * 100
            line += f" {base:>9.1f} {base_p90:>8.1f} {change:>+6.0f}%"
            if target is None:
                verdict = "within" if change <= 10 else "SLOWER"
                target = base * 1.1
        else:
            line += f" {'n/a':>9} {'':>8} {'':>7}"
    shown = "" if target is None else f"{target:.0f}"
    return f"{line} {shown:>7}  {verdict}"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--binary", default="dist/meshctl", help="the frozen binary")
    parser.add_argument("--baseline", help="another meshctl to time beside this one")
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    args = parser.parse_args()
    runs = 2 if args.smoke else args.runs
    commands = SMOKE_COMMANDS if args.smoke else COMMANDS

    script = shutil.which("meshctl") or sys.exit("meshctl is not installed in this environment")
    floor = measure({"python -c pass": [sys.executable, "-c", "pass"]}, runs)["python -c pass"]
    print(f"python -c pass: median {summary(floor)[0]:.1f} ms ({runs} runs)")
    header = f"{'command (CPU ms)':<30} {'median ms':>10} {'p90 ms':>8}"
    if args.baseline:
        header += f" {'baseline':>9} {'b. p90':>8} {'change':>7}"
    print(header + f" {'target':>7}  verdict")
    figures: dict[str, float | None] = {}
    for words in commands:
        variants = {"this": [script, *words]}
        if args.baseline:
            variants["baseline"] = [args.baseline, *words]
        times = measure(variants, runs)
        label = "meshctl " + " ".join(words)
        figures[label] = summary(times["this"])[0] if times["this"] else None
        if times["this"]:
            print(row(label, words, times))
        else:
            print(f"{label:<30} {'failed':>10}")
    for words in TAB_REQUESTS[:2] if args.smoke else TAB_REQUESTS:
        variants = {"this": [script]}
        if args.baseline:
            variants["baseline"] = [args.baseline]
        times = measure(variants, runs, tab_env(words))
        label = f"<TAB> {words!r}"
        figures[label] = summary(times["this"])[0] if times["this"] else None
        if times["this"]:
            print(row(label, (), times))
        else:
            print(f"{label:<30} {'failed':>10}")
    if Path(args.binary).is_file():
        frozen = measure({"this": [str(Path(args.binary).resolve()), "--help"]}, runs)
        figures["frozen --help"] = summary(frozen["this"])[0] if frozen["this"] else None
        if frozen["this"]:
            print(row("frozen --help", ("frozen", "--help"), frozen))
    else:
        print(f"(no frozen binary at {args.binary}: run bash packaging/build.sh)")
    return figures_produced(figures) if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
