"""``pip install .`` on another Python than meshctl's: one sentence saying what to do."""

from __future__ import annotations

import ast
import subprocess
import sys
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def _supported() -> tuple[int, int]:
    tree = ast.parse((ROOT / "setup.py").read_text())
    for node in tree.body:
        if isinstance(node, ast.Assign) and getattr(node.targets[0], "id", "") == "PYTHON":
            return ast.literal_eval(node.value)
    raise AssertionError("setup.py has no PYTHON")


def test_setup_py_and_requires_python_name_the_same_version():
    major, minor = _supported()
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["requires-python"] == f">={major}.{minor},<{major}.{minor + 1}"


def test_another_python_is_told_to_use_a_virtualenv_with_the_right_one():
    # setup.py as pip's build step runs it, on an interpreter that says it is 3.12.
    code = (
        "import sys; sys.version_info = (3, 12, 1, 'final', 0); sys.argv = ['setup.py', '--name'];"
        f"exec(compile(open({str(ROOT / 'setup.py')!r}).read(), 'setup.py', 'exec'))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
        check=False,
    )
    assert result.returncode == 1
    assert "meshctl needs Python 3.11" in result.stderr
    assert "python3.11 -m venv .venv" in result.stderr
