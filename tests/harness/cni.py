"""Running meshctl's CNI plugin the way a container runtime does: exec, CNI_* env, JSON on stdin.

Owns: installing the plugin (the thin client) into a test bin dir, one exec of it, the node
agent's request endpoint it talks to (``NodeAgent``, on a thread of the test process), and
reading the MESH_ chains of a test namespace. Everything runs on temp dirs and test namespaces.
"""

from __future__ import annotations

import asyncio
import importlib
import json
import os
import subprocess
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any

PREV_RESULT: dict[str, Any] = {
    "cniVersion": "1.0.0",
    "interfaces": [{"name": "eth0", "sandbox": "/var/run/netns/x"}],
    "ips": [{"address": "10.244.9.5/24", "gateway": "10.244.9.1", "interface": 0}],
}


SEED_CONFLIST = (
    Path(__file__).resolve().parents[1] / "golden" / "cni" / "testdata" / "dbnet.conflist"
)


def fake_node(root: Path) -> Path:
    """A node's CNI files under ``root``: the seed ``dbnet`` conflist in ``net.d`` and a service
    account dir (``sa``) with a token and CA, as the installer's DaemonSet pod sees them."""
    (root / "net.d").mkdir()
    (root / "net.d" / "dbnet.conflist").write_bytes(SEED_CONFLIST.read_bytes())
    (root / "sa").mkdir()
    (root / "sa" / "token").write_text("token-1\n")
    (root / "sa" / "ca.crt").write_text("-----BEGIN CERTIFICATE-----\n")
    return root


def install_launcher(bin_dir: Path, run_dir: Path | None = None) -> Path:
    """The plugin as ``meshctl cni install --run-dir RUN_DIR`` installs it here (unfrozen: the
    thin client as a script); it finds its agent in ``run_dir`` when a config names none."""
    bin_dir.mkdir(parents=True, exist_ok=True)
    path = bin_dir / "meshctl-cni"
    # Imported by name: mypy checks the harness without the installed `meshctl_plugins` package.
    installer = importlib.import_module("meshctl_plugins.cni.installer")
    path.write_bytes(
        installer.plugin_binary(str(run_dir)) if run_dir else installer.plugin_binary()
    )
    path.chmod(0o755)
    return path


def network_config(version: str = "1.0.0", **keys: Any) -> dict[str, Any]:
    """Our entry as the runtime passes it: list name and version injected, prevResult added."""
    conf: dict[str, Any] = {"cniVersion": version, "name": "test-net", "type": "meshctl-cni"}
    conf["prevResult"] = {**PREV_RESULT, "cniVersion": version}
    conf.update(keys)
    return conf


@dataclass(frozen=True, slots=True)
class CniRun:
    returncode: int
    stdout: str
    stderr: str

    @property
    def json(self) -> dict[str, Any]:
        data: dict[str, Any] = json.loads(self.stdout)
        return data


def exec_plugin(
    binary: Path,
    command: str,
    stdin: dict[str, Any] | str,
    *,
    netns: str = "",
    pod: tuple[str, str] | None = ("default", "app"),
    container_id: str = "0123456789abcdef",
    ifname: str = "eth0",
    env: dict[str, str] | None = None,
    timeout: float = 60,
) -> CniRun:
    """One plugin run, in this process's network namespace, with exactly the CNI environment."""
    variables = {
        "PATH": os.environ.get("PATH", "/usr/sbin:/usr/bin:/sbin:/bin"),
        "CNI_COMMAND": command,
        "CNI_CONTAINERID": container_id,
        "CNI_NETNS": netns,
        "CNI_IFNAME": ifname,
        "CNI_PATH": str(binary.parent),
    }
    if pod is not None:
        variables["CNI_ARGS"] = (
            f"IgnoreUnknown=1;K8S_POD_NAMESPACE={pod[0]};K8S_POD_NAME={pod[1]};"
            "K8S_POD_INFRA_CONTAINER_ID=0123456789abcdef"
        )
    variables.update(env or {})
    proc = subprocess.run(
        [str(binary)],
        input=stdin if isinstance(stdin, str) else json.dumps(stdin),
        env={k: v for k, v in variables.items() if v != ""},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    return CniRun(proc.returncode, proc.stdout, proc.stderr)


def mesh_rules(netns_name: str) -> list[str]:
    """The MESH_ lines of a namespace's legacy and nft tables (empty: no capture installed)."""
    lines = []
    for tool in ("iptables-legacy-save", "iptables-nft-save"):
        proc = subprocess.run(
            ["ip", "netns", "exec", netns_name, tool],
            capture_output=True,
            text=True,
            check=False,
            timeout=30,
        )
        lines += [line for line in proc.stdout.splitlines() if "MESH_" in line]
    return lines


class NodeAgent:
    """The node agent's CNI request endpoint (``meshctl cni install`` serves the same), run on a
    thread of the test process: ``<run_dir>/pluginevent.sock`` answering the thin client."""

    def __init__(self, run_dir: Path, ambient: dict[str, Any] | None = None) -> None:
        """``ambient``: stand-ins for the ambient agent's ``/cmdadd``/``/cmddel`` handlers
        (async, event -> (status, text)); None: not in ambient mode."""
        self.run_dir = run_dir
        self.ambient = ambient
        self.socket = run_dir / "pluginevent.sock"
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()

    def start(self) -> NodeAgent:
        self._thread = threading.Thread(target=self._run, name="test-node-agent", daemon=True)
        self._thread.start()
        if not self._ready.wait(10):
            raise RuntimeError("the test node agent did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._stop is not None:
            self._loop.call_soon_threadsafe(self._stop.set)
        if self._thread is not None:
            self._thread.join(10)
        self._thread = None

    def _run(self) -> None:
        asyncio.run(self._serve())

    async def _serve(self) -> None:
        # Imported by name: mypy checks the harness without the installed plugins package.
        route = importlib.import_module("meshctl_plugins.cni.requestroute")
        server = importlib.import_module("meshctl_plugins.cni.pluginserver")
        self._loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        requests = route.CniRequests(str(self.run_dir), ambient=self.ambient, log_level="debug")
        requests.start()
        events = server.PluginServer(
            str(self.socket), {}, {"/cni": requests.handle}, raw_limit=route.MAX_REQUEST
        )
        await events.start()
        self._ready.set()
        try:
            await self._stop.wait()
        finally:
            await events.close()
            requests.close()

    def __enter__(self) -> NodeAgent:
        return self.start()

    def __exit__(self, *_exc: object) -> None:
        self.stop()
