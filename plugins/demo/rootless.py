"""Running the demo without root: re-exec inside a new user, network, mount and PID namespace.

Owns the way in, as rootless container tools do it: ``unshare`` with the user mapped to root
inside and its subordinate ids (``/etc/subuid``, ``/etc/subgid`` through ``newuidmap``) mapped
too, so the proxy's gid 1337 exists inside; then, inside, a private ``/run`` (tmpfs) where
``ip netns`` keeps its names and iptables its lock. Invariants: nothing outside the new
namespaces is touched; every refusal names what to fix (the sysctl, the package, the subuid
line) before anything starts; the demo is PID 1 of its PID namespace, so when it dies (even by
SIGKILL) the kernel ends every process it started and the namespaces go with them.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

from meshctl.errors import MeshctlError, UserError
from meshctl.process import self_command

INSIDE_ENV = "MESHCTL_DEMO_ROOTLESS"
_UNSHARE = (
    "--user",
    "--map-root-user",
    "--map-auto",  # the subordinate ids too: gid 1337 must exist for the proxies
    "--net",
    "--mount",
    "--pid",
    "--fork",
    "--kill-child",
    "--mount-proc",
)


def inside() -> bool:
    """Whether this process is the re-executed demo inside its namespaces."""
    return os.environ.get(INSIDE_ENV) == "1" and os.geteuid() == 0


def _sysctl(name: str) -> str | None:
    try:
        return Path("/proc/sys", *name.split(".")).read_text().strip()
    except OSError:
        return None


def _has_subordinate_ids(user: str, uid: int) -> bool:
    for table in ("/etc/subuid", "/etc/subgid"):
        try:
            lines = Path(table).read_text().splitlines()
        except OSError:
            return False
        if not any(line.split(":")[0] in (user, str(uid)) for line in lines if ":" in line):
            return False
    return True


def preflight() -> None:
    """Refuse, with what to fix, when this machine cannot give us the namespaces."""
    if _sysctl("kernel.unprivileged_userns_clone") == "0":
        raise MeshctlError(
            "user namespaces are disabled for unprivileged users "
            "(sysctl kernel.unprivileged_userns_clone=0)",
            hint="sudo sysctl kernel.unprivileged_userns_clone=1, or run the demo as root",
        )
    if _sysctl("user.max_user_namespaces") == "0":
        raise MeshctlError(
            "user namespaces are disabled (sysctl user.max_user_namespaces=0)",
            hint="sudo sysctl user.max_user_namespaces=15000, or run the demo as root",
        )
    missing = [tool for tool in ("unshare", "newuidmap", "newgidmap") if not shutil.which(tool)]
    if missing:
        raise MeshctlError(
            f"running without root needs {', '.join(missing)}",
            hint="apt-get install util-linux uidmap, or run the demo as root",
        )
    user = getpass.getuser()
    if not _has_subordinate_ids(user, os.getuid()):
        raise MeshctlError(
            f"user {user} has no subordinate ids in /etc/subuid and /etc/subgid",
            hint=f"sudo usermod --add-subuids 100000-165535 --add-subgids 100000-165535 {user}",
        )


def reexec(args: Sequence[str]) -> int:
    """Run ``meshctl demo ARGS`` inside the new namespaces and return its exit code."""
    argv = ["unshare", *_UNSHARE, "--", *self_command("demo", *args)]
    return subprocess.run(argv, env={**os.environ, INSIDE_ENV: "1"}, check=False).returncode


def become_init() -> None:
    """Inside, the demo is PID 1 of its PID namespace, where every orphan (a killed proxy's
    workers) lands and stays a zombie unless PID 1 reaps it. So PID 1 forks: the child returns
    and runs the demo; PID 1 only reaps, passes SIGTERM/SIGHUP on, and exits with the demo's
    code (Ctrl-C reaches the demo from the terminal itself: the same process group)."""
    if os.getpid() != 1:
        return
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    for sig in (signal.SIGTERM, signal.SIGHUP):
        signal.signal(sig, lambda signum, _frame: os.kill(child, signum))
    os._exit(reap_until(child))


def reap_until(child: int) -> int:
    """Reap every process that ends until ``child`` does; its exit code (128 + N for a
    signal, as a shell reports it)."""
    while True:
        try:
            pid, status = os.wait()
        except ChildProcessError:
            return 1  # no child left at all: the demo is gone without a status
        if pid == child:
            code = os.waitstatus_to_exitcode(status)
            return 128 - code if code < 0 else code


def private_run() -> None:
    """Inside: a tmpfs on /run, private to this mount namespace (netns names, xtables lock)."""
    for argv in (["mount", "--make-rprivate", "/"], ["mount", "-t", "tmpfs", "tmpfs", "/run"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise UserError(
                f"cannot prepare the demo's mount namespace: {done.stderr.strip()}",
                hint="run the demo as root",
            )
