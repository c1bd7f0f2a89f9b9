"""Input a user controls, through every command that reads it: alias bombs and runaway nesting are
refused in milliseconds with ``Error: FILE:LINE: ...``, binary files are named as such, and the
internal errors of a50401d (RecursionError, UnicodeDecodeError, Circular reference) are gone."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from meshctl.cli import main
from meshctl.structured import DEPTH_CEILING
from tests.harness.measured import Measured, meshctl
from tests.hostile.corpus import alias_bomb

SELF_REFERENCE = "apiVersion: v1\nkind: ConfigMap\nmetadata: &m\n  name: x\n  self: *m\n"
NESTED_JSON = "[" * 100_000 + "]" * 100_000
BINARY = bytes(range(256)) * 8


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {
        "bomb.yaml": alias_bomb(),
        "self.yaml": SELF_REFERENCE.encode(),
        "nested.json": NESTED_JSON.encode(),
        "binary.bin": BINARY,
        "malformed.yaml": b"workloads:\n  - name: [x\n",
    }
    for name, data in out.items():
        (tmp_path / name).write_bytes(data)
    return {name: tmp_path / name for name in out}


def assert_clean_refusal(run: Measured, code: int, needle: str) -> None:
    assert run.returncode == code, run.describe()
    assert run.stdout == "", run.describe()
    first = run.stderr.splitlines()[0] if run.stderr else ""
    assert first.startswith("Error: "), run.describe()
    assert needle in first, run.describe()
    assert "Traceback" not in run.stderr, run.describe()
    assert "internal error" not in run.stderr, run.describe()
    assert run.cpu_seconds < 2, run.describe()  # its own work, whatever the machine's load
    assert run.seconds < 15, run.describe()


@pytest.mark.parametrize("fmt", ["yaml", "json", "name", "table"])
def test_inject_refuses_an_alias_bomb_fast_in_every_format(files, fmt: str):
    run = meshctl("inject", "-f", str(files["bomb.yaml"]), "-o", fmt, "--image", "i:1")
    assert_clean_refusal(run, 1, f"{files['bomb.yaml']}:6: the document holds more than")
    assert run.max_rss_mib < 200, run.describe()


@pytest.mark.parametrize("fmt", ["yaml", "json", "name", "table"])
def test_a_self_referencing_alias_is_an_error_in_every_format(files, fmt: str):
    run = meshctl("inject", "-f", str(files["self.yaml"]), "-o", fmt, "--image", "i:1")
    assert_clean_refusal(run, 1, f"{files['self.yaml']}:5: alias *m refers to a node")


def test_values_files_refuse_nesting_and_bombs(files):
    nested = meshctl("manifest", "generate", "-f", str(files["nested.json"]))
    assert_clean_refusal(nested, 2, f"{files['nested.json']}:1: nested deeper than 100 levels")
    bomb = meshctl("install", "--dry-run", "-f", str(files["bomb.yaml"]))
    assert_clean_refusal(bomb, 2, f"{files['bomb.yaml']}:6: the document holds more than")


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("binary.bin", "binary.bin:2: not UTF-8 text (byte 128"),
        ("nested.json", "nested.json:1: nested deeper than 100 levels"),
        ("bomb.yaml", "bomb.yaml:6: the document holds more than"),
        ("malformed.yaml", "invalid YAML at line 3, column 1: did not find expected ','"),
    ],
)
def test_the_settings_file_is_read_within_limits(files, name: str, needle: str):
    run = meshctl("--config", str(files[name]), "version", "-o", "json")
    assert_clean_refusal(run, 2, needle)


@pytest.mark.parametrize(
    ("name", "needle"),
    [
        ("binary.bin", "binary.bin:2: not UTF-8 text"),
        ("nested.json", "nested.json:1: nested deeper than 100 levels"),
        ("malformed.yaml", "malformed.yaml: invalid YAML at line 3, column 1: did not find"),
    ],
)
def test_ztunnel_local_config_is_read_within_limits(files, tmp_path: Path, name: str, needle):
    certs = tmp_path / "certs"
    minted = meshctl("ztunnel", "certs", "--out", str(certs), "--workload", "ns/pod/sa")
    assert minted.returncode == 0, minted.describe()
    run = meshctl(
        "ztunnel", "run", "--workload", "ns/pod/sa", "--cert-dir", str(certs),
        "--local-config", str(files[name]),
    )  # fmt: skip
    assert_clean_refusal(run, 2, needle)


def test_controlplane_ca_refuses_a_binary_token_file(files, tmp_path: Path):
    run = meshctl(
        "controlplane", "ca", "--tokens", str(files["binary.bin"]),
        "--ca-dir", str(tmp_path / "ca"), "--grpc-address", "127.0.0.1:0",
    )  # fmt: skip
    assert_clean_refusal(run, 2, "binary.bin:2: not UTF-8 text")


def test_controlplane_ca_refuses_a_token_file_csv_cannot_read(tmp_path: Path):
    tokens = tmp_path / "tokens.csv"
    tokens.write_text('t1,system:serviceaccount:a:b,u1\n"' + "a" * 200_000 + "\n")
    run = meshctl(
        "controlplane", "ca", "--tokens", str(tokens),
        "--ca-dir", str(tmp_path / "ca"), "--grpc-address", "127.0.0.1:0",
    )  # fmt: skip
    assert_clean_refusal(run, 2, "tokens.csv:2: field larger than field limit")


def test_a_limit_can_be_raised_by_env_up_to_its_ceiling(tmp_path: Path, capsys):
    deep = tmp_path / "deep.yaml"
    value = "[" * 240 + "x" + "]" * 240
    deep.write_text(f"apiVersion: v1\nkind: ConfigMap\nmetadata: {{name: d}}\ndata: {value}\n")
    assert main(["inject", "-f", str(deep)]) == 1
    assert "nested deeper than 100 levels" in capsys.readouterr().err
    os.environ["MESHCTL_MAX_INPUT_DEPTH"] = str(DEPTH_CEILING)
    try:
        for fmt in ("yaml", "json"):  # written out at the ceiling without running out of stack
            assert main(["inject", "-f", str(deep), "-o", fmt]) == 0
            assert capsys.readouterr().out.count("x") == 1
        os.environ["MESHCTL_MAX_INPUT_DEPTH"] = str(DEPTH_CEILING + 1)
        assert main(["inject", "-f", str(deep)]) == 2
        assert f"(1-{DEPTH_CEILING})" in capsys.readouterr().err
    finally:
        del os.environ["MESHCTL_MAX_INPUT_DEPTH"]


# --- messages that said something else -------------------------------------------------------


def refusal(capsys: pytest.CaptureFixture[str], tmp_path: Path, text: str, *extra: str) -> str:
    source = tmp_path / "in.yaml"
    source.write_text(text)
    code = main(["inject", "-f", str(source), *extra])
    out, err = capsys.readouterr()
    assert (code, out) == (1, ""), err
    return err


def test_a_document_without_kind_is_refused_as_kubectl_refuses_it(capsys, tmp_path: Path):
    err = refusal(capsys, tmp_path, "apiVersion: v1\nmetadata:\n  name: x\n")
    assert err.startswith(f"Error: {tmp_path / 'in.yaml'}:1: the object has no kind;")


def test_containers_that_are_not_a_list_say_so(capsys, tmp_path: Path):
    text = "apiVersion: v1\nkind: Pod\nmetadata:\n  name: p\nspec:\n  containers: notalist\n"
    err = refusal(capsys, tmp_path, text)
    assert "Pod p: spec.containers must be a list of containers, not a string" in err
    assert "has no containers" not in err


def test_an_empty_output_file_name_says_it_is_empty(capsys, tmp_path: Path):
    source = tmp_path / "in.yaml"
    source.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: c}\n")
    code = main(["inject", "-f", str(source), "-O", ""])
    err = capsys.readouterr().err
    assert code == 2
    assert "the path is empty" in err
    assert "is a directory" not in err
