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
import subprocess
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


def private_run() -> None:
    """Inside: a tmpfs on /run, private to this mount namespace (netns names, xtables lock)."""
    for argv in (["mount", "--make-rprivate", "/"], ["mount", "-t", "tmpfs", "tmpfs", "/run"]):
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
        if done.returncode != 0:
            raise UserError(
                f"cannot prepare the demo's mount namespace: {done.stderr.strip()}",
                hint="run the demo as root",
            )
