"""The hostile-input tier: every item here carries the ``hostile`` marker (``-m hostile`` runs
the tier alone; the default ``python -m pytest`` runs it with the rest)."""

from __future__ import annotations

from pathlib import Path

import pytest

_HERE = Path(__file__).parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.hostile)
