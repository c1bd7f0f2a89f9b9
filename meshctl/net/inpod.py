"""Sockets inside a pod's network namespace, made by a process that lives in the node's.

Owns what the node proxy does in pods (Istio's in-pod mode): the listeners it opens in a pod's
netns (15001/15006/15008, 15053 for DNS), marked so the pod's capture rules exempt them, and the
connections it originates from there. A socket belongs to the namespace it was created in, so
only creation needs the switch: ``setns(2)`` into the pod, ``socket()``, ``setns(2)`` back; the
calling thread is never left in a pod's namespace, also when creation fails.
Listeners are SO_REUSEPORT, so a second node proxy (the next one of a rollout, same uid as the
kernel requires) can hold them beside the first, and the pod's ``net.ipv4.tcp_migrate_req`` is
1, so connections queued on a listener the first one closes move to the second one's instead of
being reset (Linux >= 5.14; without it a handover can reset the few queued at that instant:
logged once, pods still served).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import logging
import os
import socket
from collections.abc import Iterator, Mapping

from meshctl.errors import NetError
from meshctl.net.sysctls import NetSysctls

log = logging.getLogger(__name__)

_THREAD_NETNS = "/proc/thread-self/ns/net"
_CLONE_NEWNET = 0x40000000
_BACKLOG = 4096
MIGRATE_SYSCTL = "net.ipv4.tcp_migrate_req"


class InPod:
    """Switches the calling thread into pod namespaces (by descriptor) and back home."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._home = os.open(_THREAD_NETNS, os.O_RDONLY | os.O_CLOEXEC)
        self._sysctls = NetSysctls()
        self._migrate_warned = False

    def close(self) -> None:
        self._sysctls.close()
        with contextlib.suppress(OSError):
            os.close(self._home)

    @contextlib.contextmanager
    def entered(self, netns_fd: int) -> Iterator[None]:
        """The block runs with the calling thread in the namespace of ``netns_fd``."""
        self._setns(netns_fd)
        try:
            yield
        finally:
            self._setns(self._home)

    def new_socket(
        self, netns_fd: int, family: int, kind: int = socket.SOCK_STREAM
    ) -> socket.socket:
        """A new socket that belongs to the namespace of ``netns_fd``."""
        with self.entered(netns_fd):
            return socket.socket(family, kind | socket.SOCK_CLOEXEC)

    def listeners(
        self, netns_fd: int, ports: Mapping[str, int], *, mark: int
    ) -> dict[str, socket.socket]:
        """``role -> listening socket`` on all addresses of the pod (IPv6 twins as ``<role>6``
        when the pod has IPv6), every one carrying ``mark``. All or nothing: on failure the
        ones already opened are closed and ``NetError`` names the port."""
        out: dict[str, socket.socket] = {}
        try:
            with self.entered(netns_fd):
                self._migrate_requests()
                for role, port in ports.items():
                    out[role] = _listen(socket.AF_INET, "0.0.0.0", port, role, mark)  # noqa: S104 (the pod's own ports)
                    if _has_ipv6():
                        out[role + "6"] = _listen(socket.AF_INET6, "::", port, role, mark)
        except BaseException:
            for sock in out.values():
                sock.close()
            raise
        return out

    def _migrate_requests(self) -> None:
        """``tcp_migrate_req=1`` in the namespace this thread is in; a kernel without it, or a
        write refused, is logged once and the pod is served all the same."""
        try:
            if self._sysctls.set(MIGRATE_SYSCTL, "1"):
                return
            problem = f"this kernel has no {MIGRATE_SYSCTL} (Linux >= 5.14)"
        except NetError as exc:
            problem = exc.message
        if not self._migrate_warned:
            self._migrate_warned = True
            log.warning(
                "%s: a handover to the next node proxy may reset connections queued on the "
                "old one's listeners as it closes them",
                problem,
            )

    def _setns(self, fd: int) -> None:
        if self._libc.setns(fd, _CLONE_NEWNET) == 0:
            return
        code = ctypes.get_errno()
        if code == errno.EINVAL:
            raise NetError(
                "descriptor is not a network namespace",
                hint="the node agent must pass /proc/<pid>/ns/net or /var/run/netns/<name>",
            )
        raise NetError(
            f"cannot enter the pod's network namespace: {os.strerror(code)}",
            hint="the node proxy needs CAP_SYS_ADMIN to enter pod namespaces",
        )


def _has_ipv6() -> bool:
    """Whether the namespace this thread is in has a global IPv6 address (scope 00 in
    ``if_inet6``): only then can IPv6 traffic be captured, so only then are v6 twins opened.
    ``thread-self``: ``/proc/net`` would show the main thread's namespace, not this one's."""
    try:
        with open("/proc/thread-self/net/if_inet6", encoding="ascii") as handle:  # noqa: PTH123
            lines = handle.read().splitlines()
    except OSError:
        return False  # IPv6 disabled in this namespace
    return any(len(parts) > 3 and parts[3] == "00" for parts in map(str.split, lines))


def _listen(family: int, host: str, port: int, role: str, mark: int) -> socket.socket:
    sock = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        # The next node proxy binds the same ports beside us during a rollout (handover).
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        if mark:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_MARK, mark)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 1)
        sock.bind((host, port))
        sock.listen(_BACKLOG)
    except OSError as exc:
        sock.close()
        raise NetError(
            f"cannot listen on {host}:{port} ({role}) in the pod: {exc.strerror or exc}",
            hint="is another proxy (a sidecar, or a node proxy of an older version that does "
            "not share its listeners) already using the port in this pod?",
        ) from exc
    return sock
