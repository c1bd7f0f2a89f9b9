"""The work queue shared by the control plane and the CNI agent: coalescing, one run per key at
a time, retries on the key's own backoff, and what a reconcile's way of ending means."""

from __future__ import annotations

import asyncio
import itertools
import logging
from collections.abc import Awaitable, Callable

from meshctl.core.backoff import Backoff
from meshctl.kube.workqueue import GiveUp, Retry, WorkQueue

FAST = Backoff(first=0.05, cap=1.0)


async def _until(condition: Callable[[], bool], timeout: float = 5.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


def _run(queue: WorkQueue[str], scenario: Callable[[], Awaitable[None]], workers: int = 2) -> None:
    async def main() -> None:
        task = asyncio.ensure_future(queue.run(workers=workers))
        try:
            await scenario()
        finally:
            task.cancel()

    asyncio.run(main())


def test_a_key_queued_twice_runs_once_and_never_concurrently_with_itself() -> None:
    runs: list[str] = []
    running: set[str] = set()

    async def reconcile(key: str) -> None:
        assert key not in running, "the same key ran twice at once"
        running.add(key)
        runs.append(key)
        await asyncio.sleep(0.02)
        running.discard(key)

    queue: WorkQueue[str] = WorkQueue("test", reconcile)

    async def scenario() -> None:
        for key in ("a", "a", "b", "a"):
            queue.add(key)
        await asyncio.sleep(0.005)
        queue.add("a")  # while "a" runs: once more after it
        await _until(lambda: queue.idle and len(runs) >= 3)

    _run(queue, scenario, workers=4)
    assert sorted(runs) == ["a", "a", "b"]


def test_a_failing_key_is_retried_with_growing_delays_until_it_succeeds() -> None:
    attempts: list[float] = []

    async def reconcile(_key: str) -> None:
        attempts.append(asyncio.get_running_loop().time())
        if len(attempts) < 3:
            raise RuntimeError("API said no")

    queue: WorkQueue[str] = WorkQueue("test", reconcile, backoff=FAST)

    async def scenario() -> None:
        queue.add("k")
        await _until(lambda: len(attempts) >= 3 and queue.idle)

    _run(queue, scenario)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert len(attempts) == 3
    assert gaps[0] >= 0.05
    assert gaps[1] >= 0.1  # doubled
    assert queue.failures("k") == 0  # the success forgot them


def test_adding_a_key_that_waits_for_a_retry_runs_it_now_and_only_once() -> None:
    attempts: list[float] = []

    async def reconcile(_key: str) -> None:
        attempts.append(asyncio.get_running_loop().time())
        if len(attempts) == 1:
            raise Retry

    queue: WorkQueue[str] = WorkQueue("test", reconcile, backoff=Backoff(first=5.0, cap=5.0))

    async def scenario() -> None:
        queue.add("k")
        await _until(lambda: len(attempts) == 1 and not queue.idle)
        queue.add("k")  # e.g. a node proxy connected: no need to wait the 5 s
        await _until(lambda: len(attempts) == 2)
        await _until(lambda: queue.idle)  # the 5 s retry was replaced, not kept

    _run(queue, scenario)
    assert attempts[1] - attempts[0] < 1.0


def test_retry_is_quiet_and_other_failures_are_logged(caplog) -> None:
    seen: list[str] = []

    async def reconcile(key: str) -> None:
        seen.append(key)
        if seen.count(key) == 1:
            raise Retry if key == "quiet" else RuntimeError("boom")

    queue: WorkQueue[str] = WorkQueue("things", reconcile, backoff=FAST)

    async def scenario() -> None:
        queue.add("quiet")
        queue.add("loud")
        await _until(lambda: len(seen) == 4 and queue.idle)

    with caplog.at_level(logging.WARNING, logger="meshctl.kube.workqueue"):
        _run(queue, scenario)
    lines = [r.getMessage() for r in caplog.records]
    assert lines == ["things loud: RuntimeError('boom'); retrying in 0.1s"]


def test_give_up_stops_retrying_but_keeps_the_count_for_the_next_failure() -> None:
    calls: list[str] = []
    outcome: list[type[Exception]] = [GiveUp, Retry]

    async def reconcile(key: str) -> None:
        calls.append(key)
        if outcome:
            raise outcome.pop(0)

    queue: WorkQueue[str] = WorkQueue("test", reconcile, backoff=FAST)

    async def scenario() -> None:
        queue.add("k")
        await _until(lambda: len(calls) == 1 and queue.idle)
        await asyncio.sleep(0.2)
        assert calls == ["k"]  # given up: no retry
        assert queue.failures("k") == 1
        queue.add("k")  # a new trigger: Retry now counts as the second failure in a row
        await _until(lambda: len(calls) == 3 and queue.idle)

    _run(queue, scenario)
    assert queue.failures("k") == 0


def test_forget_drops_a_gone_keys_failures_and_its_pending_retry() -> None:
    calls: list[str] = []

    async def reconcile(key: str) -> None:
        calls.append(key)
        raise Retry

    queue: WorkQueue[str] = WorkQueue("test", reconcile, backoff=Backoff(first=0.2, cap=0.2))

    async def scenario() -> None:
        queue.add("gone")
        await _until(lambda: queue.failures("gone") == 1)
        queue.forget("gone")
        assert queue.idle
        await asyncio.sleep(0.4)

    _run(queue, scenario)
    assert calls == ["gone"]


def test_shut_down_ends_run_and_takes_no_more_keys() -> None:
    calls: list[str] = []

    async def reconcile(key: str) -> None:
        calls.append(key)
        raise Retry

    async def main() -> None:
        queue: WorkQueue[str] = WorkQueue("test", reconcile, backoff=Backoff(first=0.1, cap=0.1))
        task = asyncio.ensure_future(queue.run())
        queue.add("a")
        await _until(lambda: queue.failures("a") == 1)
        queue.shut_down()
        await asyncio.wait_for(task, 1.0)
        queue.add("b")
        await asyncio.sleep(0.2)
        assert queue.idle

    asyncio.run(main())
    assert calls == ["a"]
