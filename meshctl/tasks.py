"""The background tasks of a long-running process: started, failures logged, cancelled together.

Owns ``Tasks``: the asyncio tasks a daemon starts and does not await one by one (a connection's
handler, a reconcile an event kicked off, a server loop). Invariants: a task leaves the set when it
ends; a failure is logged once, with its traceback, on the owner's logger, and never reaches the
loop's exception handler; ``cancel`` stops every task still running (a drain, a shutdown). The
data plane, the CNI node agent and the control plane each hold one.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Coroutine, Iterator
from typing import Any


class Tasks:
    """A set of running tasks; ``what`` names one in the log (``connection task failed``)."""

    def __init__(self, log: logging.Logger, what: str = "task") -> None:
        self._log = log
        self._what = what
        self._running: set[asyncio.Task[Any]] = set()

    def spawn(self, coro: Coroutine[Any, Any, Any], name: str | None = None) -> asyncio.Task[Any]:
        """Run ``coro`` as a task of this set; ``name`` names it in its failure's log line."""
        task = asyncio.ensure_future(coro)
        if name is not None:
            task.set_name(name)
        self._running.add(task)
        task.add_done_callback(functools.partial(self._done, name or self._what))
        return task

    def cancel(self) -> None:
        """Cancel every task still running (each leaves the set as it ends)."""
        for task in list(self._running):
            task.cancel()

    def __iter__(self) -> Iterator[asyncio.Task[Any]]:
        return iter(list(self._running))

    def __len__(self) -> int:
        return len(self._running)

    def _done(self, what: str, task: asyncio.Task[Any]) -> None:
        self._running.discard(task)
        if not task.cancelled() and task.exception() is not None:
            self._log.error("%s failed", what, exc_info=task.exception())
