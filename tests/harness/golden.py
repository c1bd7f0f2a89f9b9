"""Golden files: compare text with a checked-in file, or rewrite it with MESHCTL_REFRESH_GOLDEN=1.

Rules: a missing or different golden fails with a unified diff (so a stale golden can never
pass); refreshing writes the file and still fails nothing, and ``orphans`` finds golden files no
test produces any more.
"""

from __future__ import annotations

import difflib
import os
from collections.abc import Iterable
from pathlib import Path

import pytest

REFRESH_ENV = "MESHCTL_REFRESH_GOLDEN"


def refreshing() -> bool:
    return os.environ.get(REFRESH_ENV, "") == "1"


def assert_golden(path: Path, actual: str) -> None:
    """``actual`` must equal the content of ``path`` (or becomes it when refreshing)."""
    if refreshing():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(actual, encoding="utf-8")
        return
    if not path.exists():
        pytest.fail(f"golden file {path} is missing; create it with {REFRESH_ENV}=1")
    expected = path.read_text(encoding="utf-8")
    if expected != actual:
        diff = "".join(
            difflib.unified_diff(
                expected.splitlines(keepends=True),
                actual.splitlines(keepends=True),
                fromfile=f"{path} (golden)",
                tofile="actual",
            )
        )
        pytest.fail(
            f"output differs from {path.name}; if the change is intended, rerun with "
            f"{REFRESH_ENV}=1 and review the diff\n{diff}",
            pytrace=False,
        )


def orphans(directory: Path, expected_names: Iterable[str], suffix: str = ".golden") -> list[str]:
    """Golden files in ``directory`` that no current case produces."""
    wanted = set(expected_names)
    return sorted(p.name for p in directory.glob(f"*{suffix}") if p.name not in wanted)
