"""``meshctl verify`` without a cluster that answers: the failed "can reach the cluster" check
in every format (exit 3), worded as ``version --server`` words it, never urllib3's classes."""

from __future__ import annotations

import json
import socket
from pathlib import Path

import pytest
import yaml

from tests.harness.cli import run_meshctl as meshctl

URLLIB3_WORDS = ("NewConnectionError", "ReadTimeoutError", "MaxRetryError", "urllib3")


def _kubeconfig(folder: Path, port: int) -> Path:
    path = folder / "kubeconfig"
    path.write_text(
        json.dumps(
            {
                "apiVersion": "v1",
                "kind": "Config",
                "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
                "users": [{"name": "u", "user": {"token": "x"}}],
                "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                "current-context": "c",
            }
        )
    )
    return path


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _version_error(kubeconfig: Path, *extra: str) -> str:
    done = meshctl("--kubeconfig", str(kubeconfig), *extra, "version", "--server")
    assert done.returncode == 1, done.stderr
    return done.stderr.splitlines()[0].removeprefix("Error: ")


@pytest.mark.parametrize("fmt", ["table", "json", "yaml", "name"])
def test_no_cluster_is_the_failed_reach_check_in_every_format(tmp_path, fmt):
    kubeconfig = _kubeconfig(tmp_path, _free_port())  # nothing listens there
    expected = _version_error(kubeconfig)
    assert expected.endswith("unreachable: connection refused")
    done = meshctl("--kubeconfig", str(kubeconfig), "verify", "-o", fmt)
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stderr == ""
    if fmt == "json":
        check = json.loads(done.stdout)["categories"][0]["checks"][0]
    elif fmt == "yaml":
        check = yaml.safe_load(done.stdout)["categories"][0]["checks"][0]
    elif fmt == "name":
        assert done.stdout == "kubernetes-api: can reach the cluster\n"
        return
    else:
        assert f"✘ can reach the cluster: {expected}\n" in done.stdout
        assert "Hint: is the cluster running" in done.stdout
        return
    assert check["description"] == "can reach the cluster"
    assert check["result"] == "error"
    assert check["message"] == expected


def test_a_server_that_never_answers_is_named_with_the_timeout_not_a_library_class(tmp_path):
    with socket.create_server(("127.0.0.1", 0)) as silent:  # accepts, never answers
        kubeconfig = _kubeconfig(tmp_path, silent.getsockname()[1])
        expected = _version_error(kubeconfig, "--request-timeout", "1s")
        done = meshctl("--kubeconfig", str(kubeconfig), "--request-timeout", "1s", "verify")
    assert expected.endswith("did not answer within 1s"), expected
    assert done.returncode == 3
    assert f"✘ can reach the cluster: {expected}" in done.stdout
    for word in URLLIB3_WORDS:
        assert word not in done.stdout + done.stderr


def test_a_missing_kubeconfig_is_the_failed_reach_check_too(tmp_path):
    done = meshctl("--kubeconfig", str(tmp_path / "none"), "verify", "-o", "json")
    assert done.returncode == 3
    check = json.loads(done.stdout)["categories"][0]["checks"][0]
    assert check["message"] == f"kubeconfig {tmp_path / 'none'} is not a readable file"


def test_every_request_says_why_it_got_no_answer_in_words(tmp_path):
    kubeconfig = _kubeconfig(tmp_path, _free_port())
    done = meshctl("--kubeconfig", str(kubeconfig), "install", "-y")
    assert done.returncode == 1, done.stderr
    assert "unreachable: connection refused" in done.stderr
    for word in URLLIB3_WORDS:
        assert word not in done.stderr
