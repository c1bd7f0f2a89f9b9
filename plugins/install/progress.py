"""What install and uninstall show while they wait: one line per component, ✔/✘, elapsed.

On a terminal a live display (rich) redraws the lines in place with a spinner; otherwise each
change is one plain line (``✔ Control plane ready (12.3s)``), so logs and CI output stay
readable. Invariants: messages go to stderr (stdout is for data); the display is closed before any
error is printed, so an ``Error:`` line is never drawn over.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import IO, Any

WAITING, DONE, FAILED = "waiting", "done", "failed"
_SYMBOLS = {DONE: "✔", FAILED: "✘"}


@dataclass
class _Line:
    title: str
    state: str = WAITING
    detail: str = ""
    started: float = field(default_factory=time.monotonic)
    ended: float | None = None

    def elapsed(self) -> float:
        return (self.ended or time.monotonic()) - self.started


class Progress:
    """Lines keyed by component name; ``update`` them, then ``close``."""

    def __init__(
        self, lines: Sequence[tuple[str, str]], *, verb: str, stream: IO[str] | None = None
    ) -> None:
        self.stream = stream or sys.stderr
        self.verb = verb  # "ready" / "removed": what done means
        self.lines = {name: _Line(title) for name, title in lines}
        self._live: Any = None
        if self.stream.isatty():
            from rich.console import Console
            from rich.live import Live

            console = Console(file=self.stream)
            self._live = Live(
                self._render(), console=console, refresh_per_second=8, transient=False
            )
            self._live.__enter__()

    def update(self, name: str, state: str, detail: str = "") -> None:
        line = self.lines[name]
        if line.state != WAITING:
            return
        changed = state != line.state or detail != line.detail
        line.state, line.detail = state, detail
        if state != WAITING:
            line.ended = time.monotonic()
        if self._live is not None:
            self._live.update(self._render())
        elif changed and state != WAITING:
            self.stream.write(self._plain(line) + "\n")
            self.stream.flush()

    def tick(self) -> None:
        if self._live is not None:
            self._live.update(self._render())

    def _plain(self, line: _Line) -> str:
        symbol = _SYMBOLS.get(line.state, "…")
        what = self.verb if line.state == DONE else line.detail or line.state
        return f"{symbol} {line.title} {what} ({line.elapsed():.1f}s)"

    def _render(self) -> Any:
        from rich.spinner import Spinner
        from rich.table import Table
        from rich.text import Text

        table = Table.grid(padding=(0, 1))
        for line in self.lines.values():
            if line.state == WAITING:
                mark: Any = Spinner("dots")
                what = line.detail or "waiting"
            else:
                style = "green" if line.state == DONE else "red"
                mark = Text(_SYMBOLS[line.state], style=style)
                what = self.verb if line.state == DONE else line.detail
            table.add_row(
                mark, Text(line.title, style="bold"), Text(what), f"{line.elapsed():.1f}s"
            )
        return table

    def close(self) -> None:
        if self._live is not None:
            self._live.update(self._render())
            self._live.__exit__(None, None, None)
            self._live = None
