"""Package list for setuptools: ``plugins/`` installs under the import name ``meshctl_plugins``.

pyproject.toml cannot rename found packages, so the list is computed here; everything else about
the distribution lives in pyproject.toml. On another Python than the one meshctl supports, pip's
own refusal ("requires a different Python: 3.12.1 not in '<3.12,>=3.11'") comes after a
metadata build and says nothing about what to do; this file runs first and does.
"""

import runpy
import sys
from pathlib import Path

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

PLUGINS_DIR = "plugins"
PLUGINS_PACKAGE = "meshctl_plugins"
PYTHON = (3, 11)  # the same as requires-python in pyproject.toml (a test keeps them equal)

if sys.version_info[:2] != PYTHON:
    wanted = ".".join(map(str, PYTHON))
    raise SystemExit(
        f"meshctl needs Python {wanted}; this is Python {sys.version.split()[0]} "
        f"({sys.executable}). Install it into a virtualenv made with Python {wanted}: "
        f"python{wanted} -m venv .venv && . .venv/bin/activate && pip install . "
        f"(or: pipx install --python python{wanted} .)"
    )


class BuildWithGatewayApi(build_py):
    """The Gateway API CRDs install ships are upstream's, fetched (pinned, checked) at build
    time into a git-ignored package-data directory, never kept in the repository."""

    def run(self) -> None:
        script = Path(__file__).resolve().parent / "packaging" / "gateway_api.py"
        fetch = runpy.run_path(str(script))
        if not fetch["current"]():
            fetch["fill"]()
        super().run()


setup(
    cmdclass={"build_py": BuildWithGatewayApi},
    packages=find_packages(include=["meshctl", "meshctl.*"])
    + [
        PLUGINS_PACKAGE + name[len(PLUGINS_DIR) :]
        for name in find_packages(include=[PLUGINS_DIR, PLUGINS_DIR + ".*"])
    ],
)
