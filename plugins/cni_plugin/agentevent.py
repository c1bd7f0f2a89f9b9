"""The CNI plugin's calls to the node agent (ambient mode): HTTP/1.1 over its unix socket.

Istio's shape: the plugin POSTs the sandbox's facts to ``<run_dir>/pluginevent.sock`` and, for a
pod enrolled in ambient mode, waits until the agent has captured the pod and handed it to the
node proxy. Invariants: an enrolled pod's ADD fails unless the agent answered 200 (fail closed:
the pod never starts uncaptured); a notice about a pod that is not enrolled (so the agent knows
its netns should a label enroll it later) and DEL are best effort and never fail the runtime.
"""

from __future__ import annotations

import http.client
import json
import socket
from typing import TYPE_CHECKING

from meshctl.core.k8s.cni.spec import PLUGIN_EVENT_SOCKET_NAME

if TYPE_CHECKING:
    from meshctl.core.k8s.cni.messages import PluginEvent


class AgentUnavailableError(Exception):
    """The agent could not be reached or did not answer 200; ``str()`` says which."""


class _UnixConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float) -> None:
        super().__init__("localhost", timeout=timeout)
        self._path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        try:
            sock.connect(self._path)
        except OSError:
            sock.close()
            raise
        self.sock = sock


def post(run_dir: str, path: str, body: PluginEvent, *, timeout: float) -> str:
    """POST ``body`` to the agent; the answer's text, or ``AgentUnavailableError``."""
    where = f"{run_dir.rstrip('/')}/{PLUGIN_EVENT_SOCKET_NAME}"
    conn = _UnixConnection(where, timeout)
    try:
        conn.request(
            "POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"}
        )
        answer = conn.getresponse()
        text = answer.read(4096).decode(errors="replace").strip()
    except (OSError, http.client.HTTPException) as exc:
        reason = getattr(exc, "strerror", None) or str(exc) or type(exc).__name__
        raise AgentUnavailableError(f"node agent at {where} unreachable: {reason}") from exc
    finally:
        conn.close()
    if answer.status != 200:
        raise AgentUnavailableError(f"node agent answered {answer.status}: {text}")
    return text
