"""What the demo prints: a line per step as it happens, the summary, how to reach a kept mesh.

Invariants: on a pipe (or ``--check``), plain text, one fact per line, so a log or a CI run
reads like the screen; on a terminal a live ``Screen`` (rich) shows the same facts; data about
the run comes from the ``Demo`` only.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from .mesh import APP_PORT, TRUST_DOMAIN, identity
from .scenario import Demo

if TYPE_CHECKING:
    from rich.console import Console, ConsoleOptions, Group, RenderResult
    from rich.table import Table

    from .node import Pod


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
    the latest traffic figures; redrawn four times a second from the ``Demo``'s own state.
    When the full view does not fit the terminal (80x24), a compact one does: one line per step
    (cut with an ellipsis), identities without the trust domain every pod shares."""

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

    def __rich_console__(self, console: Console, options: ConsoleOptions) -> RenderResult:
        full = self.view(compact=False)
        height = options.height or options.size.height
        if len(console.render_lines(full, options.update(height=None), pad=False)) <= height:
            yield full
        else:
            yield self.view(compact=True)

    def view(self, *, compact: bool) -> Group:
        from rich.console import Group
        from rich.text import Text

        run = self.run
        pods = _table("pods", compact)
        for column in ("pod", "namespace", "address", "identity", "enrollment"):
            if compact and column == "namespace":
                continue  # in the identity: ns/NAMESPACE/sa/ACCOUNT
            pods.add_column(column, no_wrap=compact, overflow="ellipsis")
        for pod in run.pods.values():
            proxy = run.sidecars.get(pod.name)
            meshed_pod = False
            if run.ambient:
                meshed_pod = pod in run.meshed()
                text = run.enrollment.get(pod.name, "starting")
                up = run.node_proxy is not None and run.node_proxy.poll() is None
                colour = "green" if meshed_pod and up and text.startswith("ambient") else "yellow"
                enrolled = f"[{colour}]{text}[/]" if meshed_pod else f"[yellow]unmeshed: {text}[/]"
            elif proxy is None:
                enrolled = "[yellow]unmeshed[/]"
            else:
                meshed_pod = True
                up = proxy.poll() is None
                enrolled = "[green]sidecar up[/]" if up else "[red]sidecar down[/]"
            who = _identity(pod, short=compact) if meshed_pod else "-"
            where = [] if compact else [pod.namespace]
            pods.add_row(pod.name, *where, pod.ip, who, enrolled)
        steps = _table("steps", compact)
        steps.add_column("", width=4)
        steps.add_column("step", no_wrap=True)
        steps.add_column(
            "what it showed", ratio=1, no_wrap=compact, overflow="ellipsis" if compact else "fold"
        )
        for step in run.steps:
            mark = "[green]PASS[/]" if step.ok else "[red]FAIL[/]"
            # Compact: identities in the details lose the trust domain too, as in the pods table.
            detail = (
                step.detail.replace(f"spiffe://{TRUST_DOMAIN}/", "") if compact else step.detail
            )
            steps.add_row(mark, step.name, detail)
        lines = [self.traffic, *self.notes]
        if compact:
            tail = [Text(line, no_wrap=True, overflow="ellipsis") for line in lines[-2:]]
            return Group(pods, steps, *tail)
        return Group(pods, steps, *lines)


def _table(title: str, compact: bool) -> Table:
    """A table of the screen; compact: no title, no box around it (a header rule only)."""
    from rich import box
    from rich.table import Table

    if compact:
        return Table(expand=True, box=box.SIMPLE_HEAD, pad_edge=False)
    return Table(title=title, title_justify="left", expand=True)


def _identity(pod: Pod, *, short: bool) -> str:
    """The pod's SPIFFE id; ``short``: its path only (``ns/prod/sa/server``), the trust domain
    being every pod's."""
    spiffe = identity(pod)
    return f"ns/{spiffe.namespace}/sa/{spiffe.service_account}" if short else str(spiffe)
