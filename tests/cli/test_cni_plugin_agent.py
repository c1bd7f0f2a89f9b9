"""The thin CNI plugin and its node agent: fail closed without the agent, ride out its restart.

The plugin is installed as the unfrozen installer writes it (the client as a ``python -IS``
script); the agent's endpoint runs in this process (``NodeAgent``) or is missing, stale, or a
stand-in that hangs up mid-request. No root needed: the pods are in excluded namespaces or
gone, so no netns is entered.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from meshctl_plugins.cni_plugin import client

from meshctl.core.k8s.cni import spec
from tests.harness.cni import PREV_RESULT, NodeAgent, exec_plugin, install_launcher, network_config

EXCLUDED = ("kube-system", "coredns")
SHORT_WAIT = {"MESHCTL_CNI_AGENT_WAIT": "0.6"}


@pytest.fixture
def run_dir(tmp_path: Path) -> Path:
    path = tmp_path / "run"
    path.mkdir()
    return path


@pytest.fixture
def plugin(tmp_path: Path, run_dir: Path) -> Path:
    return install_launcher(tmp_path / "bin", run_dir)


def add(plugin: Path, run_dir: Path, env: dict[str, str] | None = None, command: str = "ADD"):
    conf = network_config("1.0.0", run_dir=str(run_dir))
    return exec_plugin(plugin, command, conf, netns="/proc/self/ns/net", pod=EXCLUDED, env=env)


def test_add_without_the_agent_fails_closed_after_the_wait(plugin: Path, run_dir: Path):
    started = time.monotonic()
    run = add(plugin, run_dir, SHORT_WAIT)
    elapsed = time.monotonic() - started
    assert run.returncode == 1
    error = run.json
    assert error["code"] == spec.AGENT_UNAVAILABLE
    assert error["cniVersion"] == "1.0.0"
    assert "refusing to start it uncaptured (fail closed)" in error["msg"]
    assert f"{run_dir}/pluginevent.sock unreachable" in error["details"]
    assert run.stderr.startswith("Error: the node agent did not answer")
    assert 0.5 < elapsed < 5, "tried again for the wait, then gave up"
    log = (run_dir / "meshctl-cni.log").read_text().splitlines()
    assert json.loads(log[-1])["level"] == "error"
    assert "fail closed" in log[-1]


def test_a_stale_socket_with_nobody_listening_fails_closed_too(plugin: Path, run_dir: Path):
    # An agent killed without removing its socket: connect is refused.
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    stale.bind(str(run_dir / "pluginevent.sock"))
    stale.close()
    run = add(plugin, run_dir, SHORT_WAIT)
    assert (run.returncode, run.json["code"]) == (1, spec.AGENT_UNAVAILABLE)
    assert "Connection refused" in run.json["details"]


def test_check_without_the_agent_fails_and_status_says_not_available(plugin, run_dir):
    check = add(plugin, run_dir, SHORT_WAIT, command="CHECK")
    assert (check.returncode, check.json["code"]) == (1, spec.AGENT_UNAVAILABLE)
    conf = network_config("1.1.0", run_dir=str(run_dir))
    status = exec_plugin(plugin, "STATUS", conf, pod=None, env=SHORT_WAIT)
    assert (status.returncode, status.json["code"]) == (1, spec.NOT_AVAILABLE)
    assert "meshctl cni install" in status.json["details"]


def test_del_without_the_agent_succeeds_and_says_what_it_left(plugin: Path, run_dir: Path):
    for _ in range(2):  # the runtime may DEL twice
        run = add(plugin, run_dir, SHORT_WAIT, command="DEL")
        assert (run.returncode, run.stdout) == (0, ""), run.stderr
    last = json.loads((run_dir / "meshctl-cni.log").read_text().splitlines()[-1])
    assert last["level"] == "warning"
    assert last["msg"].startswith("DEL kube-system/coredns: node agent at ")


def test_no_run_dir_means_no_agent_was_ever_here_and_fails_at_once(tmp_path: Path):
    plugin = install_launcher(tmp_path / "bin", tmp_path / "never")
    started = time.monotonic()
    run = add(plugin, tmp_path / "never", {"MESHCTL_CNI_AGENT_WAIT": "30"})
    assert (run.returncode, run.json["code"]) == (1, spec.AGENT_UNAVAILABLE)
    assert time.monotonic() - started < 10, "no waiting for an agent that was never installed"


def test_an_add_during_an_agent_restart_waits_for_the_new_agent(plugin: Path, run_dir: Path):
    with NodeAgent(run_dir):
        assert add(plugin, run_dir).returncode == 0
    # The agent is gone (a restart); the runtime's ADD comes now, the new agent a moment later.
    conf = network_config("1.0.0", run_dir=str(run_dir))
    env = {
        "PATH": os.environ["PATH"],
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/proc/self/ns/net",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns",
        "MESHCTL_CNI_AGENT_WAIT": "20",
    }
    proc = subprocess.Popen(
        [str(plugin)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=env,
        text=True,
    )
    assert proc.stdin is not None
    assert proc.stdout is not None
    assert proc.stderr is not None
    proc.stdin.write(json.dumps(conf))
    proc.stdin.close()
    time.sleep(1.0)
    assert proc.poll() is None, "still waiting for an agent"
    with NodeAgent(run_dir):
        proc.wait(30)
        out, err = proc.stdout.read(), proc.stderr.read()
    assert proc.returncode == 0, out + err
    assert json.loads(out) == {**PREV_RESULT, "cniVersion": "1.0.0"}


class HangUpOnce(threading.Thread):
    """An agent that takes the first request and closes without answering (killed mid-way),
    then is replaced by a real one on the same socket."""

    def __init__(self, path: Path) -> None:
        super().__init__(daemon=True)
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(str(path))
        self.listener.listen(1)
        self.path = path

    def run(self) -> None:
        conn, _ = self.listener.accept()
        conn.recv(65536)
        conn.close()
        self.listener.close()
        self.path.unlink()


def test_a_request_the_agent_dropped_mid_way_is_sent_again(plugin: Path, run_dir: Path):
    dropper = HangUpOnce(run_dir / "pluginevent.sock")
    dropper.start()
    env = {"MESHCTL_CNI_AGENT_WAIT": "20"}
    result: list[object] = []
    thread = threading.Thread(target=lambda: result.append(add(plugin, run_dir, env)))
    thread.start()
    dropper.join(20)
    time.sleep(0.3)
    with NodeAgent(run_dir):
        thread.join(30)
    (run,) = result
    assert run.returncode == 0, run.stdout + run.stderr  # type: ignore[attr-defined]


def test_the_client_imports_only_builtins_on_the_hot_path(plugin: Path, run_dir: Path):
    # What the runtime's exec pays for: python -I -S and this script, nothing imported from
    # files but the client itself (json, re, socket and meshctl stay out).
    conf = network_config("1.0.0", run_dir=str(run_dir))
    with NodeAgent(run_dir):
        done = subprocess.run(
            [sys.executable, "-IS", "-X", "importtime", str(plugin)],
            input=json.dumps(conf),
            env={
                "CNI_COMMAND": "ADD",
                "CNI_CONTAINERID": "c1",
                "CNI_NETNS": "/proc/self/ns/net",
                "CNI_IFNAME": "eth0",
                "CNI_ARGS": "K8S_POD_NAMESPACE=kube-system;K8S_POD_NAME=coredns",
            },
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    imported = {
        line.rsplit("|", 1)[1].strip()
        for line in done.stderr.splitlines()
        if line.startswith("import time:") and "|" in line
    } - {"imported package"}
    assert {"json", "re", "socket", "meshctl", "logging", "pathlib"} & imported == set()
    assert imported <= {"_socket", "time", "__future__", "_io", "marshal", "posix", "encodings"} | {
        m for m in imported if m.startswith(("encodings", "_frozen", "zipimport", "_codecs"))
    } | {"codecs", "_signal", "_abc", "abc", "io", "_stat", "stat", "_collections_abc"} | {
        "genericpath",
        "posixpath",
        "os.path",
        "os",
        "_sitebuiltins",
        "errno",
        "_weakref",
    }, imported


def test_the_clients_constants_are_the_specs():
    assert client.SUPPORTED_VERSIONS == spec.SUPPORTED_VERSIONS
    assert client.DEFAULT_RUN_DIR == spec.DEFAULT_RUN_DIR
    assert client.SOCKET_NAME == spec.PLUGIN_EVENT_SOCKET_NAME
    assert client.LOG_NAME == spec.LOG_NAME
    codes = (client.DECODE_FAILURE, client.NOT_AVAILABLE, client.AGENT_UNAVAILABLE)
    assert codes == (spec.DECODE_FAILURE, spec.NOT_AVAILABLE, spec.AGENT_UNAVAILABLE)
    assert client.INTERNAL == spec.INTERNAL


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.text(),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(), inner, max_size=3),
    max_leaves=12,
)


@given(
    st.dictionaries(st.text(), json_values, max_size=5),
    st.none() | st.text() | json_values,
    st.booleans(),
)
def test_config_string_reads_a_top_level_string_as_json_would(body, run_dir, indent):
    if run_dir is not None:
        body = {**body, "run_dir": run_dir}
    else:
        body.pop("run_dir", None)
    text = json.dumps(body, indent=2 if indent else None, ensure_ascii=indent)
    wanted = body.get("run_dir")
    assert client.config_string(text.encode(), "run_dir") == (
        wanted if isinstance(wanted, str) else None
    )


def test_a_netns_the_agent_cannot_see_fails_closed_with_the_fix(tmp_path: Path):
    # The agent runs in its DaemonSet's pod and sees the runtime's netns files only through its
    # mount of components.cni.netnsDir: an injected pod's netns elsewhere cannot be entered.
    from meshctl_plugins.cni import cnirequest

    pod = {
        "kind": "Pod",
        "metadata": {
            "name": "cart-1",
            "namespace": "shop",
            "annotations": {"sidecar.istio.io/status": '{"containers":["istio-proxy"]}'},
        },
        "spec": {"containers": [{"name": "app"}, {"name": "istio-proxy"}]},
    }
    inventory = tmp_path / "inventory.json"
    inventory.write_text(json.dumps({"kind": "List", "items": [pod]}))
    conf = network_config(local_inventory=str(inventory), run_dir=str(tmp_path))
    env = {
        "CNI_COMMAND": "ADD",
        "CNI_CONTAINERID": "c1",
        "CNI_NETNS": "/run/containerd-state/netns/cni-1",
        "CNI_IFNAME": "eth0",
        "CNI_ARGS": "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=cart-1",
    }

    def never(fn: object) -> object:
        raise AssertionError("no kernel work for a netns that cannot be entered")

    context = cnirequest.Context(
        kernel=cnirequest.KernelRunner(never), agent=lambda *a: "", netns_dir="/var/run/netns"
    )
    answer = cnirequest.serve(env, json.dumps(conf).encode(), context)
    error = json.loads(answer.stdout)
    assert (answer.code, error["code"]) == (1, spec.INVALID_ENVIRONMENT)
    assert "is not visible to the node agent" in error["msg"]
    assert "fail closed" in error["msg"]
    assert "--set components.cni.netnsDir=/run/containerd-state/netns" in error["details"]
    # A pod that needs no capture starts: nothing has to be entered.
    plain = {**pod, "metadata": {"name": "plain", "namespace": "shop"}}
    inventory.write_text(json.dumps({"kind": "List", "items": [plain]}))
    env["CNI_ARGS"] = "K8S_POD_NAMESPACE=shop;K8S_POD_NAME=plain"
    assert cnirequest.serve(env, json.dumps(conf).encode(), context).code == 0
