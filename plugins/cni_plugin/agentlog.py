"""Where the CNI plugin's log records go: a file in its run dir and, when up, the node agent.

Invariant: never stdout (the runtime reads the result there) and never blocking: the node agent
(``meshctl cni install``) listens on a datagram socket in the run dir; a record it cannot take
right now is dropped rather than delaying a pod's start.
"""

from __future__ import annotations

import contextlib
import logging
import logging.handlers
import socket
from pathlib import Path

from meshctl.core.k8s.cni.spec import LOG_NAME, LOG_SOCKET_NAME
from meshctl.logs import JsonFormatter

MAX_LOG_BYTES = 10 * 1024 * 1024  # as istio-cni's rolling file


class AgentHandler(logging.Handler):
    """Sends each record, as one JSON line, to the node agent's datagram socket."""

    def __init__(self, path: Path) -> None:
        super().__init__()
        self._path = str(path)
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._sock.setblocking(False)
        self.setFormatter(JsonFormatter())

    def emit(self, record: logging.LogRecord) -> None:
        # The agent may be gone or busy: a lost record beats a pod waiting on a log line.
        with contextlib.suppress(OSError):
            self._sock.sendto(self.format(record).encode(), self._path)

    def close(self) -> None:
        self._sock.close()
        super().close()


def configure(run_dir: str, level: str) -> None:
    """Route the root logger to ``<run_dir>/meshctl-cni.log`` and the node agent, if present."""
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.setLevel(level.upper())
    directory = Path(run_dir)
    handler: logging.Handler
    try:
        directory.mkdir(parents=True, exist_ok=True)
        handler = logging.handlers.RotatingFileHandler(
            directory / LOG_NAME, maxBytes=MAX_LOG_BYTES, backupCount=1, encoding="utf-8"
        )
    except OSError:
        # Nowhere to write (read-only or foreign run dir): stderr stays, stdout never.
        handler = logging.StreamHandler()
    handler.setFormatter(JsonFormatter())
    root.addHandler(handler)
    agent = directory / LOG_SOCKET_NAME
    if agent.is_socket():
        root.addHandler(AgentHandler(agent))
