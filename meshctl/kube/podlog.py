"""A container's log through the API server (``pods/log``), bounded in time and size.

Owns the query (``sinceSeconds``, ``limitBytes``, ``tailLines``, ``previous``: the API
reference's) and keeping the newest lines when the window holds more than the cap: the API cuts
from the start of the window, so a log that fills the cap is read again as its last lines.
Invariants: at most two requests per log, each with the client's timeout; never more than
twice ``limit`` bytes read, ``limit`` kept; a failure is the ``KubeError`` of ``meshctl.kube.api``.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.kube import api
from meshctl.kube.client import Kube
from meshctl.kube.resources import PODS


@dataclass(frozen=True, slots=True)
class PodLog:
    text: str
    cut: bool  # the window held more than the cap: older lines are missing


def read(
    kube: Kube,
    namespace: str,
    pod: str,
    container: str,
    *,
    since: float | None,
    limit: int,
    previous: bool = False,
    timeout: float | None = None,
) -> PodLog:
    """The container's log of the last ``since`` seconds (None: all the runtime kept), at most
    ``limit`` bytes, its newest lines kept; ``previous``: the container's last terminated run."""
    path = PODS.path(namespace, pod, "log")
    query = [("container", container), ("limitBytes", str(limit))]
    if since is not None:
        query.append(("sinceSeconds", str(max(1, int(since)))))
    if previous:
        query.append(("previous", "true"))
    text = api.request_text(kube, path, query=query, timeout=timeout)
    if len(text.encode()) < limit:
        return PodLog(text, cut=False)
    # The window is larger than the cap: ask for as many of its last lines as fit (roughly the
    # count the first read held; twice the cap leaves room for longer lines), then cut any
    # excess from the front.
    lines = max(1, text.count("\n"))
    again = [(k, str(2 * limit) if k == "limitBytes" else v) for k, v in query]
    tail = api.request_text(kube, path, query=[*again, ("tailLines", str(lines))], timeout=timeout)
    data = tail.encode()
    if len(data) > limit:
        data = data[-limit:]
        tail = data.decode(errors="replace").split("\n", 1)[-1]
    return PodLog(tail, cut=True)
