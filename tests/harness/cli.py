"""Running meshctl as a user does: a fresh interpreter through the real process entry point."""

from __future__ import annotations

import os
import subprocess
import sys

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
