"""Socket facts capture depends on: the original destination of a redirected connection,
transparent (TPROXY) listeners, and sockets owned by another uid/gid (the proxy's); and the
listening sockets daemons bind, with one-line errors that say why a bind failed.

Invariants: ``original_destination`` reads netfilter's conntrack via ``SO_ORIGINAL_DST``
(``linux/netfilter_ipv4.h``; ``IP6T_SO_ORIGINAL_DST`` for IPv6) and returns ``None`` for a
connection that was not NATed; ``filesystem_ids`` changes only the calling thread's filesystem
ids, and only for its block: xt_owner matches the ids of the socket's file, fixed when the socket
is created, so a socket made inside the block is "owned" by those ids.
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import socket
import struct
from collections.abc import Iterator

from meshctl.errors import PortInUseError, listen_failed

SO_ORIGINAL_DST = 80  # same value for SOL_IP and SOL_IPV6 (IP6T_SO_ORIGINAL_DST)
SOL_IPV6 = 41  # SOL_IPV6 exists on Linux but is missing from typeshed's stubs
IP_TRANSPARENT = 19
IPV6_TRANSPARENT = 75


def original_destination(sock: socket.socket) -> tuple[str, int] | None:
    """Where the peer of an accepted, REDIRECTed connection was really going; None if not NATed."""
    try:
        if sock.family == socket.AF_INET:
            raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)  # struct sockaddr_in
            port, addr = struct.unpack_from("!H4s", raw, 2)
            return socket.inet_ntop(socket.AF_INET, addr), port
        raw = sock.getsockopt(SOL_IPV6, SO_ORIGINAL_DST, 28)  # struct sockaddr_in6
        (port,) = struct.unpack_from("!H", raw, 2)
        return socket.inet_ntop(socket.AF_INET6, raw[8:24]), port
    except OSError as exc:
        if exc.errno in (errno.ENOENT, errno.ENOPROTOOPT):
            return None
        raise


def transparent_listener(family: int, address: str, port: int, backlog: int = 16) -> socket.socket:
    """A listener that accepts TPROXY-diverted connections for any destination address."""
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET:
            sock.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
        else:
            sock.setsockopt(SOL_IPV6, IPV6_TRANSPARENT, 1)
        sock.bind((address, port))
        sock.listen(backlog)
    except OSError:
        sock.close()
        raise
    return sock


def address_text(sock: socket.socket) -> str:
    """``HOST:PORT`` a socket is bound to, IPv6 hosts in brackets (``[::]:15008``)."""
    host, port = sock.getsockname()[:2]
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def listener(
    host: str,
    port: int,
    *,
    what: str,
    backlog: int = 1024,
    v6only: bool = False,
    in_use_hint: str = "stop what is using it, or choose another port",
) -> socket.socket:
    """A bound, listening TCP socket on ``host``:``port`` (IPv6 when ``host`` has a colon), or
    a ``UserError`` naming ``what`` and why: the port is taken, the address is not this host's,
    or the port is privileged. ``v6only`` keeps an IPv6 socket from taking the IPv4 port too."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if family == socket.AF_INET6:
            sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, int(v6only))
        sock.bind((host, port))
        sock.listen(backlog)
    except OSError as exc:
        sock.close()
        error = listen_failed(where, what, exc.errno, exc.strerror or str(exc))
        if isinstance(error, PortInUseError):
            error.hint = in_use_hint
        raise error from exc
    return sock


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


@contextlib.contextmanager
def filesystem_ids(uid: int, gid: int) -> Iterator[None]:
    """The calling thread's fsuid/fsgid set to ``uid``/``gid`` for the block (needs root).

    setfsuid(2)/setfsgid(2) are per-thread system calls (glibc does not broadcast them), so other
    threads and the process's real ids are untouched.
    """
    libc = _libc()
    old_gid = libc.setfsgid(gid)
    old_uid = libc.setfsuid(uid)
    try:
        # setfs*id report failure only by not changing the id: read it back to be sure.
        if libc.setfsuid(uid) != uid or libc.setfsgid(gid) != gid:
            raise PermissionError(errno.EPERM, f"cannot act as uid {uid} gid {gid} (needs root)")
        yield
    finally:
        libc.setfsuid(old_uid)
        libc.setfsgid(old_gid)
