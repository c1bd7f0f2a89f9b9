"""What a benchmark's ``--smoke`` mode promises: it ran, and every figure it reports exists.

A smoke run uses tiny sizes and asserts nothing about speed: only that each named figure was
measured (a finite number). ``figures_produced`` prints the line the runner looks for
(``python -m tests.bench --smoke``), so a benchmark that no longer runs fails CI.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

MARKER = "smoke: figures produced:"


def figures_produced(figures: Mapping[str, float | None]) -> int:
    """Print the smoke line for ``figures`` (name -> value); 1 if any is missing or not finite."""
    missing = [name for name, value in figures.items() if value is None or not math.isfinite(value)]
    if not figures or missing:
        print(f"smoke: FAILED, no figure for: {', '.join(missing) or 'anything'}")
        return 1
    print(f"{MARKER} {len(figures)} ({', '.join(figures)})")
    return 0
