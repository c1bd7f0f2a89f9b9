"""What a person at a terminal gets on top of the data: colour, and progress for long batches.

Invariants: colour only when the stream is a terminal and ``NO_COLOR`` is unset or empty (and
``TERM`` is not ``dumb``), unless the user asked for it explicitly with ``--color=always``
(no-color.org: an explicit flag wins over the variable); progress only on a terminal and only
once the work has taken longer than a second, so a pipe, a log file or a quick run sees nothing.
rich is imported only when a progress display actually starts (it costs ~60 ms).
"""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable, Mapping
from types import TracebackType
from typing import Any, TextIO

COLOR_CHOICES = ("auto", "always", "never")
PROGRESS_AFTER_SECONDS = 1.0


def is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError, OSError):  # closed or replaced streams
        return False


def colour_enabled(choice: str, stream: TextIO, env: Mapping[str, str] | None = None) -> bool:
    """Whether to write ANSI colour to ``stream`` for ``--color`` ``choice`` (auto|always|never)."""
    if choice == "always":
        return True
    if choice == "never":
        return False
    env = os.environ if env is None else env
    if env.get("NO_COLOR") or env.get("TERM") == "dumb":
        return False
    return is_terminal(stream)


class Progress:
    """Counts the items of a batch, phase by phase; once the batch has run longer than
    ``after`` seconds and ``stream`` is a terminal, shows the current phase as a progress bar.

    Use as a context manager: ``phase("injecting", total)`` starts a phase, ``advance()``
    counts one item. The bar is transient (erased at the end) and goes to ``stream`` (stderr).
    """

    def __init__(
        self,
        *,
        stream: TextIO | None = None,
        after: float = PROGRESS_AFTER_SECONDS,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._stream = sys.stderr if stream is None else stream
        self._after = after
        self._clock = clock
        self._start = clock()
        self._terminal = is_terminal(self._stream)
        self._description = ""
        self._total: int | None = None
        self._done = 0
        self._display: Any = None
        self._task: Any = None

    @property
    def shown(self) -> bool:
        return self._display is not None

    def phase(self, description: str, total: int | None = None) -> None:
        self._description, self._total, self._done = description, total, 0
        if self._display is not None:
            self._display.reset(self._task, total=total, completed=0, description=description)

    def advance(self, count: int = 1) -> None:
        self._done += count
        if self._display is None:
            if not self._terminal or self._clock() - self._start < self._after:
                return
            self._show()
        self._display.update(self._task, completed=self._done)

    def _show(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn
        from rich.progress import Progress as RichProgress

        self._display = RichProgress(
            TextColumn("{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=Console(file=self._stream),
            transient=True,
        )
        self._display.start()
        self._task = self._display.add_task(self._description, total=self._total)

    def __enter__(self) -> Progress:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        error: BaseException | None,
        trace: TracebackType | None,
    ) -> None:
        if self._display is not None:
            self._display.stop()
            self._display = None
