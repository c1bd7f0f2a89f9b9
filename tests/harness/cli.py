"""Running meshctl as a user does: a fresh interpreter through the real process entry point."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import sys
from pathlib import Path

import pytest

from meshctl.core.capture.settings import CaptureSettings

# `python -m meshctl` goes through meshctl/entry.py exactly like the console script.
MESHCTL = (sys.executable, "-m", "meshctl")


def run_meshctl(
    *args: str,
    stdin: str | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> subprocess.CompletedProcess[str]:
    """Run ``meshctl ARGS`` to completion; ``env`` is added to this process's environment."""
    return subprocess.run(
        [*MESHCTL, *args],
        input=stdin,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        check=False,
    )


def run_on_cluster(
    kubeconfig: Path, *args: str, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    """Run ``meshctl --kubeconfig KUBECONFIG ARGS`` as a user on that cluster would, with no
    other kubeconfig or settings file of this machine's environment in the way."""
    env = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "MESHCTL_CONFIG")}
    return subprocess.run(
        [*MESHCTL, "--kubeconfig", str(kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
        env=env,
    )


# Read by `meshctl iptables` besides the CaptureSettings fields' own env vars.
_IPTABLES_ENV = ("MESHCTL_CONFIG", "NETWORK_NAMESPACE", "MESHCTL_IPTABLES_BACKEND")


def isolate_capture_settings(monkeypatch: pytest.MonkeyPatch, home: Path) -> None:
    """Unset every env var `meshctl iptables` reads and point HOME at ``home`` (no settings file),
    so in-process runs see only the flags a test passes."""
    for f in dataclasses.fields(CaptureSettings):
        env = f.metadata["env"]
        for name in (env,) if isinstance(env, str) else env or ():
            monkeypatch.delenv(name, raising=False)
    for name in _IPTABLES_ENV:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("HOME", str(home))
