"""A daemon's background tasks: a failure is logged once and stays in the task, ``cancel`` stops
the rest."""

from __future__ import annotations

import asyncio
import logging

import pytest

from meshctl.tasks import Tasks


async def _fails() -> None:
    raise RuntimeError("boom")


def test_a_failed_task_is_logged_on_the_owners_logger_and_leaves_the_set(
    caplog: pytest.LogCaptureFixture,
) -> None:
    log = logging.getLogger("meshctl.test.owner")

    async def run() -> Tasks:
        tasks = Tasks(log, "connection task")
        tasks.spawn(_fails())
        tasks.spawn(_fails(), "discovery source")
        await asyncio.sleep(0)
        await asyncio.sleep(0)
        return tasks

    with caplog.at_level(logging.ERROR, logger="meshctl.test.owner"):
        tasks = asyncio.run(run())
    assert len(tasks) == 0
    failures = [(r.name, r.getMessage()) for r in caplog.records]
    assert failures == [
        ("meshctl.test.owner", "connection task failed"),
        ("meshctl.test.owner", "discovery source failed"),
    ]
    assert all(r.exc_info and str(r.exc_info[1]) == "boom" for r in caplog.records)


def test_cancel_stops_every_running_task_and_logs_nothing(
    caplog: pytest.LogCaptureFixture,
) -> None:
    async def run() -> list[bool]:
        tasks = Tasks(logging.getLogger("meshctl.test.owner"))
        running = [tasks.spawn(asyncio.sleep(60)) for _ in range(3)]
        await asyncio.sleep(0)
        tasks.cancel()
        await asyncio.wait(running, timeout=1)
        return [t.cancelled() for t in running] + [len(tasks) == 0]

    with caplog.at_level(logging.ERROR):
        assert all(asyncio.run(run()))
    assert not caplog.records
