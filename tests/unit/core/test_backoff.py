"""The one retry policy value: growth, cap, no wait without a failure, the caller's jitter."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.backoff import Backoff


def test_the_wait_doubles_from_first_and_stops_at_the_cap() -> None:
    backoff = Backoff(first=0.5, cap=30.0)
    assert [backoff.delay(n) for n in range(1, 9)] == [0.5, 1, 2, 4, 8, 16, 30, 30]


def test_no_failure_yet_means_no_wait() -> None:
    assert Backoff(first=0.2, cap=10.0).delay(0) == 0.0


def test_a_long_outage_reaches_the_cap_without_overflowing() -> None:
    # 2.0 ** 2000 overflows a float; thousands of failures in a row happen in a long outage.
    assert Backoff(first=0.8, cap=30.0).delay(100_000) == 30.0


def test_jitter_adds_the_callers_share_of_it() -> None:
    backoff = Backoff(first=1.0, cap=4.0, jitter=1.0)
    assert backoff.delay(1, draw=0.0) == 1.0
    assert backoff.delay(1, draw=0.5) == 1.5
    assert backoff.delay(3, draw=0.25) == 5.0  # the capped 4 s, a quarter longer


def test_a_factor_of_one_waits_the_same_each_time() -> None:
    assert {Backoff(first=1.0, cap=5.0, factor=1.0).delay(n) for n in (1, 7, 10_000)} == {1.0}


@pytest.mark.parametrize(
    "fields",
    [
        {"first": -1.0, "cap": 1.0},
        {"first": 2.0, "cap": 1.0},
        {"first": 1, "cap": 2, "factor": 0.5},
    ],
)
def test_a_backoff_that_makes_no_sense_is_refused(fields) -> None:
    with pytest.raises(ValueError, match="backoff"):
        Backoff(**fields)


@given(
    first=st.floats(0.001, 10),
    extra=st.floats(0, 100),
    failures=st.integers(1, 5000),
    draw=st.floats(0, 0.999),
)
def test_the_wait_never_shrinks_with_more_failures_and_stays_within_the_cap(
    first: float, extra: float, failures: int, draw: float
) -> None:
    backoff = Backoff(first=first, cap=first + extra, jitter=0.5)
    assert backoff.delay(failures) <= backoff.delay(failures + 1) <= backoff.cap
    assert backoff.delay(failures, draw=draw) <= backoff.cap * 1.5
