"""Collecting version facts about the running meshctl: pure lookups of installed metadata."""

from __future__ import annotations

import importlib.metadata
import platform
import sys
from collections.abc import Mapping
from typing import NotRequired, TypedDict

import meshctl

# The distributions whose versions matter when reading a bug report, by distribution name
# (typer vendors its click, so no separate click distribution is ours to report).
KEY_DEPENDENCIES = (
    "typer",
    "kubernetes",
    "pyroute2",
    "python-iptables",
    "uvloop",
    "h2",
    "hpack",
    "cryptography",
    "PyYAML",
)


class VersionInfo(TypedDict):
    """What ``meshctl version`` reports (its JSON/YAML keys)."""

    meshctl: str
    python: str
    implementation: str  # CPython, PyPy
    platform: str  # sys.platform/machine
    frozen: bool  # the PyInstaller binary
    dependencies: dict[str, str | None]  # distribution -> version (None: not installed)
    server: NotRequired[Mapping[str, str]]  # the API server's /version (--server)


def client_info() -> VersionInfo:
    """meshctl's version, the interpreter, the platform, frozen or not, and dependency versions."""
    return {
        "meshctl": meshctl.__version__,
        "python": platform.python_version(),
        "implementation": platform.python_implementation(),
        "platform": f"{sys.platform}/{platform.machine()}",
        "frozen": bool(getattr(sys, "frozen", False)),
        "dependencies": {name: _version_of(name) for name in KEY_DEPENDENCIES},
    }


def _version_of(distribution: str) -> str | None:
    try:
        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None
