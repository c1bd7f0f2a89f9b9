"""The root command: lazy plugins, help, errors and exit codes, as a user runs it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from meshctl.cli import hoist_global_flags, main
from tests.harness.cli import run_meshctl as meshctl

PLUGIN_MODULE = "meshctl_plugins.version"


def test_help_lists_plugins_without_importing_them():
    code = textwrap.dedent(f"""
        import contextlib, io, sys
        from meshctl.cli import main
        out = io.StringIO()
        with contextlib.redirect_stdout(out):
            rc = main(["--help"])
        loaded = sorted(m for m in sys.modules if m.startswith("meshctl_plugins."))
        import re
        listed = re.search(r"^  version +Print meshctl's version", out.getvalue(), re.M)
        print(rc, "{PLUGIN_MODULE}" in sys.modules, loaded, listed is not None)
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split(None, 2)[:2] == ["0", "False"]
    assert result.stdout.strip().endswith("[] True")


def test_running_a_subcommand_imports_only_its_plugin():
    code = textwrap.dedent("""
        import contextlib, io, sys
        from meshctl.cli import main
        with contextlib.redirect_stdout(io.StringIO()):
            main(["version", "-o", "json"])
        print("meshctl_plugins.version.cli" in sys.modules, "kubernetes" in sys.modules)
    """)
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60
    )
    assert result.stdout.split() == ["True", "False"]


def test_version_json_is_valid_and_complete():
    result = meshctl("version", "-o", "json")
    assert result.returncode == 0, result.stderr
    data = json.loads(result.stdout)
    assert data["meshctl"] == "0.1.0"
    assert data["frozen"] is False
    assert data["python"].startswith("3.11")
    assert set(data["dependencies"]) >= {
        "typer",
        "kubernetes",
        "pyroute2",
        "python-iptables",
        "uvloop",
        "h2",
        "hpack",
        "cryptography",
    }
    assert all(data["dependencies"].values())


def test_version_yaml_and_table_render_the_same_facts():
    yaml_out = meshctl("version", "-o", "yaml")
    table = meshctl("version")
    assert "meshctl: 0.1.0" in yaml_out.stdout
    assert table.stdout.startswith("MESHCTL ")


@pytest.mark.parametrize(
    ("args", "code", "needle"),
    [
        (["nosuch"], 2, "Error: unknown command 'nosuch'"),
        (["verison"], 2, "did you mean 'version'?"),
        (["--nosuch"], 2, "Error: No such option: --nosuch"),
        (["version", "--bad"], 2, "Hint: run 'meshctl version --help' for usage"),
        (["version", "-o", "xml"], 2, "'xml' is not one of"),
        (["--log-level", "loud", "version"], 2, "'--log-level': 'loud' is not one of debug, info"),
        (
            ["version", "--server", "--kubeconfig", "/nonexistent/kubeconfig"],
            2,
            "Error: kubeconfig /nonexistent/kubeconfig is not a readable file",
        ),
    ],
)
def test_bad_input_is_one_error_line_without_traceback(args, code, needle):
    result = meshctl(*args)
    assert result.returncode == code
    assert needle in result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert lines[0].startswith("Error: ")
    assert all(line.startswith(("Error: ", "Hint: ")) for line in lines)


def test_unreadable_kubeconfig_names_the_file(tmp_path: Path):
    broken = tmp_path / "kubeconfig"
    broken.write_text("apiVersion: v1\nclusters: 7\n")
    result = meshctl("version", "--server", env={"KUBECONFIG": str(broken)})
    assert result.returncode in (1, 2)
    assert f"kubeconfig {broken}" in result.stderr
    assert "Traceback" not in result.stderr


def test_unreachable_api_server_is_a_runtime_error(tmp_path: Path):
    # Port 9 on loopback (discard) is closed here: the connection is refused at once.
    kubeconfig = tmp_path / "kubeconfig"
    kubeconfig.write_text(
        textwrap.dedent("""
        apiVersion: v1
        kind: Config
        clusters: [{name: c, cluster: {server: "https://127.0.0.1:9"}}]
        users: [{name: u, user: {token: t}}]
        contexts: [{name: x, context: {cluster: c, user: u}}]
        current-context: x
    """)
    )
    result = meshctl("--kubeconfig", str(kubeconfig), "version", "--server")
    assert result.returncode == 1
    assert "unreachable" in result.stderr
    assert "Traceback" not in result.stderr


def test_debug_shows_the_traceback():
    result = meshctl("--debug", "version", "--server", "--kubeconfig", "/nonexistent")
    assert result.returncode == 2
    assert "Traceback" in result.stderr


