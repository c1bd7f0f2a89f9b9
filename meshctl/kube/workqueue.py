"""A work queue of keys for level-triggered reconcilers (controller-runtime's, reduced).

Owns the order of work: a key added while queued is queued once; a key is never reconciled by
two workers at once (added while in progress, it runs once more after); a failed key is retried
after its own backoff (``RETRY_BACKOFF``: 0.5 s doubling to 30 s) and a success forgets its
failures; adding a key that waits for a retry runs it now instead (the retry is replaced, never
doubled). The reconcile function reads the whole desired and current state of its key and makes
them equal, so running it again is always safe.

How a reconcile ends decides what follows: returning forgets the key's failures; ``Retry``
retries it quietly (the reconcile said why itself); ``GiveUp`` does not retry (it said why;
the failures are kept, so should a new ``add`` fail again, the retry waits longer); any other
exception is logged and retried.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable, Hashable
from typing import Generic, TypeVar

from meshctl.core.backoff import Backoff

log = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)
RETRY_BACKOFF = Backoff(first=0.5, cap=30.0)


class Retry(Exception):  # noqa: N818 -- an instruction to the queue, not an error of its own
    """Raised by a reconcile: try this key again after its backoff (nothing more is logged)."""


class GiveUp(Exception):  # noqa: N818 -- likewise
    """Raised by a reconcile: do not retry this key until it is added again."""


class WorkQueue(Generic[K]):
    """``add`` keys from event handlers; ``run`` calls ``reconcile(key)`` until cancelled or
    ``shut_down``."""

    def __init__(
        self,
        name: str,
        reconcile: Callable[[K], Awaitable[None]],
        *,
        backoff: Backoff = RETRY_BACKOFF,
    ) -> None:
        self._name = name
        self._reconcile = reconcile
        self._backoff = backoff
        self._queue: asyncio.Queue[K] = asyncio.Queue()
        self._queued: set[K] = set()
        self._active: set[K] = set()
        self._again: set[K] = set()
        self._failures: dict[K, int] = {}
        self._timers: dict[K, asyncio.TimerHandle] = {}
        self._workers: list[asyncio.Task[None]] = []
        self._closed = False

    def add(self, key: K) -> None:
        """Reconcile ``key`` soon (at once if it was waiting for a retry)."""
        if self._closed:
            return
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()
        if key in self._active:
            self._again.add(key)
        elif key not in self._queued:
            self._queued.add(key)
            self._queue.put_nowait(key)

    def retry(self, key: K) -> None:
        """A run of ``key`` outside the queue failed: count it, run the key after its backoff."""
        self._failed(key)

    def forget(self, key: K) -> None:
        """The key's object is gone for good: drop its failures and any retry it waits for."""
        self._failures.pop(key, None)
        timer = self._timers.pop(key, None)
        if timer is not None:
            timer.cancel()

    def failures(self, key: K) -> int:
        """Failures of ``key`` in a row (0 after a success)."""
        return self._failures.get(key, 0)

    @property
    def idle(self) -> bool:
        """Nothing queued, running or waiting to be retried."""
        return not (self._queued or self._active or self._timers)

    def shut_down(self) -> None:
        """Stop: no more keys are taken, pending retries are dropped, ``run`` returns (a
        reconcile in progress is cancelled)."""
        self._closed = True
        for timer in self._timers.values():
            timer.cancel()
        self._timers.clear()
        for task in self._workers:
            task.cancel()

    async def run(self, workers: int = 2) -> None:
        self._workers = [asyncio.ensure_future(self._work()) for _ in range(workers)]
        try:
            await asyncio.gather(*self._workers, return_exceptions=True)
        finally:
            self.shut_down()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*self._workers, return_exceptions=True)

    async def _work(self) -> None:
        while True:
            key = await self._queue.get()
            self._queued.discard(key)
            self._active.add(key)
            try:
                await self._reconcile(key)
            except asyncio.CancelledError:
                raise
            except GiveUp:
                self._failures[key] = self._failures.get(key, 0) + 1
            except Exception as exc:  # noqa: BLE001 -- any failure of one key is retried
                delay = self._failed(key)
                if not isinstance(exc, Retry):
                    message = getattr(exc, "message", None) or repr(exc)
                    log.warning("%s %s: %s; retrying in %.1fs", self._name, key, message, delay)
            else:
                self._failures.pop(key, None)
            finally:
                self._active.discard(key)
            if key in self._again:
                self._again.discard(key)
                self.add(key)

    def _failed(self, key: K) -> float:
        failures = self._failures[key] = self._failures.get(key, 0) + 1
        delay = self._backoff.delay(failures)
        if self._closed:
            return delay
        loop = asyncio.get_running_loop()
        earlier = self._timers.pop(key, None)
        if earlier is not None:
            earlier.cancel()

        def fire() -> None:
            self._timers.pop(key, None)
            self.add(key)

        self._timers[key] = loop.call_later(delay, fire)
        return delay
