"""Istio's own test data, istioctl and CNI agent, from the pinned Istio Go module (fetched once).

Owns the one pin and the one fetch: ``go mod download`` of ``ISTIO_MODULE`` into the Go module
cache (outside the repo), whose folder the reference tests read goldens from; and where istioctl
and Istio's CNI agent built from it are cached (``tests/kube/build.sh --istioctl`` and
``--istio-cni`` build them, reading the pin here). Invariant: a machine without the module, the
go command or the build skips those tests, except under ``CI=true``, where a missing download or
build fails the run.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Callable
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


BUILD_SCRIPT = Path(__file__).resolve().parent.parent / "kube" / "build.sh"


def istioctl_path() -> Path:
    """Where ``tests/kube/build.sh --istioctl`` puts istioctl built from ``ISTIO_MODULE``."""
    configured = os.environ.get("MESHCTL_TEST_CACHE")
    root = Path(configured) if configured else Path.home() / ".cache" / "meshctl-test"
    return root / "istioctl" / ISTIO_MODULE.partition("@")[2] / "istioctl"


def istioctl_binary() -> Path:
    """istioctl of the pinned module, built once per machine (by build.sh, which CI runs first;
    here when missing). Skips when it cannot be had, except under ``CI=true``: fails."""
    return _required(build_istioctl(), "istioctl")


def build_istioctl() -> Path | str:
    """The cached istioctl (a stat when built), or why it cannot be built."""
    binary = istioctl_path()
    return _built("--istioctl", "istioctl", binary, lambda: os.access(binary, os.X_OK))


def _required(found: Path | str, what: str) -> Path:
    if isinstance(found, Path):
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(f"{what} is required in CI: {found}")
    pytest.skip(found)


def _built(flag: str, what: str, out: Path, ready: Callable[[], bool]) -> Path | str:
    """``out`` once ``ready()``, building it with ``build.sh FLAG`` first when it is not, or
    why it cannot be built."""
    if ready():
        return out
    if not shutil.which("go") and not os.access("/usr/local/go/bin/go", os.X_OK):
        return f"the go command is not installed ({what} is built from the Istio module)"
    done = subprocess.run(
        ["bash", str(BUILD_SCRIPT), flag],
        capture_output=True,
        text=True,
        timeout=3600,  # cold: every dependency is fetched and compiled
        check=False,
    )
    if done.returncode == 0 and ready():
        return out
    return f"bash {BUILD_SCRIPT} {flag} failed: {(done.stdout + done.stderr)[-400:]}"


ISTIO_CNI_BINARIES = ("install-cni", "istio-cni")


def istio_cni_dir() -> Path:
    """Where ``tests/kube/build.sh --istio-cni`` puts Istio's CNI agent and plugin."""
    configured = os.environ.get("MESHCTL_TEST_CACHE")
    root = Path(configured) if configured else Path.home() / ".cache" / "meshctl-test"
    return root / "istio-cni" / ISTIO_MODULE.partition("@")[2]


def istio_cni_binaries() -> Path:
    """The folder of ``install-cni`` and ``istio-cni`` of the pinned module, built once per
    machine (by build.sh, which CI runs first; here when missing). Skips when they cannot be
    had, except under ``CI=true``: fails."""
    return _required(build_istio_cni(), "Istio's CNI agent")


def build_istio_cni() -> Path | str:
    """The cached binaries' folder (a stat when built), or why they cannot be built."""
    folder = istio_cni_dir()

    def ready() -> bool:
        return all(os.access(folder / name, os.X_OK) for name in ISTIO_CNI_BINARIES)

    return _built("--istio-cni", "Istio's CNI agent", folder, ready)
