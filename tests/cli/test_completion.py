"""``meshctl completion SHELL`` in the real shells, and ``meshctl --version`` (issue #16: there
was neither). bash always; zsh and fish are installed by .ci/run (marker ``shells``)."""

from __future__ import annotations

import json
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


# --- issue 24: nothing in the terminal for a mistyped word, values, speed ---------------------


def _bash_complete(script: str, lines: list[str], env: dict[str, str] | None = None):
    probe = textwrap.dedent("""
        source /dev/stdin
        for words in "$@"; do
            read -ra COMP_WORDS <<< "$words"
            [[ "$words" == *" " ]] && COMP_WORDS+=("")
            COMP_CWORD=$(( ${#COMP_WORDS[@]} - 1 ))
            _meshctl_completion meshctl
            echo "${COMPREPLY[*]}"
        done
    """)
    return subprocess.run(
        ["bash", "-c", probe, "probe", *lines],
        input=script,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**_shell_env(), **(env or {})},
    )


MISTYPED = ["meshctl xyz ", "meshctl ztunnel nope ", "meshctl version --nope ", "meshctl inj -"]


def test_bash_prints_nothing_for_a_mistyped_word(tmp_path):
    script = meshctl("completion", "bash").stdout
    done = _bash_complete(script, MISTYPED, {"XDG_CACHE_HOME": str(tmp_path)})
    assert done.returncode == 0
    assert done.stderr == ""  # nothing reaches the user's terminal
    assert done.stdout.splitlines() == [""] * len(MISTYPED)


@pytest.mark.shells
def test_zsh_and_fish_print_nothing_for_a_mistyped_word(tmp_path):
    env = {**_shell_env(), "XDG_CACHE_HOME": str(tmp_path)}
    zsh = meshctl("completion", "zsh").stdout
    probe = 'compdef() { : }\n_arguments() { print -rl -- "$@" }\n_files() { print FILES }\n'
    probe += "source /dev/stdin\nwords=(meshctl xyz ''); CURRENT=3; _meshctl_completion\n"
    done = subprocess.run(
        ["zsh", "-c", probe],
        input=zsh,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert (done.stdout, done.stderr) == ("FILES\n", "")  # no candidates: zsh completes files
    fish = meshctl("completion", "fish").stdout
    done = subprocess.run(
        ["fish", "-c", 'source; complete -C "meshctl xyz "; complete -C "meshctl vers"'],
        input=fish,
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        check=False,
    )
    assert done.stderr == ""
    assert "Error" not in done.stdout
    assert done.stdout.splitlines()[-1].startswith("version\t")


VALUES = {
    "meshctl ztunnel run --mode ": "sidecar dedicated node shared",
    "meshctl install --profile ": "default ambient minimal demo ambient-istiod",
    "meshctl version -o ": "json yaml table name",
    "meshctl --log-level ": "debug info warning error",
    "meshctl ztunnel run --log-level w": "warning",
    "meshctl demo --mode a": "ambient",
    "meshctl demo exec ": "client server legacy node",
    "meshctl inject --native-sidecar ": "true false",
    "meshctl version -o=y": "-o=yaml",
}


def test_option_values_get_their_candidates(tmp_path):
    script = meshctl("completion", "bash").stdout
    done = _bash_complete(script, list(VALUES), {"XDG_CACHE_HOME": str(tmp_path)})
    assert done.stderr == ""
    assert done.stdout.splitlines() == list(VALUES.values())


@pytest.mark.shells
def test_zsh_and_fish_complete_option_values():
    zsh = meshctl("completion", "zsh").stdout
    probe = 'compdef() { : }\n_arguments() { print -rl -- "$@" }\nsource /dev/stdin\n'
    probe += "words=(meshctl install --profile ''); CURRENT=4; _meshctl_completion\n"
    done = _complete_in(["zsh", "-c"], probe, zsh)
    assert done == ['*: :(("default" "ambient" "minimal" "demo" "ambient-istiod"))']
    fish = meshctl("completion", "fish").stdout
    lines = _complete_in(["fish", "-c"], 'source; complete -C "meshctl --log-level "', fish)
    assert sorted(lines) == ["debug", "error", "info", "warning"]


def test_a_tab_imports_neither_typer_nor_any_plugin_once_the_tree_is_cached(tmp_path):
    code = textwrap.dedent("""
        import io, json, os, sys
        from meshctl import entry
        os.environ.update({"_MESHCTL_COMPLETE": "complete_bash",
                           "COMP_WORDS": "meshctl ztunnel run --mode ", "COMP_CWORD": "4"})
        out, sys.stdout = sys.stdout, io.StringIO()
        code = entry.main()
        answer, sys.stdout = sys.stdout.getvalue(), out
        loaded = sorted(m for m in sys.modules if m.split(".")[0] in ("typer", "meshctl_plugins"))
        print(json.dumps({"code": code, "answer": answer, "loaded": loaded}))
    """)
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path)}
    runs = [
        json.loads(
            subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True
            ).stdout
        )
        for _ in range(2)
    ]
    assert runs[0]["answer"] == runs[1]["answer"] == "sidecar\ndedicated\nnode\nshared\n"
    assert runs[0]["loaded"]  # the first one built the tree from the real commands
    assert runs[1]["loaded"] == []  # then: the cache, no typer and no plugin
    assert (tmp_path / "meshctl" / "completion.json").is_file()


def test_the_cached_tree_is_rebuilt_when_a_file_of_its_packages_changes(tmp_path):
    from meshctl import completion

    package = tmp_path / "plugin_pkg"
    package.mkdir()
    source = package / "cli.py"
    source.write_text("A = 1\n")
    before = completion._stamp([str(package)])
    assert completion._stamp([str(package)]) == before  # stable while nothing changes
    source.write_text("A = 22\n")
    assert completion._stamp([str(package)]) != before
