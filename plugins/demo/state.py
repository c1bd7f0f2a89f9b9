"""The demo's state directory: what a run created, written down before it is created.

Owns the record (``state.json``: the run's id and pid, the node and pod namespaces, the network
config list and each pod's CNI result) and tearing down whatever a record names: the pods'
processes, CNI DEL for each pod, the node's processes (its agent and proxy outlive the pods, as
on a node), then the namespaces, then the directory's contents. Invariants: a name is
recorded before the thing exists, so a run killed at any point (SIGKILL included) leaves a record
a later run or ``meshctl demo down`` can undo; teardown is idempotent and keeps going past
errors; nothing outside the state directory and the recorded namespaces is ever touched.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import json
import os
import secrets
import shutil
import signal
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, TypedDict, cast

from meshctl.errors import NetError, UserError
from meshctl.net import netns

from .node import Runtime

if TYPE_CHECKING:
    from meshctl.core.k8s.cni.messages import Result
    from meshctl.core.k8s.cni.netconf import NetworkConfig

STATE_FILE = "state.json"


LOGS = "logs"  # kept by teardown: the hint of a failed run points there


def default_dir() -> Path:
    """``$MESHCTL_DEMO_STATE_DIR``, else /run/meshctl-demo as root, else the user's state dir
    (``$XDG_STATE_HOME`` or ``~/.local/state``; never under /run, which the rootless demo
    replaces with its own), else a private folder in /tmp."""
    if os.environ.get("MESHCTL_DEMO_STATE_DIR"):
        return Path(os.environ["MESHCTL_DEMO_STATE_DIR"])
    if os.geteuid() == 0:
        return Path("/run/meshctl-demo")
    home = Path(os.environ.get("XDG_STATE_HOME") or Path.home() / ".local" / "state")
    if home.is_dir() or (home.parent.is_dir() and os.access(home.parent, os.W_OK)):
        return home / "meshctl-demo"
    folder = Path(f"/tmp/meshctl-demo-{os.getuid()}")  # noqa: S108 -- checked as ours below
    folder.mkdir(mode=0o700, exist_ok=True)
    st = folder.lstat()
    if folder.is_symlink() or st.st_uid != os.getuid() or st.st_mode & 0o077:
        raise UserError(
            f"{folder} is not a private folder of this user",
            hint="remove it, or set MESHCTL_DEMO_STATE_DIR",
        )
    return folder


class Sandbox(TypedDict, total=False):
    """A pod's sandbox as the record keeps it (its result once ADD gave one)."""

    name: str
    namespace: str
    uid: str
    result: Result


_NO_NETWORK: NetworkConfig = {}


@dataclass(slots=True)
class Record:
    """What one run created; saved after every change."""

    folder: Path
    run_id: str = field(default_factory=lambda: secrets.token_hex(3))
    pid: int = field(default_factory=os.getpid)
    node: str = ""
    network: NetworkConfig = field(default_factory=_NO_NETWORK.copy)
    cni_dir: str = ""
    pods: dict[str, Sandbox] = field(default_factory=dict)  # by netns
    kept: bool = False  # left running by --keep: its command has ended, the mesh has not

    def netns_name(self, role: str) -> str:
        return f"md{self.run_id}-{role}"

    def save(self) -> None:
        self.folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        data = {
            "run_id": self.run_id,
            "pid": self.pid,
            "node": self.node,
            "network": self.network,
            "cni_dir": self.cni_dir,
            "pods": self.pods,
            "kept": self.kept,
        }
        tmp = self.folder / f"{STATE_FILE}.tmp"
        tmp.write_text(json.dumps(data, indent=1))
        tmp.replace(self.folder / STATE_FILE)

    @classmethod
    def load(cls, folder: Path) -> Record | None:
        try:
            data = json.loads((folder / STATE_FILE).read_text())
        except FileNotFoundError:
            return None
        except ValueError:
            data = {}  # a torn write: nothing to undo by name (names are md<id>-*, see sweep)
        return cls(
            folder=folder,
            run_id=str(data.get("run_id", "")),
            pid=int(data.get("pid", 0)),
            node=str(data.get("node", "")),
            network=cast("NetworkConfig", dict(data.get("network", {}))),
            cni_dir=str(data.get("cni_dir", "")),
            pods=dict(data.get("pods", {})),
            kept=bool(data.get("kept", False)),
        )


def still_up(record: Record) -> bool:
    """Whether a run left running with ``--keep`` is still there (its node namespace is)."""
    return record.kept and bool(record.node) and Path(f"{netns.RUN_DIR}/{record.node}").exists()


def alive(pid: int) -> bool:
    """Whether a demo run with this pid still runs (a reused pid of another program: no)."""
    if pid <= 0 or pid == os.getpid():
        return False
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False
    return b"demo" in cmdline and b"meshctl" in cmdline


def stop_processes(ref_paths: list[str], grace: float = 0.2) -> None:
    """SIGTERM everything in the namespaces at once, SIGKILL what is left after ``grace``
    seconds (a proxy's drain would take longer: the demo's traffic needs none)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [pid for path in ref_paths for pid in netns.pids_in(path)]
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, sig)
        end = time.monotonic() + grace
        while pids and time.monotonic() < end:
            pids = [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]
            time.sleep(0.02)
        if not pids:
            return


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except (OSError, IndexError):
        return True


def teardown(record: Record) -> list[str]:
    """Undo everything ``record`` names; returns the errors (empty: all gone)."""
    errors: list[str] = []
    # The pods' processes, then their sandboxes (CNI DEL while the node's agents still run, as
    # a kubelet does: the ambient node agent releases each pod), then the node's processes.
    stop_processes([f"{netns.RUN_DIR}/{name}" for name in record.pods])
    runtime = (
        Runtime(record.node, record.network, record.cni_dir)
        if record.node and record.network and Path(f"{netns.RUN_DIR}/{record.node}").exists()
        else None
    )

    def remove(name: str, pod: Sandbox) -> list[str]:
        if runtime is not None and Path(f"{netns.RUN_DIR}/{name}").exists():
            ids = {
                "name": pod.get("name"),
                "namespace": pod.get("namespace"),
                "uid": pod.get("uid"),
            }
            known = {k: str(v) for k, v in ids.items() if v}
            return runtime.delete(name, pod.get("result"), known if len(known) == 3 else None)
        try:
            netns.delete(name)
        except NetError as exc:
            return [exc.message]
        return []

    # In parallel: each DEL is a few plugin execs, and Ctrl-C must be done within 2 s.
    with concurrent.futures.ThreadPoolExecutor(max(1, len(record.pods))) as pool:
        for found in pool.map(lambda item: remove(*item), record.pods.items()):
            errors += found
    if record.node:
        stop_processes([f"{netns.RUN_DIR}/{record.node}"])
        try:
            netns.delete(record.node)
        except NetError as exc:
            errors.append(exc.message)
    if not errors:
        for child in record.folder.iterdir():
            if child.name == LOGS:
                continue
            if child.is_dir():
                shutil.rmtree(child, ignore_errors=True)
            else:
                child.unlink(missing_ok=True)
    return errors
