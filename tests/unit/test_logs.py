"""Log setup: the text format's time stamps, and writes deferred to the end of a loop iteration."""

from __future__ import annotations

import io
import logging
import time

import pytest

from meshctl import logs


@pytest.fixture
def root_handlers():
    root = logging.getLogger()
    saved, level = list(root.handlers), root.level
    yield
    for h in list(root.handlers):
        root.removeHandler(h)
    for h in saved:
        root.addHandler(h)
    root.setLevel(level)


def test_text_time_stamps_equal_loggings_own_format():
    ours = logs.TextFormatter()
    stock = logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s")
    for created in (1_700_000_000.25, 1_700_000_000.999, 1_700_000_001.0, time.time()):
        record = logging.makeLogRecord({"msg": "m", "levelname": "INFO", "name": "x"})
        record.created, record.msecs = created, (created - int(created)) * 1000
        assert ours.format(record) == stock.format(record)


def test_deferred_writes_leave_in_one_write_per_iteration_and_warnings_at_once(root_handlers):
    class Stream(io.StringIO):
        writes = 0

        def write(self, text):
            self.writes += 1
            return super().write(text)

    stream = Stream()
    logs.configure("info", "text", stream=stream)
    soon = []
    logs.defer_writes(soon.append)
    log = logging.getLogger("t")
    for i in range(3):
        log.info("line %d", i)
    assert stream.getvalue() == ""  # held until the scheduled flush
    assert len(soon) == 1  # scheduled once for the batch
    soon.pop()()
    assert stream.getvalue().count("\n") == 3
    assert stream.writes == 1
    log.warning("now")  # a warning does not wait
    assert stream.getvalue().endswith("t: now\n")
    log.info("left over")
    for handler in logging.getLogger().handlers:  # what logging.shutdown does at exit
        handler.flush()
    assert stream.getvalue().endswith("t: left over\n")
