"""Istio's own test data, from the pinned Istio Go module (fetched once per machine).

Owns the one pin and the one fetch: ``go mod download`` of ``ISTIO_MODULE`` into the Go module
cache (outside the repo), whose folder the reference tests read goldens from. Invariant: a
machine without the module (or the go command) skips those tests, except under ``CI=true``,
where a missing download fails the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

ISTIO_MODULE = "istio.io/istio@v0.0.0-20260827124520-eed52ebb66ad"


def istio_module_dir() -> Path:
    """The unpacked module's folder; skips (fails under ``CI=true``) when it cannot be had."""
    found = fetch_istio_module()
    if isinstance(found, Path):
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(f"Istio's reference test data is required in CI: {found}")
    pytest.skip(found)


def fetch_istio_module() -> Path | str:
    """The unpacked module's folder, or why it cannot be had (for test collection)."""
    why = None if shutil.which("go") else "the go command is not installed"
    if why is None:
        done = subprocess.run(
            ["go", "mod", "download", "-json", ISTIO_MODULE],
            capture_output=True,
            text=True,
            timeout=600,
            check=False,
            cwd="/",  # outside any module: only the named module is fetched
        )
        if done.returncode == 0:
            return Path(json.loads(done.stdout)["Dir"])
        why = f"go mod download {ISTIO_MODULE} failed: {(done.stdout + done.stderr)[-400:]}"
    return why