def test_no_arguments_prints_help_and_succeeds():
    result = meshctl()
    assert result.returncode == 0
    assert result.stdout.startswith("Usage: meshctl")


def test_global_flags_may_follow_the_subcommand():
    assert hoist_global_flags(["version", "--kubeconfig", "k", "-o", "json", "--debug"]) == [
        "--kubeconfig",
        "k",
        "--debug",
        "version",
        "-o",
        "json",
    ]
    assert hoist_global_flags(["version", "--context=x", "--", "--debug"]) == [
        "--context=x",
        "version",
        "--",
        "--debug",
    ]


def test_settings_file_supplies_global_defaults(tmp_path: Path, capsys):
    cfg = tmp_path / "config.yaml"
    cfg.write_text("log-format: yaml\n")
    assert main(["--config", str(cfg), "version"]) == 2
    assert "key 'log-format': invalid value 'yaml'" in capsys.readouterr().err


THIRD_PARTY_PYPROJECT = """
[build-system]
requires = ["setuptools"]
build-backend = "setuptools.build_meta"

[project]
name = "acme-meshctl-hello"
version = "1.2.3"
description = "Say hello through meshctl."

[project.entry-points."meshctl.plugins"]
hello = "acme_hello.cli:app"
broken = "acme_hello.missing:app"
rawcmd = "acme_hello.raw:main"

[tool.setuptools]
packages = ["acme_hello"]
"""

THIRD_PARTY_CLI = """
import typer

app = typer.Typer()


@app.command()
def hello(name: str = "mesh") -> None:
    \"\"\"Greet someone.\"\"\"
    typer.echo(f"hello, {name}")
"""


THIRD_PARTY_RAW = """
import json
import sys


def main(argv):
    print(json.dumps({"argv": argv, "typer": "typer" in sys.modules}))
    return 3
"""


@pytest.fixture(scope="module")
def third_party_site(tmp_path_factory) -> Path:
    """A real distribution with a meshctl plugin, pip-installed into its own target dir."""
    src = tmp_path_factory.mktemp("acme-src")
    (src / "pyproject.toml").write_text(THIRD_PARTY_PYPROJECT)
    (src / "acme_hello").mkdir()
    (src / "acme_hello" / "__init__.py").write_text("")
    (src / "acme_hello" / "cli.py").write_text(THIRD_PARTY_CLI)
    (src / "acme_hello" / "raw.py").write_text(THIRD_PARTY_RAW)
    target = tmp_path_factory.mktemp("acme-site")
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "install",
            "--quiet",
            "--no-deps",
            "--no-build-isolation",
            "--target",
            str(target),
            str(src),
        ],
        check=True,
        capture_output=True,
        timeout=300,
    )
    return target


def test_third_party_plugin_appears_in_help_and_runs(third_party_site: Path):
    env = {"PYTHONPATH": os.pathsep.join([str(third_party_site), os.environ.get("PYTHONPATH", "")])}
    help_out = meshctl("--help", env=env)
    assert help_out.returncode == 0
    assert "hello" in help_out.stdout
    assert "Say hello through meshctl." in help_out.stdout  # the distribution's Summary
    assert "version" in help_out.stdout
    run = meshctl("hello", "--name", "acme", env=env)
    assert run.returncode == 0, run.stderr
    assert run.stdout == "hello, acme\n"


def test_broken_third_party_plugin_fails_alone(third_party_site: Path):
    env = {"PYTHONPATH": str(third_party_site)}
    result = meshctl("broken", env=env)
    assert result.returncode == 1
    assert "plugin 'broken' (acme_hello.missing:app, from acme-meshctl-hello) failed to load" in (
        result.stderr
    )
    assert "Traceback" not in result.stderr
    assert meshctl("version", env=env).returncode == 0


def test_raw_plugin_runs_without_the_cli_framework(third_party_site: Path):
    env = {"PYTHONPATH": str(third_party_site)}
    result = subprocess.run(
        [sys.executable, "-m", "meshctl", "rawcmd", "a", "--b=c", "-x"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
        env={**os.environ, **env},
    )
    assert result.returncode == 3, result.stderr
    assert json.loads(result.stdout) == {"argv": ["a", "--b=c", "-x"], "typer": False}


def test_raw_plugin_after_global_flags_gets_its_arguments_untouched(third_party_site: Path):
    result = meshctl(
        "--log-level", "info", "rawcmd", "--help", "x", env={"PYTHONPATH": str(third_party_site)}
    )
    assert result.returncode == 3, result.stderr
    assert json.loads(result.stdout)["argv"] == ["--help", "x"]
