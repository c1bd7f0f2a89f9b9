"""``meshctl top`` on a terminal: one rich ``Live`` table, redrawn every interval (the alternate
screen, so the shell's scrollback is left as it was)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from rich.console import Console
from rich.live import Live
from rich.table import Table

from . import table


class Screen:
    def __init__(self, interval: float) -> None:
        self.interval = interval
        self.live = Live(console=Console(), screen=True, auto_refresh=False)
        self.live.start()

    def show(self, found: Sequence[Mapping[str, object]], *, namespaces: bool) -> None:
        grid = Table(title=f"meshctl top (every {self.interval:g}s, Ctrl-C to quit)")
        rows = [table.cells(r, namespaces=namespaces) for r in found]
        columns = list(rows[0]) if rows else ["NAME"]
        if any("REASON" in r for r in rows):
            columns.append("REASON")
        for column in columns:
            grid.add_column(column)
        for r in rows:
            grid.add_row(*(r.get(c, "") for c in columns))
        self.live.update(grid, refresh=True)

    def close(self) -> None:
        self.live.stop()
