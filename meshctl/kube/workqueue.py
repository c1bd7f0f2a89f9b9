"""A work queue of keys for level-triggered reconcilers (controller-runtime's, reduced).

Owns the order of work: a key queued while queued is queued once; a key is never reconciled by
two workers at once (queued again while in progress, it runs once more after); a failed key is
retried with its own doubling delay (0.5 s to 30 s) and a success forgets its failures. The
reconcile function reads the whole desired and current state of its key and makes them equal,
so running it again is always safe.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class WorkQueue(Generic[K]):
    """``add`` keys from event handlers; ``run`` calls ``reconcile(key)`` until cancelled."""

    def __init__(
        self,
        name: str,
        reconcile: Callable[[K], Awaitable[None]],
        *,
        first_retry: float = 0.5,
        max_retry: float = 30.0,
    ) -> None:
        self._name = name
        self._reconcile = reconcile
        self._first = first_retry
        self._max = max_retry
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._again: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: set[asyncio.TimerHandle] = set()

    def add(self, key: K) -> None:
        if key in self._active:
            self._again.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    @property
    def idle(self) -> bool:
        """Nothing queued, running or waiting to be retried."""
        return not (self._queued or self._active or self._timers)

    async def run(self, workers: int = 2) -> None:
        tasks = [asyncio.ensure_future(self._work()) for _ in range(workers)]
        try:
            await asyncio.gather(*tasks)
        finally:
            for task in tasks:
                task.cancel()
            for timer in self._timers:
                timer.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*tasks, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                await self._reconcile(key)
            except asyncio.CancelledError:
                raise
            except Exception as exc:  # noqa: BLE001 -- any failure of one key is retried
                failures = self._failures.get(key, 0) + 1
                self._failures[key] = failures
                delay = min(self._max, self._first * 2 ** (failures - 1))
                message = getattr(exc, "message", None) or repr(exc)
                log.warning("%s %s: %s; retrying in %.1fs", self._name, key, message, delay)
                self._retry_later(key, delay)
            else:
                self._failures.pop(key, None)
            finally:
                self._active.discard(key)
            if key in self._again:
                self._again.discard(key)
                self.add(key)

    def _retry_later(self, key: K, delay: float) -> None:
        loop = asyncio.get_running_loop()

        def fire() -> None:
            self._timers.discard(handle)
            self.add(key)

        handle = loop.call_later(delay, fire)
        self._timers.add(handle)
