"""The frozen build under test: the one-file binary and the one-dir tree ``bash packaging/build.sh``
writes, named by ``MESHCTL_FROZEN_BINARY`` and ``MESHCTL_FROZEN_TREE`` (``.ci/run`` sets both
after the build). Unset: the test skips and says why (a ``packaging``/``netns`` test: a failure
under ``CI=true``); set but wrong: the test fails.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

BINARY_ENV = "MESHCTL_FROZEN_BINARY"
TREE_ENV = "MESHCTL_FROZEN_TREE"
TREE_MANIFEST = "meshctl-tree.json"


def frozen_binary() -> Path:
    """The one-file binary."""
    value = os.environ.get(BINARY_ENV)
    if not value:
        pytest.skip(
            f"{BINARY_ENV} is not set: run 'bash packaging/build.sh' and point it at dist/meshctl"
        )
    path = Path(value).resolve()
    if not os.access(path, os.X_OK):
        pytest.fail(f"{BINARY_ENV}={value} is not an executable file")  # set but wrong: no skip
    return path


def frozen_tree() -> Path:
    """The one-dir tree (its directory: the executable ``meshctl`` and the manifest inside)."""
    value = os.environ.get(TREE_ENV)
    if not value:
        pytest.skip(
            f"{TREE_ENV} is not set: run 'bash packaging/build.sh' and point it at "
            "dist/meshctl-tree"
        )
    path = Path(value).resolve()
    if not (path / TREE_MANIFEST).is_file() or not os.access(path / "meshctl", os.X_OK):
        pytest.fail(f"{TREE_ENV}={value} is not a one-dir tree with {TREE_MANIFEST}")
    return path
