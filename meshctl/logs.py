"""Logging setup, called once by an entrypoint: text for humans, one JSON object a line for daemons.

Invariant: logs go to stderr; stdout is reserved for data.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import UTC, datetime
from typing import TextIO

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


def configure(level: str = DEFAULT_LEVEL, fmt: str = "text", stream: TextIO | None = None) -> None:
    """Route the root logger to ``stream`` (stderr) at ``level`` in ``fmt`` ("text" or "json")."""
    handler = logging.StreamHandler(stream or sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
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
