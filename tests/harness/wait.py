"""Waiting for a condition in tests: poll, and fail with what was awaited when it never holds."""

from __future__ import annotations

import time
from collections.abc import Callable

import pytest


def eventually(
    what: str, ok: Callable[[], bool], timeout: float = 5.0, interval: float = 0.05
) -> float:
    """Poll ``ok`` until it holds (returns the seconds it took); fail the test after ``timeout``."""
    started = time.monotonic()
    while not ok():
        if time.monotonic() - started > timeout:
            pytest.fail(f"not within {timeout}s: {what}")
        time.sleep(interval)
    return time.monotonic() - started
