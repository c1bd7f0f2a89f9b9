"""What one discovery stream was sent and what its proxy answered, per type: the facts behind
``meshctl proxy-status`` (istiod's ``syncz``), sans I/O.

Owns, per type URL on one stream: the latest response sent (version, nonce, when), the latest
ACK and the latest NACK (version, nonce, the client's ``error_detail`` message, when), and the
verdict from them (``status``): ``NOT SENT`` (nothing of that type sent yet), ``SYNCED`` (the
latest response is ACKed), ``NACK`` (the latest answer refused a response, and no later one was
ACKed), ``PENDING`` (the latest response is not answered yet, for less than the threshold),
``STALE`` (not answered for longer). Invariants: pure (times are numbers the caller passes);
an answer for a nonce this book never recorded (or forgot) changes nothing; memory per stream
is bounded (``_MAX_PENDING`` unanswered nonces per type).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import StrEnum

_MAX_PENDING = 64
_MAX_ERROR = 1000  # characters of a NACK message kept (the client writes it, not us)


class SyncState(StrEnum):
    SYNCED = "SYNCED"
    PENDING = "PENDING"
    STALE = "STALE"
    NACK = "NACK"
    NOT_SENT = "NOT SENT"


# Worst first: a row's status is its worst type's.
SEVERITY = (
    SyncState.NACK,
    SyncState.STALE,
    SyncState.PENDING,
    SyncState.NOT_SENT,
    SyncState.SYNCED,
)


@dataclass(slots=True)
class TypeSync:
    """One type's latest exchange on one stream (times: the caller's clock, seconds)."""

    sent_version: str = ""
    sent_nonce: str = ""
    sent_at: float | None = None
    acked_version: str = ""
    acked_nonce: str = ""
    acked_at: float | None = None
    nacked_version: str = ""
    nacked_nonce: str = ""
    nack_error: str = ""
    nacked_at: float | None = None
    last_answer_nack: bool = False  # the most recent answer was a NACK
    pending: dict[str, str] = field(default_factory=dict)  # nonce -> version, unanswered

    def status(self, now: float, stale_after: float) -> SyncState:
        if self.sent_at is None:
            return SyncState.NOT_SENT
        if self.sent_nonce not in self.pending:  # the latest response was answered
            return SyncState.NACK if self.last_answer_nack else SyncState.SYNCED
        if self.last_answer_nack:
            return SyncState.NACK
        if now - self.sent_at > stale_after:
            return SyncState.STALE
        return SyncState.PENDING

    def facts(self, now: float, stale_after: float) -> dict[str, object]:
        """JSON-ready facts; ``*Ago``: seconds before ``now`` (None: never)."""

        def ago(at: float | None) -> float | None:
            return None if at is None else round(max(0.0, now - at), 3)

        return {
            "status": str(self.status(now, stale_after)),
            "sent": {"version": self.sent_version, "nonce": self.sent_nonce},
            "sentAgo": ago(self.sent_at),
            "acked": {"version": self.acked_version, "nonce": self.acked_nonce},
            "ackedAgo": ago(self.acked_at),
            "nacked": {
                "version": self.nacked_version,
                "nonce": self.nacked_nonce,
                "error": self.nack_error,
            },
            "nackedAgo": ago(self.nacked_at),
        }


class SyncBook:
    """One stream's per-type exchanges: ``sent`` for each response, ``answered`` for each
    ACK/NACK the stream reads."""

    __slots__ = ("_types",)

    def __init__(self) -> None:
        self._types: dict[str, TypeSync] = {}

    def subscribed(self, type_url: str) -> None:
        """A type the client asked for (shown as NOT SENT until a response leaves)."""
        self._types.setdefault(type_url, TypeSync())

    def sent(self, type_url: str, *, nonce: str, version: str, at: float) -> None:
        entry = self._types.setdefault(type_url, TypeSync())
        entry.sent_version, entry.sent_nonce, entry.sent_at = version, nonce, at
        entry.pending[nonce] = version
        while len(entry.pending) > _MAX_PENDING:
            del entry.pending[next(iter(entry.pending))]

    def answered(self, type_url: str, *, nonce: str, error: str | None, at: float) -> bool:
        """An ACK (``error`` None) or NACK of ``nonce``; False when the nonce is not one this
        book is waiting on (unknown, forgotten, or answered already)."""
        entry = self._types.get(type_url)
        if entry is None or not nonce or nonce not in entry.pending:
            return False
        version = entry.pending.pop(nonce)
        # Earlier responses the client skipped answering are settled by this later answer.
        for older in list(entry.pending):
            if int_or_zero(older) < int_or_zero(nonce):
                del entry.pending[older]
        if error is None:
            entry.acked_version, entry.acked_nonce, entry.acked_at = version, nonce, at
            entry.last_answer_nack = False
        else:
            entry.nacked_version, entry.nacked_nonce, entry.nacked_at = version, nonce, at
            entry.nack_error = error[:_MAX_ERROR]
            entry.last_answer_nack = True
        return True

    def types(self) -> dict[str, TypeSync]:
        return dict(self._types)

    def facts(self, now: float, stale_after: float) -> dict[str, dict[str, object]]:
        return {url: t.facts(now, stale_after) for url, t in self._types.items()}

    def status(self, now: float, stale_after: float) -> SyncState:
        """The worst type's verdict (NOT SENT with no type at all)."""
        return worst(t.status(now, stale_after) for t in self._types.values())


def worst(states: Iterable[str]) -> SyncState:
    """The most severe of ``states`` (``SyncState`` values or their strings)."""
    found = {SyncState(s) for s in states}
    for state in SEVERITY:
        if state in found:
            return state
    return SyncState.NOT_SENT


def int_or_zero(nonce: str) -> int:
    """Nonces are a stream's counter (``delta.DeltaStream``); anything else sorts first."""
    return int(nonce) if nonce.isdigit() else 0
