"""Sampling profiles of the processes a benchmark measures, taken by py-spy (its own process,
``pip install py-spy``), so a missed target can say what dominates.

The output is py-spy's ``raw`` format (collapsed stacks: one line per stack, ``frame;frame;... N``),
which ``summary`` reads back into the functions with the most samples.
"""

from __future__ import annotations

import collections
import contextlib
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path


@contextlib.contextmanager
def profiled(pid: int, out: Path | None) -> Iterator[None]:
    """Record ``pid`` and its children into ``out`` while the block runs (nothing if None)."""
    if out is None:
        yield
        return
    spy = subprocess.Popen(
        ["py-spy", "record", "--pid", str(pid), "--subprocesses", "--format", "raw",
         "--rate", "250", "--output", str(out)],
        stdout=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        time.sleep(1.0)  # attached before the block starts
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)
        print(summary(out))


def summary(path: Path, top: int = 15) -> str:
    """The functions with the most samples in ``path``: on the stack (inclusive) and on top."""
    inclusive: collections.Counter[str] = collections.Counter()
    own: collections.Counter[str] = collections.Counter()
    total = 0
    for line in path.read_text().splitlines():
        stack, _, count = line.rpartition(" ")
        frames, samples = stack.split(";"), int(count)
        total += samples
        own[frames[-1]] += samples
        for frame in set(frames[1:]):
            inclusive[frame] += samples
    lines = [f"profile {path}: {total} samples"]
    lines += ["  on top:"] + [f"    {n:6d} {f}" for f, n in own.most_common(top)]
    lines += ["  on the stack:"] + [f"    {n:6d} {f}" for f, n in inclusive.most_common(top * 2)]
    return "\n".join(lines)
