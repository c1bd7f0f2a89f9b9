"""How long to wait before trying again after failures in a row: one value for every retry loop.

Owns ``Backoff`` (first wait, growth factor, cap, jitter share), used by the watches, the
supervisor's restarts, the work queue and the xDS client alike. Invariants: the wait grows
from ``first`` by ``factor`` per further failure and never exceeds ``cap`` (however many
failures: no overflow after a long outage); no failure means no wait; the core draws no random
numbers: a caller that wants jitter passes its own draw in [0, 1).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True, kw_only=True)
class Backoff:
    """``first`` s after the first failure, times ``factor`` after each further one, at most
    ``cap`` s; ``jitter``: each wait may be up to that share longer (1.0: up to twice)."""

    first: float
    cap: float
    factor: float = 2.0
    jitter: float = 0.0

    def __post_init__(self) -> None:
        if self.first < 0 or self.cap < self.first:
            raise ValueError(f"a backoff needs 0 <= first <= cap, not {self.first} and {self.cap}")
        if self.factor < 1.0 or self.jitter < 0.0:
            raise ValueError(f"a backoff needs factor >= 1 and jitter >= 0 ({self})")

    def delay(self, failures: int, *, draw: float = 0.0) -> float:
        """The wait after ``failures`` failures in a row (0 or less: none yet, no wait);
        ``draw`` (the caller's random number in [0, 1)) picks the share of ``jitter`` added."""
        if failures <= 0:
            return 0.0
        wait = self.first
        steps = failures - 1 if self.factor > 1.0 else 0
        for _ in range(steps):  # stepwise: a huge count reaches the cap, never overflows
            if wait >= self.cap or wait <= 0.0:
                break
            wait *= self.factor
        return min(self.cap, wait) * (1.0 + self.jitter * draw)
