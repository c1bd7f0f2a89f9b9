"""The CNI plugin as the runtime execs it, served by the node agent: VERSION, pass-through, and
every kind of bad input.

These need no root: bad input is rejected before any namespace is entered (tests/netns/ repeats
the important ones with a real namespace and proves no rule was installed). The agent's request
endpoint runs in this process (``NodeAgent``); test_cni_plugin_agent.py covers its absence.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path

import pytest

from meshctl.core.k8s.cni import spec
from tests.harness.cli import run_meshctl
from tests.harness.cni import (
    PREV_RESULT,
    NodeAgent,
    exec_plugin,
    install_launcher,
    network_config,
)


@pytest.fixture(scope="module")
def agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[NodeAgent]:
    with NodeAgent(tmp_path_factory.mktemp("run")) as running:
        yield running


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory, agent: NodeAgent) -> Path:
    return install_launcher(tmp_path_factory.mktemp("bin"), agent.run_dir)


@pytest.fixture
def sandbox(tmp_path: Path) -> str:
    # Only its existence is checked before the pod is known to need capture.
    path = tmp_path / "netns"
    path.touch()
    return str(path)


@pytest.mark.parametrize("version", spec.SUPPORTED_VERSIONS)
def test_version_reports_every_supported_spec_version(plugin: Path, version: str):
    run = exec_plugin(plugin, "VERSION", {"cniVersion": version}, pod=None)
    assert run.returncode == 0, run.stderr
    assert run.json == {"cniVersion": version, "supportedVersions": list(spec.SUPPORTED_VERSIONS)}


@pytest.mark.parametrize("version", ["0.3.1", "0.4.0", "1.0.0", "1.1.0"])
def test_add_in_an_excluded_namespace_passes_prev_result_through(
    plugin: Path, agent: NodeAgent, sandbox: str, version: str
):
    conf = network_config(version, run_dir=str(agent.run_dir))
    pod = f"coredns-{version}"
    run = exec_plugin(plugin, "ADD", conf, netns=sandbox, pod=("kube-system", pod))
    assert run.returncode == 0, run.stderr
    assert run.json == {**PREV_RESULT, "cniVersion": version}
    log = (agent.run_dir / "meshctl-cni.log").read_text()
    assert f"kube-system/{pod}: namespace excluded" in log


def _bad(version: str = "1.0.0", **keys: object) -> dict[str, object]:
    return network_config(version, **keys)


@pytest.mark.parametrize(
    ("stdin", "env", "code", "needle"),
    [
        ("{not json", {}, spec.DECODE_FAILURE, "failed to decode the network config"),
        ('["a list"]', {}, spec.DECODE_FAILURE, "must be a JSON object"),
        (
            {"cniVersion": "1.0.0", "name": "n", "type": "meshctl-cni"},
            {},
            spec.INVALID_CONFIG,
            "missing prevResult",
        ),
        (_bad("0.2.0"), {}, spec.INCOMPATIBLE_VERSION, "incompatible CNI version '0.2.0'"),
        (_bad("9.9.9"), {}, spec.INCOMPATIBLE_VERSION, "incompatible CNI version '9.9.9'"),
        (_bad(), {"CNI_ARGS": ""}, spec.INVALID_ENVIRONMENT, "CNI_ARGS lacks K8S_POD_NAMESPACE"),
        (
            _bad(),
            {"CNI_ARGS": "IgnoreUnknown=1;K8S_POD_NAMESPACE=default"},
            spec.INVALID_ENVIRONMENT,
            "CNI_ARGS lacks K8S_POD_NAME",
        ),
        (_bad(), {"CNI_ARGS": "garbage"}, spec.INVALID_ENVIRONMENT, "'garbage' is not KEY=VALUE"),
        (_bad(), {"CNI_NETNS": ""}, spec.INVALID_ENVIRONMENT, "ADD needs CNI_NETNS"),
        (
            _bad(),
            {"CNI_NETNS": "/run/netns/mt-does-not-exist"},
            spec.INVALID_ENVIRONMENT,
            "CNI_NETNS: network namespace /run/netns/mt-does-not-exist does not exist",
        ),
        (_bad(exclude_namespaces="x"), {}, spec.INVALID_CONFIG, "exclude_namespaces must be"),
        (_bad(prevResult=[1]), {}, spec.INVALID_CONFIG, "prevResult must be an object"),
        (_bad(ambient_enabled="yes"), {}, spec.INVALID_CONFIG, "ambient_enabled must be true"),
        (_bad(agent_timeout=0), {}, spec.INVALID_CONFIG, "agent_timeout must be a positive"),
        (_bad(), {"CNI_COMMAND": "FROB"}, spec.INVALID_ENVIRONMENT, "unknown command 'FROB'"),
    ],
)
def test_bad_input_is_a_cni_error_with_the_spec_code(
    plugin: Path, sandbox: str, stdin: object, env: dict[str, str], code: int, needle: str
):
    run = exec_plugin(plugin, "ADD", stdin, netns=sandbox, env=env)  # type: ignore[arg-type]
    assert run.returncode == 1
    error = run.json
    assert error["code"] == code, error
    assert needle in error["msg"], error
    assert error["cniVersion"] in spec.SUPPORTED_VERSIONS
    assert "Traceback" not in run.stderr
    assert run.stdout.count("\n") == 1, "stdout holds the error JSON and nothing else"


def test_check_and_status_need_the_spec_versions_that_define_them(plugin: Path, sandbox: str):
    check = exec_plugin(plugin, "CHECK", network_config("0.3.1"), netns=sandbox)
    status = exec_plugin(plugin, "STATUS", network_config("1.0.0"), pod=None)
    assert (check.returncode, check.json["code"]) == (1, spec.INCOMPATIBLE_VERSION)
    assert (status.returncode, status.json["code"]) == (1, spec.INCOMPATIBLE_VERSION)


def test_status_without_the_plugin_kubeconfig_says_the_plugin_is_not_available(
    plugin: Path, agent: NodeAgent
):
    conf = network_config("1.1.0", run_dir=str(agent.run_dir))
    run = exec_plugin(plugin, "STATUS", conf, pod=None)
    assert run.returncode == 1
    assert run.json["code"] == spec.NOT_AVAILABLE
    assert "meshctl cni install" in run.json["details"]


def test_del_of_a_sandbox_whose_netns_is_gone_succeeds_silently(plugin: Path, agent: NodeAgent):
    conf = network_config(run_dir=str(agent.run_dir))
    for _ in range(2):
        run = exec_plugin(plugin, "DEL", conf, netns="/run/netns/mt-gone-already")
        assert (run.returncode, run.stdout) == (0, ""), run.stderr


def test_cni_command_in_a_users_shell_does_not_hijack_the_cli():
    result = run_meshctl("version", "-o", "json", env={"CNI_COMMAND": "ADD"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["meshctl"]


def test_runtime_style_invocation_without_arguments_runs_the_plugin():
    # VERSION is the client's own answer: no agent needed.
    result = run_meshctl(stdin='{"cniVersion": "0.4.0"}', env={"CNI_COMMAND": "VERSION"})
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["cniVersion"] == "0.4.0"


def test_hidden_plugin_command_has_help_free_listing():
    result = run_meshctl("--help")
    assert " cni " in result.stdout
    assert "cni-plugin" not in result.stdout


def test_cni_subcommands_load(tmp_path: Path):
    for args in (["cni", "--help"], ["cni", "install", "--help"], ["cni", "uninstall", "--help"]):
        result = run_meshctl(*args)
        assert result.returncode == 0, result.stderr
        assert "Usage:" in result.stdout


def test_the_cni_role_runs_the_function_its_entry_point_names():
    # The runtime's path imports the plugin by a fixed name (no entry-point lookup); the
    # registered entry point, which `meshctl cni-plugin` and discovery use, must name the same.
    import importlib.metadata

    from meshctl import entry

    (ep,) = importlib.metadata.entry_points(group="meshctl.plugins", name=entry.CNI_PLUGIN_COMMAND)
    assert ep.value == entry.CNI_PLUGIN_TARGET
    assert entry.cni_plugin() is ep.load()


def test_the_installed_distribution_has_a_meshctl_cni_executable_that_is_the_plugin():
    """README: "the binary as meshctl-cni": pip creates it beside meshctl (a console script)."""
    import importlib.metadata
    import os
    import subprocess
    import sys

    (script,) = importlib.metadata.entry_points(group="console_scripts", name="meshctl-cni")
    assert script.value == "meshctl.entry:run"
    executable = Path(sys.executable).parent / "meshctl-cni"
    assert os.access(executable, os.X_OK), f"no {executable}: reinstall (pip install -e .)"
    done = subprocess.run(
        [str(executable)],
        input=json.dumps({"cniVersion": "1.0.0", "name": "n", "type": "meshctl-cni"}),
        env={**os.environ, "CNI_COMMAND": "VERSION"},
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["supportedVersions"] == list(spec.SUPPORTED_VERSIONS)
