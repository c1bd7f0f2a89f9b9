"""Package list for setuptools: ``plugins/`` installs under the import name ``meshctl_plugins``.

pyproject.toml cannot rename found packages, so the list is computed here; everything else about
the distribution lives in pyproject.toml. On another Python than the one meshctl supports, pip's
own refusal ("requires a different Python: 3.12.1 not in '<3.12,>=3.11'") comes after a
metadata build and says nothing about what to do; this file runs first and does.
"""

import sys

from setuptools import find_packages, setup

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

setup(
    packages=find_packages(include=["meshctl", "meshctl.*"])
    + [
        PLUGINS_PACKAGE + name[len(PLUGINS_DIR) :]
        for name in find_packages(include=[PLUGINS_DIR, PLUGINS_DIR + ".*"])
    ],
)
