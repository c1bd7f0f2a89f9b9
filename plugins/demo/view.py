"""What the demo prints: a line per step as it happens, the summary, how to reach a kept mesh.

Invariants: on a pipe (or ``--check``), plain text, one fact per line, so a log or a CI run
reads like the screen; on a terminal a live ``Screen`` (rich) shows the same facts; data about
the run comes from the ``Demo`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .mesh import APP_PORT, identity
from .scenario import Demo

if TYPE_CHECKING:
    from rich.console import Group


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
    if run.ambient:
        lines.append(
            "  meshctl demo exec node -- curl -s localhost:15000/config_dump"
            "   (the node proxy's admin; metrics on localhost:15020/stats/prometheus)"
        )
        lines.append(
            "  meshctl demo exec node -- curl -s localhost:8000/status"
            "   (the node agent: each pod's enrollment)"
        )
        return lines
    for pod in run.meshed():
        lines.append(
            f"  meshctl demo exec {pod.name} -- curl -s localhost:15000/config_dump"
            "   (admin; metrics on localhost:15020/stats/prometheus)"
        )
    return lines


class Screen:
    """The live terminal view (a TTY only): pods with identity and enrollment, the steps so far,
    the latest traffic figures; redrawn four times a second from the ``Demo``'s own state."""

    def __init__(self, run: Demo) -> None:
        self.run = run
        self.traffic = "traffic: waiting for the first figures"
        self.notes: list[str] = []

    def say(self, line: str) -> None:
        """Where the ``Demo``'s lines go while the screen is up."""
        if line.startswith("traffic:"):
            self.traffic = line
        elif not line.startswith(("PASS", "FAIL", "summary:", "  ")):
            self.notes = [*self.notes[-3:], line]

    def __rich__(self) -> Group:
        from rich.console import Group
        from rich.table import Table

        run = self.run
        pods = Table(title="pods", title_justify="left", expand=True)
        for column in ("pod", "namespace", "address", "identity", "enrollment"):
            pods.add_column(column)
        for pod in run.pods.values():
            proxy = run.sidecars.get(pod.name)
            if run.ambient:
                meshed = pod in run.meshed()
                text = run.enrollment.get(pod.name, "starting")
                up = run.node_proxy is not None and run.node_proxy.poll() is None
                colour = "green" if meshed and up and text.startswith("ambient") else "yellow"
                enrolled = f"[{colour}]{text}[/]" if meshed else f"[yellow]unmeshed: {text}[/]"
                who = str(identity(pod)) if meshed else "-"
            elif proxy is None:
                enrolled, who = "[yellow]unmeshed[/]", "-"
            else:
                up = proxy.poll() is None
                enrolled = "[green]sidecar up[/]" if up else "[red]sidecar down[/]"
                who = str(identity(pod))
            pods.add_row(pod.name, pod.namespace, pod.ip, who, enrolled)
        steps = Table(title="steps", title_justify="left", expand=True)
        steps.add_column("", width=4)
        steps.add_column("step", no_wrap=True)
        steps.add_column("what it showed", ratio=1)
        for step in run.steps:
            mark = "[green]PASS[/]" if step.ok else "[red]FAIL[/]"
            steps.add_row(mark, step.name, step.detail)
        return Group(pods, steps, self.traffic, *self.notes)
