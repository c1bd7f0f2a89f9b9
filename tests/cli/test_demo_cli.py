"""``meshctl demo``'s command surface: help of each (lazily loaded) command, usage errors."""

from __future__ import annotations

import pytest

from tests.harness.cli import run_meshctl as meshctl


@pytest.mark.parametrize("args", [(), ("down",), ("exec",)])
def test_help_of_every_demo_command(args):
    result = meshctl("demo", *args, "--help")
    assert result.returncode == 0, result.stderr
    assert "Usage: meshctl demo" in result.stdout


def test_exec_without_a_running_demo_is_a_usage_error(tmp_path):
    result = meshctl(
        "demo", "exec", "client", "--", "true", env={"MESHCTL_DEMO_STATE_DIR": str(tmp_path)}
    )
    assert result.returncode == 2
    assert result.stderr.startswith("Error: no demo is running")
    assert "Traceback" not in result.stderr


def test_an_unknown_mode_is_a_usage_error():
    result = meshctl("demo", "--mode", "bogus")
    assert result.returncode == 2
    assert "--mode" in result.stderr


def test_the_app_runner_refuses_unknown_roles():
    result = meshctl("demo-app", "nope")
    assert result.returncode == 2
    assert result.stderr == "Error: demo-app: give 'server' or 'client'\n"
