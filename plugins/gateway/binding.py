"""Opening one listener port, the same way for a lone gateway and a workers' supervisor.

Invariant: a port that cannot be bound is never fatal: the reason is kept per port (for
``/healthz/ready`` and the admin dump) and logged once per new reason, not on every config push.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Callable

from meshctl.errors import MeshctlError

log = logging.getLogger(__name__)


def bind_port(
    port: int, actual: int, failed: dict[int, str], open_socket: Callable[[], socket.socket]
) -> socket.socket | None:
    """``open_socket()`` for listener ``port`` (bound as ``actual``), or ``None`` with why kept
    in ``failed[port]``; a success clears the port's old reason."""
    try:
        sock = open_socket()
    except MeshctlError as exc:
        if failed.get(port) != str(exc):
            log.error("cannot listen on %d: %s", actual, exc)  # noqa: TRY400 (expected; no traceback)
        failed[port] = str(exc)
        return None
    failed.pop(port, None)
    return sock
