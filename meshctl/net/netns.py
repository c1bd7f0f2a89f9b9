"""Entering a network namespace by name (``/run/netns/NAME``) or path, for the calling thread only.

Invariants: ``entered`` switches the *calling thread* (``setns(2)`` is per thread) and always
switches back, even on error; sockets, netlink handles, libiptc handles and child processes made
inside belong to the target namespace. A name that does not exist is a user error (exit 2) and is
never created (pyroute2's ``setns`` would create a missing name; we pass it a descriptor).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from meshctl.errors import NetError, UserError

RUN_DIR = "/run/netns"
# The calling thread's own namespace; /proc/self would name the main thread's.
_THREAD_NETNS = "/proc/thread-self/ns/net"
_CLONE_NEWNET = 0x40000000


@dataclass(frozen=True, slots=True)
class NetnsRef:
    """A namespace as the user named it, and the file that holds it."""

    spec: str
    path: str


def resolve(spec: str | None, *, flag: str = "--netns") -> NetnsRef | None:
    """``None`` for "the current namespace"; a name or a path otherwise (which must exist)."""
    if not spec:
        return None
    path = spec if "/" in spec else f"{RUN_DIR}/{spec}"
    if not Path(path).exists():
        raise UserError(
            f"{flag}: network namespace {spec!r} not found ({path} does not exist)",
            hint="list named namespaces with 'ip netns list', or give a path like /proc/PID/ns/net",
        )
    return NetnsRef(spec, path)


@contextlib.contextmanager
def entered(ref: NetnsRef | None) -> Iterator[None]:
    """Run the block with the calling thread inside ``ref`` (no-op for ``None``)."""
    if ref is None:
        yield
        return
    own = os.open(_THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
    try:
        try:
            target = os.open(ref.path, os.O_RDONLY | os.O_CLOEXEC)
        except OSError as exc:
            raise NetError(
                f"cannot open network namespace {ref.spec!r} ({ref.path}): {exc.strerror}",
                hint="run as root",
            ) from exc
        try:
            _setns(target, ref)
        finally:
            os.close(target)
        try:
            yield
        finally:
            _setns(own, NetnsRef("(own)", _THREAD_NETNS))
    finally:
        os.close(own)


@contextlib.contextmanager
def scratch() -> Iterator[None]:
    """Run the block with the calling thread in a new, empty network namespace, gone after
    (``unshare(2)`` of the thread alone; nothing else can reach the namespace)."""
    own = os.open(_THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        if libc.unshare(_CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise NetError(
                f"cannot create a network namespace: {os.strerror(code)}",
                hint="creating a namespace needs CAP_SYS_ADMIN",
            )
        try:
            yield
        finally:
            _setns(own, NetnsRef("(own)", _THREAD_NETNS))
    finally:
        os.close(own)


def _setns(fd: int, ref: NetnsRef) -> None:
    # libc's setns(2) directly: pyroute2's wrapper looks libc up with ctypes.util.find_library,
    # which runs `ldconfig -p`, and the iptc path must not fork.
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.setns(fd, _CLONE_NEWNET) == 0:
        return
    code = ctypes.get_errno()
    if code == errno.EINVAL:
        raise UserError(
            f"--netns: {ref.path} is not a network namespace",
            hint="give /run/netns/NAME or /proc/PID/ns/net",
        )
    raise NetError(
        f"cannot enter network namespace {ref.spec!r}: {os.strerror(code)}",
        hint="entering a namespace needs root (CAP_SYS_ADMIN)",
    )


def add(name: str) -> NetnsRef:
    """Create the named namespace ``/run/netns/NAME`` with ``lo`` up (``ip netns add``)."""
    _ip(["netns", "add", name], f"create network namespace {name!r}")
    ref = NetnsRef(name, f"{RUN_DIR}/{name}")
    _ip(["-n", name, "link", "set", "lo", "up"], f"bring lo up in {name!r}")
    return ref


def delete(name: str) -> None:
    """Remove the named namespace; one already gone is fine. Its links go with it."""
    if Path(f"{RUN_DIR}/{name}").exists():
        _ip(["netns", "delete", name], f"delete network namespace {name!r}")


def pids_in(path: str) -> list[int]:
    """Every process whose network namespace is the one at ``path`` (none if it is gone)."""
    try:
        target = Path(path).stat()
    except OSError:
        return []
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            st = (entry / "ns" / "net").stat()
        except OSError:
            continue  # exited meanwhile, or not ours to look at
        if (st.st_ino, st.st_dev) == (target.st_ino, target.st_dev):
            pids.append(int(entry.name))
    return pids


def _ip(args: list[str], what: str) -> None:
    done = subprocess.run(["ip", *args], capture_output=True, text=True, timeout=30, check=False)
    if done.returncode != 0:
        raise NetError(
            f"cannot {what}: {done.stderr.strip() or f'ip exited {done.returncode}'}",
            hint="network namespaces need root (or a user namespace)",
        )
