"""What the demo prints: a line per step as it happens, the summary, how to reach a kept mesh.

Invariants: plain text, one fact per line (the same on a terminal and on a pipe, so a log or a
CI run reads like the screen); data about the run comes from the ``Demo`` only.
"""

from __future__ import annotations

from .mesh import APP_PORT
from .scenario import Demo


def summary(run: Demo) -> list[str]:
    passed = sum(s.ok for s in run.steps)
    lines = [f"summary: {passed}/{len(run.steps)} steps passed"]
    lines += [f"  {'ok  ' if s.ok else 'FAIL'} {s.name}" for s in run.steps]
    if run.first_encrypted is not None:
        lines.append(f"first encrypted byte on the wire {run.first_encrypted:.1f}s after start")
    return lines


def how_to_poke(run: Demo) -> list[str]:
    server = run.pods["server"]
    lines = [
        "the mesh keeps running ('meshctl demo down' removes it). Try:",
        f"  meshctl demo exec client -- curl -s http://{server.ip}:{APP_PORT}/hi",
    ]
    for pod in run.meshed():
        lines.append(
            f"  meshctl demo exec {pod.name} -- curl -s localhost:15000/config_dump"
            "   (admin; metrics on localhost:15020/stats/prometheus)"
        )
    return lines
