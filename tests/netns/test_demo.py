"""``meshctl demo``: the whole scenario as a user runs it, from the CLI, with its cleanup.

Each test runs the real command (the scenario's own assertions decide its exit code) with a state
directory of its own, and checks afterwards that no namespace of the demo is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import pty
import secrets
import shutil
import signal
import struct
import subprocess
import sys
import termios
import threading
import time
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.netns

STEPS = (
    "pods",
    "identities",
    "client -> server",
    "mTLS on the wire",
    "L4 policy",
    "proxy restart",
    "unmeshed pod",
)


def _env(state: Path) -> dict[str, str]:
    return {**os.environ, "MESHCTL_DEMO_STATE_DIR": str(state)}


def _demo(state: Path, *args: str) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "meshctl", "demo", *args],
        env=_env(state),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def _run_demo(
    state: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 180
) -> subprocess.CompletedProcess[str]:
    """``meshctl demo ARGS`` to completion, with the test's state dir."""
    return subprocess.run(
        [sys.executable, "-m", "meshctl", "demo", *args],
        env={**_env(state), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def _netns_of(state: Path) -> list[str]:
    record = json.loads((state / "state.json").read_text())
    return [record["node"], *record["pods"]]


def _existing(names: list[str]) -> list[str]:
    return [n for n in names if Path(f"/run/netns/{n}").exists()]


def _wait_line(proc: subprocess.Popen[str], text: str, timeout: float = 120) -> list[str]:
    lines: list[str] = []
    end = time.monotonic() + timeout
    assert proc.stdout is not None
    while time.monotonic() < end:
        line = proc.stdout.readline()
        if not line:
            break
        lines.append(line)
        if text in line:
            return lines
    proc.kill()
    raise AssertionError(f"no line with {text!r}: {''.join(lines)}")


def test_a_killed_run_is_cleaned_up_by_the_next_whose_check_passes_on_a_pipe(tmp_path):
    state = tmp_path / "state"
    first = _demo(state)
    _wait_line(first, "the mesh keeps running")
    names = _netns_of(state)
    first.send_signal(signal.SIGKILL)
    first.wait(10)
    assert _existing(names) == names  # SIGKILL: nothing could clean up

    done = _run_demo(state, "--check", timeout=180)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    assert "cleaned up what an earlier run left" in out
    assert _existing(names) == []
    for step in STEPS:
        assert f"PASS  {step}:" in out, out
    assert f"summary: {len(STEPS)}/{len(STEPS)} steps passed" in out
    assert "request marker absent" in out
    assert "\x1b[" not in out  # a pipe gets plain lines
    assert not (state / "state.json").exists()  # the passing run removed its own record
    # Ambient, the default: pods through the chain the node agent merged its plugin into,
    # enrolled by the agent from the local inventory, served by one node proxy.
    assert "via the CNI chain bridge + meshctl-cni (" in out
    assert "2/2 held by the one node proxy" in out
    assert "by impersonation; the node agent enrolled client, server" in out
    assert "legacy: not enrolled" in out
    assert "through the node proxy" in out
    assert "PASS  proxy restart: the node proxy killed (SIGKILL)" in out
    agent = (state / "logs" / "agent.log").read_text()
    assert "ADD prod/server: ambient: captured by the node agent" in agent
    assert "ADD legacy/legacy: no capture" in agent
    assert "pod prod/server" in agent
    assert "removed from the mesh: sandbox deleted" in agent
    assert "DEL prod/server: released by the node agent" in agent  # its rules removed there
    # On its way out the agent gave the node its network list back and removed its plugin.
    assert "removed" in agent.splitlines()[-1]
    assert "meshctl-cni" in agent.splitlines()[-1]


def test_on_a_terminal_the_live_view_shows_the_pods_and_ctrl_c_cleans_up_within_two_seconds(
    tmp_path,
):
    state = tmp_path / "state"
    master, slave = pty.openpty()
    fcntl.ioctl(slave, termios.TIOCSWINSZ, struct.pack("HHHH", 50, 160, 0, 0))
    proc = subprocess.Popen(
        [sys.executable, "-m", "meshctl", "demo"],
        env={**_env(state), "TERM": "xterm-256color"},
        stdin=slave,
        stdout=slave,
        stderr=slave,
    )
    os.close(slave)
    screen = bytearray()

    def drain():
        with contextlib.suppress(OSError):
            while chunk := os.read(master, 65536):
                screen.extend(chunk)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    try:
        end = time.monotonic() + 120
        while b"the mesh keeps running" not in screen and time.monotonic() < end:
            assert proc.poll() is None, screen.decode(errors="replace")[-3000:]
            time.sleep(0.2)
        text = screen.decode(errors="replace")
        assert "the mesh keeps running" in text, text[-3000:]
        assert "\x1b[" in text  # drawn by the live view, not plain lines
        cells = ("spiffe://cluster.local/ns/prod/sa/server", "ambient (enabled, ZDS acked)")
        for cell in (*cells, "unmeshed: not enrolled"):
            assert cell in text
        # An 80x24 terminal: the compact view, every step on it, identities whole.
        fcntl.ioctl(master, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 80, 0, 0))
        proc.send_signal(signal.SIGWINCH)
        mark = len(screen)
        time.sleep(1.5)  # a few redraws at 4 a second
        small = bytes(screen[mark:]).decode(errors="replace")
        for step in STEPS:
            assert step in small, small[-3000:]
        assert "ns/prod/sa/server" in small
        names = _netns_of(state)
        started = time.monotonic()
        proc.send_signal(signal.SIGINT)
        proc.wait(10)
        took = time.monotonic() - started
        time.sleep(0.2)
    finally:
        if proc.poll() is None:
            proc.kill()
        os.close(master)
    assert _existing(names) == []
    assert took <= 2.0, f"teardown took {took:.1f}s"
    assert proc.returncode == 130  # Ctrl-C, as a shell reports it
    text = screen.decode(errors="replace")
    assert f"removed the demo; its logs stay in {state / 'logs'}" in text


def _host_netns() -> set[str]:
    """The host's demo namespaces (md<run id>-*; other tests' come and go meanwhile)."""
    folder = Path("/run/netns")
    return (
        {p.name for p in folder.iterdir() if p.name.startswith("md")} if folder.is_dir() else set()
    )


def _frozen_binary() -> str:
    binary = os.environ.get("MESHCTL_FROZEN_BINARY")
    if not binary:
        pytest.skip("MESHCTL_FROZEN_BINARY is not set: run 'bash packaging/build.sh' first")
    if not os.access(binary, os.X_OK):
        pytest.fail(f"MESHCTL_FROZEN_BINARY={binary} is not an executable file")
    return binary


def test_sidecar_mode_passes_every_step_as_root(tmp_path):
    done = _run_demo(tmp_path / "state", "--check", "--mode", "sidecar", timeout=180)
    out = done.stdout
    assert done.returncode == 0, out + done.stderr
    for step in STEPS:
        assert f"PASS  {step}:" in out, out
    assert "through both proxies" in out
    assert "proxies ready (sidecar mode" in out
    assert "via the CNI chain bridge (" in out  # no meshctl-cni: capture by meshctl iptables


@pytest.mark.slow
def test_the_frozen_binary_passes_the_check_as_root(tmp_path):
    done = subprocess.run(
        [_frozen_binary(), "demo", "--check"],
        env=_env(tmp_path / "state"),
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"summary: {len(STEPS)}/{len(STEPS)} steps passed" in done.stdout


@pytest.mark.slow
def test_an_unprivileged_user_passes_the_check_in_its_own_namespaces(tmp_path):
    # The frozen binary: this interpreter lives where another user cannot run it.
    binary = _frozen_binary()
    user = f"mdemo{secrets.token_hex(3)}"
    before = _host_netns()
    # A regular account: useradd gives it subordinate ids (/etc/subuid, /etc/subgid).
    subprocess.run(["useradd", "-M", "-s", "/bin/sh", user], check=True, timeout=30)
    found = subprocess.run(["id", "-u", user], capture_output=True, text=True, check=True)
    uid = int(found.stdout)
    try:
        done, sidecar = (
            subprocess.run(
                [
                    "su",
                    user,
                    "-s",
                    "/bin/sh",
                    "-c",
                    f"cd /tmp && exec {binary} demo --check {mode}",
                ],
                capture_output=True,
                text=True,
                timeout=300,
                check=False,
            )
            for mode in ("", "--mode sidecar")
        )
    finally:
        subprocess.run(["userdel", user], check=False, timeout=30)
        # Without a home, its state (and logs) went to a private folder in /tmp.
        shutil.rmtree(f"/tmp/meshctl-demo-{uid}", ignore_errors=True)
    for run in (done, sidecar):
        assert run.returncode == 0, run.stdout + run.stderr
        assert f"summary: {len(STEPS)}/{len(STEPS)} steps passed" in run.stdout
    assert "through the node proxy" in done.stdout  # ambient, the default
    assert "through both proxies" in sidecar.stdout
    assert _host_netns() == before  # its namespaces were its own, never the host's


def test_keep_leaves_it_running_for_exec_until_down(tmp_path):
    state = tmp_path / "state"
    kept = _run_demo(state, "--keep", timeout=180)
    names = _netns_of(state)
    try:
        assert kept.returncode == 0, kept.stdout + kept.stderr
        assert "meshctl demo exec client -- curl" in kept.stdout
        assert _existing(names) == names
        record = json.loads((state / "state.json").read_text())
        server_ip = next(
            p["result"]["ips"][0]["address"].split("/")[0]
            for p in record["pods"].values()
            if p["name"] == "server"
        )
        # exec runs in the pod's namespace: its eth0 holds the pod's address, and a request
        # from there goes through the client's proxy to the server.
        shown = _run_demo(state, "exec", "server", "--", "ip", "-4", "addr", timeout=60)
        assert shown.returncode == 0, shown.stderr
        assert f"inet {server_ip}/" in shown.stdout
        code = (
            "import urllib.request as u;"
            f"print(u.urlopen('http://{server_ip}:8080/via-exec', timeout=5).read().decode())"
        )
        asked = _run_demo(state, "exec", "client", "--", sys.executable, "-c", code, timeout=60)
        assert asked.stdout == "hello from server: you asked /via-exec\n\n", asked.stderr
        # The node agent follows its inventory: labelling legacy's namespace enrolls the pod
        # running there (captured, handed to the node proxy), removing the label releases it.
        assert _legacy(state) == (False, False)
        _label_legacy(state, {"istio.io/dataplane-mode": "ambient"})
        _until(lambda: _legacy(state) == (True, True), "legacy enrolled")
        _label_legacy(state, {})
        _until(lambda: _legacy(state) == (False, False), "legacy released")
        # A second demo refuses while this one is up, as it does for one in the foreground.
        second = _run_demo(state, "--check", timeout=60)
        assert second.returncode == 2, second.stdout + second.stderr
        assert second.stderr.startswith("Error: a demo left running with --keep is up")
        assert "meshctl demo down" in second.stderr
        assert _existing(names) == names
        # A command that is not there: 127, as a shell and kubectl exec say.
        missing = _run_demo(state, "exec", "client", "--", "/no/such/command", timeout=60)
        assert missing.returncode == 127, missing.stderr
        assert missing.stderr.startswith("Error: cannot run '/no/such/command' in pod client")
        not_exec = _run_demo(state, "exec", "client", "--", str(state / "state.json"), timeout=60)
        assert not_exec.returncode == 126, not_exec.stderr
    finally:
        down = _run_demo(state, "down", timeout=60)
    assert down.returncode == 0, down.stderr
    assert _existing(names) == []
    again = _run_demo(state, "down", timeout=60)
    assert (again.returncode, again.stderr) == (0, "no demo to remove\n")


def _legacy(state: Path) -> tuple[bool, bool]:
    """(captured, served) of the legacy pod, from the node agent's /status inside the node."""
    code = (
        "import urllib.request as u;"
        "print(u.urlopen('http://127.0.0.1:8000/status', timeout=5).read().decode())"
    )
    shown = _run_demo(state, "exec", "node", "--", sys.executable, "-c", code, timeout=60)
    assert shown.returncode == 0, shown.stderr
    pod = next(p for p in json.loads(shown.stdout)["pods"] if p["name"] == "legacy")
    return bool(pod["captured"]), bool(pod["served"])


def _label_legacy(state: Path, labels: dict[str, str]) -> None:
    path = state / "inventory.yaml"
    doc = yaml.safe_load(path.read_text())
    for item in doc["items"]:
        if item["kind"] == "Namespace" and item["metadata"]["name"] == "legacy":
            item["metadata"]["labels"] = labels
    tmp = path.with_suffix(".edit")
    tmp.write_text(yaml.safe_dump(doc))
    tmp.replace(path)


def _until(check, what: str, timeout: float = 20) -> None:
    end = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < end, f"not {what} within {timeout:.0f}s"
        time.sleep(0.3)


def test_missing_cni_plugins_are_one_error_and_nothing_is_left(tmp_path):
    state = tmp_path / "state"
    done = _run_demo(state, env={"MESHCTL_DEMO_CNI_PATH": str(tmp_path / "no-plugins")}, timeout=60)
    assert done.returncode == 1
    assert done.stderr.startswith("Error: the CNI reference plugins (bridge, host-local, loopback)")
    assert "apt-get install containernetworking-plugins" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (state / "state.json").exists()


def test_a_state_dir_too_long_for_the_agents_sockets_is_one_error_before_anything(tmp_path):
    state = tmp_path / ("s" * 90)
    done = _run_demo(state, "--check", timeout=60)
    assert done.returncode == 2, done.stdout + done.stderr
    assert done.stderr.startswith(
        "Error: the state directory's path is too long for the node agent's unix sockets"
    )
    assert "MESHCTL_DEMO_STATE_DIR" in done.stderr
    assert "Traceback" not in done.stderr
    assert not (state / "state.json").exists()
    assert not (state / "cni").exists()


REAPER_PROBE = """
import os, subprocess, sys, time
from meshctl_plugins.demo.rootless import become_init
become_init()
assert os.getpid() != 1  # the demo's side of the fork
# An orphan, as a killed proxy's workers are: its parent exits at once, it ends 0.3 s later.
subprocess.run([sys.executable, "-c", "import os, time\\nif os.fork() == 0:\\n"
                "    time.sleep(0.3)\\n    os._exit(0)\\n"], check=True)
time.sleep(1.5)
def state(pid):
    return open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
print(sorted(int(p) for p in os.listdir("/proc") if p.isdigit() and state(p) == "Z"))
sys.exit(3)
"""


def test_the_rootless_demo_as_pid_1_reaps_orphans_and_keeps_its_exit_code():
    """Inside its PID namespace the rootless demo is PID 1: orphans land there, and must not
    stay zombies while it runs (issue 24)."""
    done = subprocess.run(
        ["unshare", "--pid", "--fork", "--mount-proc", sys.executable, "-c", REAPER_PROBE],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 3, done.stderr
    assert done.stdout == "[]\n", done.stdout + done.stderr


def test_check_into_a_pipe_closed_early_still_runs_to_its_verdict(tmp_path):
    """``meshctl demo --check | head -1``: the reader is gone after one line; the demo stops
    writing, finishes, tears down, and exits with its verdict (not 1, not a traceback)."""
    state = tmp_path / "state"
    script = f'{sys.executable} -m meshctl demo --check | head -1; echo "exit ${{PIPESTATUS[0]}}"'
    done = subprocess.run(
        ["bash", "-c", script],
        env=_env(state),
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    lines = done.stdout.splitlines()
    assert len(lines) == 2, done.stdout + done.stderr
    assert lines[1] == "exit 0", done.stdout + done.stderr
    assert "Traceback" not in done.stderr
    assert done.stderr == ""
    assert not (state / "state.json").exists()  # torn down as on any run
