"""Proving that capture works inside a pod (Istio's validation init container, exit 126).

Invariants: the probe is a TCP connection from 127.0.0.1 to 127.0.0.6:PROBE_PORT (nothing
listens there) made as the proxy's uid/gid; capture is proven only when one of our listeners on
the outbound or inbound capture port accepts it and ``SO_ORIGINAL_DST`` names the probe port.
Every wait has a deadline; every socket is closed on return.
"""

from __future__ import annotations

import os
import selectors
import socket
import time
from dataclasses import dataclass

from meshctl.net.sockets import filesystem_ids, original_destination

PROBE_ADDRESS = "127.0.0.6"


@dataclass(frozen=True, slots=True)
class Validation:
    ok: bool
    message: str
    hint: str = ""


def validate(
    *, capture_ports: tuple[int, ...], probe_port: int, uid: int, gid: int, timeout: float
) -> Validation:
    listeners: list[socket.socket] = []
    try:
        for port in capture_ports:
            listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            listeners.append(listener)
            listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                listener.bind(("127.0.0.1", port))
            except OSError as exc:
                return Validation(
                    False,
                    f"cannot listen on 127.0.0.1:{port}: {exc.strerror}",
                    "validation must run before the proxy starts (it borrows the capture ports)",
                )
            listener.listen(4)
            listener.setblocking(False)
        return _probe(listeners, probe_port, uid, gid, timeout)
    finally:
        for listener in listeners:
            listener.close()


def _probe(
    listeners: list[socket.socket], probe_port: int, uid: int, gid: int, timeout: float
) -> Validation:
    deadline = time.monotonic() + timeout
    target = f"{PROBE_ADDRESS}:{probe_port}"
    try:
        probe = _socket_as(uid, gid)
    except PermissionError as exc:
        return Validation(False, str(exc), f"run validate as root or as the proxy uid {uid}")
    with probe, selectors.DefaultSelector() as sel:
        probe.bind(("127.0.0.1", 0))
        probe.setblocking(False)
        probe.connect_ex((PROBE_ADDRESS, probe_port))
        sel.register(probe, selectors.EVENT_WRITE)
        for listener in listeners:
            sel.register(listener, selectors.EVENT_READ)
        failure = ""
        while not failure and (left := deadline - time.monotonic()) > 0:
            for key, _ in sel.select(left):
                sock = key.fileobj
                if not isinstance(sock, socket.socket):
                    continue
                if sock is probe:
                    # Writable: the connect finished. Refused means nothing redirected it.
                    code = probe.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
                    sel.unregister(probe)
                    if code:
                        failure = f"connecting to {target} failed: {os.strerror(code)}"
                    continue
                found = _accepted(sock, probe_port)
                if found is not None:
                    return found
        return Validation(
            False,
            failure or f"the probe to {target} was not redirected within {timeout:g} s",
            "traffic capture is not set up in this pod yet: the CNI plugin may not have run "
            "(a pod that started before the mesh node agent was ready needs a restart)",
        )


def _accepted(listener: socket.socket, probe_port: int) -> Validation | None:
    try:
        conn, _ = listener.accept()
    except BlockingIOError:
        return None
    with conn:
        original = original_destination(conn)
    port = listener.getsockname()[1]
    if original is not None and original[1] == probe_port:
        return Validation(
            True,
            f"{PROBE_ADDRESS}:{probe_port} was redirected to port {port} "
            f"(original destination {original[0]}:{original[1]} kept)",
        )
    return Validation(
        False,
        f"port {port} accepted a connection whose original destination is {original}",
        "another process is using the capture ports",
    )


def _socket_as(uid: int, gid: int) -> socket.socket:
    """A socket owned by the proxy's ids: capture rules exempt or hairpin by owner."""
    if os.geteuid() == 0 and (uid, gid) != (0, 0):
        with filesystem_ids(uid, gid):
            return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
