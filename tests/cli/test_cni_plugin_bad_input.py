"""Whatever reaches the CNI plugin, the runtime gets the spec's error JSON on stdout and no
traceback: nested or binary configs, no stdin at all, a terminal, an interrupt, our own bug
(code 199, as docs/cni.md promises), whether the thin client or the agent serving it meets it."""

from __future__ import annotations

import io
import json
import os
import pty
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshctl.core.k8s.cni import spec
from tests.harness.cni import NodeAgent, exec_plugin, install_launcher, network_config

CLIENT = "meshctl_plugins.cni_plugin.client"
SERVER = "meshctl_plugins.cni.cnirequest"


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeAgent]:
    with NodeAgent(tmp_path_factory.mktemp("run")) as running:
        yield running


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory, agent: NodeAgent) -> Path:
    return install_launcher(tmp_path_factory.mktemp("bin"), agent.run_dir)


def assert_error_json(stdout: str, stderr: str, code: int, needle: str) -> dict[str, object]:
    assert stdout.count("\n") == 1, f"stdout: {stdout!r}, stderr: {stderr}"
    error = json.loads(stdout)
    assert error["code"] == code, error
    assert needle in str(error["msg"]) + str(error.get("details", "")), error
    assert error["cniVersion"] in spec.SUPPORTED_VERSIONS
    assert "Traceback" not in stderr
    return error


@pytest.mark.parametrize(
    ("stdin", "code", "needle"),
    [
        ("[" * 100_000 + "]" * 100_000, spec.DECODE_FAILURE, "nested deeper than 100 levels"),
        ('{"cniVersion": "1.0.0", "a": ' + "[" * 500 + "]" * 500 + "}", spec.DECODE_FAILURE,
         "nested deeper"),
        ('{"cniVersion": "1.0.0", "x": "\udcff"}', spec.DECODE_FAILURE, "not UTF-8 text"),
        ("", spec.DECODE_FAILURE, "no network config on stdin (it is empty)"),
        ('{"cniVersion": 1}', spec.INVALID_CONFIG, "cniVersion must be a string"),
        ('{"cniVersion": ["1.0.0"]}', spec.INVALID_CONFIG, "not an array"),
    ],
    ids=["nested-100000", "nested-inside", "binary", "empty", "version-number", "version-list"],
)  # fmt: skip
def test_bad_config_is_the_spec_error_with_its_code(plugin: Path, stdin: str, code, needle):
    raw = stdin.encode("utf-8", "surrogateescape")
    proc = subprocess.run(
        [str(plugin)],
        input=raw,
        env={"PATH": os.environ["PATH"], "CNI_COMMAND": "ADD", "CNI_CONTAINERID": "c1",
             "CNI_NETNS": "/x", "CNI_IFNAME": "eth0"},
        capture_output=True,
        timeout=60,
        check=False,
    )  # fmt: skip
    assert proc.returncode == 1
    error = assert_error_json(proc.stdout.decode(), proc.stderr.decode(), code, needle)
    if needle == "cniVersion must be a string":
        assert error["msg"] == 'cniVersion must be a string such as "1.1.0", not a number 1'


def meshctl_cni(stdin: int) -> subprocess.CompletedProcess[bytes]:
    """``CNI_COMMAND=ADD meshctl`` with no arguments, stdin as given."""
    return subprocess.run(
        [sys.executable, "-m", "meshctl"],
        stdin=stdin,
        env={**os.environ, "CNI_COMMAND": "ADD"},
        capture_output=True,
        timeout=60,
        check=False,
    )


def test_without_arguments_and_with_stdin_closed_it_answers_at_once():
    proc = subprocess.run(
        ["/bin/sh", "-c", 'exec "$0" -m meshctl <&-', sys.executable],
        env={**os.environ, "CNI_COMMAND": "ADD"},
        capture_output=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 1
    assert_error_json(proc.stdout.decode(), proc.stderr.decode(), spec.DECODE_FAILURE, "closed")


def test_without_arguments_on_a_terminal_it_does_not_wait_for_input():
    controller, terminal = pty.openpty()
    try:
        proc = meshctl_cni(terminal)
    finally:
        os.close(controller)
        os.close(terminal)
    assert proc.returncode == 1
    error = assert_error_json(
        proc.stdout.decode(), proc.stderr.decode(), spec.DECODE_FAILURE, "stdin is a terminal"
    )
    assert "CNI_COMMAND=VERSION" in str(error["details"])


def _context() -> object:
    import importlib

    server = importlib.import_module(SERVER)

    def agent(route: str, event: object, timeout: float) -> str:
        raise server.AgentUnavailableError("no ambient agent in this test")

    return server.Context(kernel=server.KernelRunner(lambda fn: fn()), agent=agent)


def test_our_own_bug_in_the_agent_is_code_199_with_the_exception(monkeypatch):
    import importlib

    server = importlib.import_module(SERVER)

    def broken(request: object, context: object) -> str:
        raise KeyError("a bug")

    monkeypatch.setattr(server, "_handle", broken)
    answer = server.serve(_add_env(), _add_config(), _context())
    assert answer.code == 1
    error = assert_error_json(
        answer.stdout + "\n", "", spec.INTERNAL, "unexpected KeyError: 'a bug'"
    )
    assert error["cniVersion"] == "1.0.0"


def test_a_bug_before_the_config_is_read_is_code_199_too(monkeypatch, capsys):
    import importlib

    client = importlib.import_module(CLIENT)

    def broken(stdin: bytes, key: str) -> object:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(client, "config_string", broken)
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(_add_config())))
    for name, value in _add_env().items():
        monkeypatch.setenv(name, value)
    assert client.main() == 1
    out, err = capsys.readouterr()
    assert_error_json(out, err, spec.INTERNAL, "unexpected RecursionError")


def test_an_interrupt_still_answers_in_the_spec_format(monkeypatch, capsys):
    import importlib

    client = importlib.import_module(CLIENT)

    def interrupted(*args: object) -> object:
        raise KeyboardInterrupt

    monkeypatch.setattr(client, "_serve", interrupted)
    assert client.main() == 1
    out, err = capsys.readouterr()
    assert_error_json(out, err, spec.TRY_AGAIN_LATER, "interrupted")


def test_version_on_a_terminal_needs_no_config():
    controller, terminal = pty.openpty()
    try:
        proc = subprocess.run(
            [sys.executable, "-m", "meshctl"],
            stdin=terminal,
            env={**os.environ, "CNI_COMMAND": "VERSION"},
            capture_output=True,
            timeout=60,
            check=False,
        )
    finally:
        os.close(controller)
        os.close(terminal)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["supportedVersions"] == list(spec.SUPPORTED_VERSIONS)


def test_a_good_request_still_works_after_the_bad_ones(
    plugin: Path, agent: NodeAgent, tmp_path: Path
):
    conf = network_config("1.0.0", run_dir=str(agent.run_dir))
    run = exec_plugin(plugin, "ADD", conf, netns=str(tmp_path), pod=("kube-system", "dns"))
    assert run.returncode == 0, run.stderr


def _add_config() -> bytes:
    return json.dumps(network_config("1.0.0", run_dir="/nonexistent")).encode()


def _add_env() -> dict[str, str]:
    return {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/proc/self/ns/net",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "K8S_POD_NAMESPACE=default;K8S_POD_NAME=app",
    }
