"""Network sysctls of the namespace the calling thread is in (``/proc/sys/net/...``).

Owns writing them and the one obstacle a container puts in the way: the kernel resolves
``/proc/sys/net`` for the *calling thread's* network namespace, so a thread inside a pod's netns
(``InPod.entered``) writes that pod's values; but a container runtime mounts ``/proc/sys``
read-only for every unprivileged container. A process with CAP_SYS_ADMIN then mounts a procfs
of its own (private directory, nosuid/nodev/noexec, in its own mount namespace) and writes
through that. Invariants: a sysctl the kernel does not have is reported (``False``), never
raised; the private procfs is mounted at most once and unmounted by ``close``.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import tempfile
from pathlib import Path

from meshctl.errors import NetError

log = logging.getLogger(__name__)

_PROC_SYS = Path("/proc/sys")
_MS_NOSUID, _MS_NODEV, _MS_NOEXEC = 0x2, 0x4, 0x8
_MNT_DETACH = 0x2


class NetSysctls:
    """Writes ``net.*`` sysctls of the calling thread's network namespace."""

    def __init__(self) -> None:
        self._root = _PROC_SYS
        self._mounted: Path | None = None

    def set(self, name: str, value: str) -> bool:
        """Write ``value`` to sysctl ``name`` (``net.ipv4.tcp_migrate_req``); False when this
        kernel has no such sysctl; ``NetError`` when it cannot be written."""
        if not name.startswith("net."):
            raise ValueError(f"not a network sysctl: {name}")
        relative = Path(*name.split("."))
        try:
            return _write(self._root / relative, value)
        except OSError as exc:
            if exc.errno != errno.EROFS or self._mounted is not None:
                raise _cannot(name, exc) from exc
        # /proc/sys is the container's read-only mount: a procfs of our own is writable.
        self._root = self._mount() / "sys"
        try:
            return _write(self._root / relative, value)
        except OSError as exc:
            raise _cannot(name, exc) from exc

    def close(self) -> None:
        if self._mounted is None:
            return
        libc = ctypes.CDLL(None, use_errno=True)
        libc.umount2(os.fsencode(self._mounted), _MNT_DETACH)
        with contextlib.suppress(OSError):
            self._mounted.rmdir()
        self._mounted, self._root = None, _PROC_SYS

    def _mount(self) -> Path:
        target = Path(tempfile.mkdtemp(prefix="meshctl-proc-"))
        libc = ctypes.CDLL(None, use_errno=True)
        flags = _MS_NOSUID | _MS_NODEV | _MS_NOEXEC
        if libc.mount(b"proc", os.fsencode(target), b"proc", flags, None) != 0:
            code = ctypes.get_errno()
            with contextlib.suppress(OSError):
                target.rmdir()
            raise NetError(
                f"/proc/sys is read-only and a procfs of our own cannot be mounted: "
                f"{os.strerror(code)}",
                hint="the node proxy needs CAP_SYS_ADMIN (and a seccomp/AppArmor profile that "
                "allows mount) to set sysctls in pod namespaces",
            )
        self._mounted = target
        log.info("/proc/sys is read-only here: pod sysctls are set through a procfs at %s", target)
        return target


def _write(path: Path, value: str) -> bool:
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CLOEXEC)
    except FileNotFoundError:
        return False
    try:
        os.write(fd, value.encode())
    finally:
        os.close(fd)
    return True


def _cannot(name: str, exc: OSError) -> NetError:
    return NetError(
        f"cannot set {name}: {exc.strerror or exc}",
        hint="the node proxy runs as root with CAP_SYS_ADMIN to set sysctls in pod namespaces",
    )
