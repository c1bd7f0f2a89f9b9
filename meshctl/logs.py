"""Logging setup, called once by an entrypoint: text for humans, one JSON object a line for daemons.

Invariant: logs go to stderr; stdout is reserved for data. A daemon on an event loop may
``defer_writes``: lines are then written together once per loop iteration (one write call for
many access-log lines); WARNING and above, and a full batch, are written at once.
"""

from __future__ import annotations

import json
import logging
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TextIO

DEFAULT_LEVEL = "warning"  # commands: only what needs attention
DAEMON_LEVEL = "info"  # long-running commands: also where they listen and when they are ready

# Attributes every LogRecord has; anything else was passed through ``extra=`` and is kept.
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, msg, extra fields, exception text."""

    def format(self, record: logging.LogRecord) -> str:
        entry: dict[str, object] = {
            "time": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD_ATTRS and not key.startswith("_"):
                entry[key] = value
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return json.dumps(entry, default=str)


class TextFormatter(logging.Formatter):
    """``asctime level logger: message``, the time formatted once per second, not per record
    (``strftime`` was a visible share of a proxy's cost per connection with one access line)."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)s %(name)s: %(message)s")
        self._second = -1
        self._stamp = ""

    def formatTime(self, record: logging.LogRecord, datefmt: str | None = None) -> str:  # noqa: N802 (logging's name)
        second = int(record.created)
        if second != self._second:
            self._second = second
            self._stamp = time.strftime("%Y-%m-%d %H:%M:%S", self.converter(second))
        return f"{self._stamp},{int(record.msecs):03d}"


class _DeferredHandler(logging.StreamHandler):  # type: ignore[type-arg]
    """A stream handler that writes what it got once per ``schedule``d flush."""

    _BATCH = 512  # lines held at most before a write

    def __init__(self, stream: Any, schedule: Callable[[Callable[[], None]], object]) -> None:
        super().__init__(stream)
        self._schedule = schedule
        self._pending: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        try:
            line = self.format(record)
        except Exception:  # noqa: BLE001 (logging's own contract: report, never raise)
            self.handleError(record)
            return
        self._pending.append(line)
        if record.levelno >= logging.WARNING or len(self._pending) >= self._BATCH:
            self.flush()
        elif len(self._pending) == 1:
            self._schedule(self.flush)

    def flush(self) -> None:
        if self._pending:
            lines, self._pending = self._pending, []
            try:
                self.stream.write("\n".join(lines) + "\n")
            except (OSError, ValueError):  # stderr gone: nothing left to tell
                return
        super().flush()


def defer_writes(schedule: Callable[[Callable[[], None]], object]) -> None:
    """Batch the root handler's writes: ``schedule(fn)`` runs ``fn`` soon (``loop.call_soon``).

    Lines written by one event-loop iteration leave in one write; they are flushed at exit too
    (``logging.shutdown``), so only a process killed outright loses the current iteration's.
    """
    root = logging.getLogger()
    for old in list(root.handlers):
        if type(old) is logging.StreamHandler:
            new = _DeferredHandler(old.stream, schedule)
            new.setFormatter(old.formatter)
            new.setLevel(old.level)
            root.removeHandler(old)
            root.addHandler(new)


def configure(level: str = DEFAULT_LEVEL, fmt: str = "text", stream: TextIO | None = None) -> None:
    """Route the root logger to ``stream`` (stderr) at ``level`` in ``fmt`` ("text" or "json")."""
    handler = logging.StreamHandler(stream or sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else TextFormatter())
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
    root.addHandler(handler)
    root.setLevel(level.upper())


def listening(logger: logging.Logger, what: str, addresses: list[str]) -> None:
    """The one line a daemon logs once its sockets are bound: what, and every address."""
    logger.info("%s listening on %s", what, ", ".join(addresses))


def ready(logger: logging.Logger, what: str, detail: str = "") -> None:
    """The one line a daemon logs when it starts doing its job (serving, installed)."""
    logger.info("%s ready%s", what, f": {detail}" if detail else "")
