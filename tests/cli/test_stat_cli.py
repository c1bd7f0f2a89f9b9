"""``meshctl stat``, ``top`` and ``verify --proxy`` on what they are given: a kind or a flag
combination they cannot use is exit 2 before anything connects; a cluster that does not answer
is one ``Error:`` line and exit 1 (``verify --proxy``: its failed reach check, exit 3)."""

from __future__ import annotations

import socket

import pytest

from tests.cli.test_verify_cli import _kubeconfig
from tests.harness.cli import run_meshctl as meshctl


def _dead(tmp_path) -> list[str]:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = int(probe.getsockname()[1])
    return ["--kubeconfig", str(_kubeconfig(tmp_path, port))]


@pytest.mark.parametrize(
    ("args", "words"),
    [
        (("stat", "widgets"), "unknown kind 'widgets'"),
        (("stat", "-n", "a", "-A"), "-n and -A"),
        (("stat", "--window", "0s"), "--window"),
        (("top", "-n", "a", "-A"), "-n and -A"),
        (("verify", "--proxy", "--pre"), "--proxy checks every meshed pod"),
        (("verify", "--proxy", "--workload", "a/b"), "--proxy checks every meshed pod"),
        (("verify", "--proxy-namespace", "shop"), "--proxy-namespace goes with --proxy"),
    ],
)
def test_what_cannot_be_used_is_refused_with_exit_2_before_connecting(tmp_path, args, words):
    done = meshctl(*_dead(tmp_path), *args)
    assert done.returncode == 2, done.stdout + done.stderr
    assert words in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("args", [("stat", "pod"), ("stat", "-A"), ("top", "--once")])
def test_a_cluster_that_does_not_answer_is_one_error_line_and_exit_1(tmp_path, args):
    done = meshctl(*_dead(tmp_path), *args)
    assert done.returncode == 1, done.stdout + done.stderr
    lines = done.stderr.splitlines()
    assert lines[0].startswith("Error: ")
    assert "connection refused" in lines[0]
    assert lines[1].startswith("Hint: ")
    assert done.stdout == ""


def test_verify_proxy_without_a_cluster_is_the_failed_reach_check(tmp_path):
    done = meshctl(*_dead(tmp_path), "verify", "--proxy", "-o", "name")
    assert done.returncode == 3, done.stdout + done.stderr
    assert done.stdout == "kubernetes-api: can reach the cluster\n"
