"""``meshctl completion SHELL`` in the real shells, and ``meshctl --version`` (issue #16: there
was neither). bash always; zsh and fish are installed by .ci/run (marker ``shells``)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from meshctl import __version__
from tests.harness.cli import run_meshctl as meshctl


def _shell_env() -> dict[str, str]:
    """The scripts call ``meshctl`` by name: this interpreter's console script first on PATH."""
    return {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}


def _complete_in(shell: list[str], probe: str, script: str) -> list[str]:
    done = subprocess.run(
        [*shell, probe],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env=_shell_env(),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.splitlines()


def test_bash_completes_commands_and_options_from_the_script():
    script = meshctl("completion", "bash")
    assert script.returncode == 0, script.stderr
    probe = textwrap.dedent("""
        source /dev/stdin
        for words in "meshctl vers" "meshctl iptables tr" "meshctl version -o "; do
            read -ra COMP_WORDS <<< "$words"
            [[ "$words" == *" " ]] && COMP_WORDS+=("")
            COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
            _meshctl_completion meshctl
            echo "${COMPREPLY[*]}"
        done
    """)
    lines = _complete_in(["bash", "-c"], probe, script.stdout)
    assert lines == ["version", "trace", "json yaml table name"]


@pytest.mark.shells
def test_fish_completes_from_its_script():
    script = meshctl("completion", "fish").stdout
    probe = 'source; complete -C "meshctl vers"; complete -C "meshctl version -o "'
    lines = _complete_in(["fish", "-c"], probe, script)
    assert lines[0].startswith("version\t")
    assert sorted(lines[1:]) == ["json", "name", "table", "yaml"]


@pytest.mark.shells
def test_zsh_completes_from_its_script():
    script = meshctl("completion", "zsh").stdout
    # compsys itself needs a terminal: stand-ins print what the script hands to _arguments.
    probe = textwrap.dedent("""
        compdef() { : }
        _arguments() { print -rl -- "$@" }
        source /dev/stdin
        words=(meshctl vers); CURRENT=2; _meshctl_completion
        words=(meshctl version -o ""); CURRENT=4; _meshctl_completion
    """)
    lines = _complete_in(["zsh", "-c"], probe, script)
    assert lines[0].startswith('*: :(("version":')
    assert lines[1] == '*: :(("json" "yaml" "table" "name"))'


def test_root_version_flag():
    result = meshctl("--version")
    assert (result.returncode, result.stdout) == (0, f"meshctl {__version__}\n")


@pytest.mark.parametrize(
    ("shell", "env"),
    [
        ("bash", {"COMP_WORDS": "meshctl inject webhook-c", "COMP_CWORD": "2"}),
        ("zsh", {"_TYPER_COMPLETE_ARGS": "meshctl inject webhook-c"}),
        (
            "powershell",
            {
                "_TYPER_COMPLETE_ARGS": "meshctl inject webhook-c",
                "_TYPER_COMPLETE_WORD_TO_COMPLETE": "webhook-c",
            },
        ),
    ],
)
def test_each_shells_request_is_answered_from_the_lazily_loaded_tree(shell, env):
    # What the scripts send: meshctl with no arguments and the completion variables set.
    result = meshctl(env={**env, "_MESHCTL_COMPLETE": f"complete_{shell}"})
    assert result.returncode == 0, result.stderr
    assert "webhook-config" in result.stdout
