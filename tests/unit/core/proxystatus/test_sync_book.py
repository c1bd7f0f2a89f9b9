"""The per-stream sync bookkeeping behind proxy-status: send / ACK / NACK / stale transitions."""

from __future__ import annotations

from meshctl.core.xds.syncstatus import SyncBook, SyncState, worst

T = "type.googleapis.com/istio.workload.Address"
STALE = 10.0


def test_a_subscribed_type_with_nothing_sent_is_not_sent():
    book = SyncBook()
    book.subscribed(T)
    assert book.types()[T].status(now=100.0, stale_after=STALE) is SyncState.NOT_SENT
    assert book.status(100.0, STALE) is SyncState.NOT_SENT


def test_sent_is_pending_until_the_threshold_then_stale_and_an_ack_makes_it_synced():
    book = SyncBook()
    book.sent(T, nonce="1", version="7", at=100.0)
    entry = book.types()[T]
    assert entry.status(105.0, STALE) is SyncState.PENDING
    assert entry.status(110.5, STALE) is SyncState.STALE
    assert book.answered(T, nonce="1", error=None, at=111.0)
    assert entry.status(500.0, STALE) is SyncState.SYNCED
    facts = entry.facts(120.0, STALE)
    assert facts["acked"] == {"version": "7", "nonce": "1"}
    assert facts["ackedAgo"] == 9.0


def test_a_nack_shows_its_message_and_stays_nack_until_a_later_response_is_acked():
    book = SyncBook()
    book.sent(T, nonce="1", version="7", at=100.0)
    book.answered(T, nonce="1", error="a: bad address", at=101.0)
    entry = book.types()[T]
    assert entry.status(102.0, STALE) is SyncState.NACK
    assert entry.facts(102.0, STALE)["nacked"] == {
        "version": "7",
        "nonce": "1",
        "error": "a: bad address",
    }
    # A newer response, not answered yet: still NACK (the refusal is the latest word).
    book.sent(T, nonce="2", version="8", at=103.0)
    assert entry.status(104.0, STALE) is SyncState.NACK
    book.answered(T, nonce="2", error=None, at=105.0)
    assert entry.status(106.0, STALE) is SyncState.SYNCED


def test_an_unknown_or_repeated_nonce_changes_nothing():
    book = SyncBook()
    book.sent(T, nonce="3", version="1", at=0.0)
    assert not book.answered(T, nonce="99", error="x", at=1.0)
    assert not book.answered("other", nonce="3", error=None, at=1.0)
    assert book.answered(T, nonce="3", error=None, at=1.0)
    assert not book.answered(T, nonce="3", error="late nack", at=2.0)
    assert book.types()[T].status(3.0, STALE) is SyncState.SYNCED


def test_a_later_answer_settles_earlier_unanswered_responses():
    book = SyncBook()
    for nonce in ("1", "2", "3"):
        book.sent(T, nonce=nonce, version=nonce, at=0.0)
    book.answered(T, nonce="3", error=None, at=1.0)
    assert book.types()[T].pending == {}


def test_unanswered_nonces_are_bounded():
    book = SyncBook()
    for n in range(1, 500):
        book.sent(T, nonce=str(n), version=str(n), at=float(n))
    assert len(book.types()[T].pending) <= 64


def test_the_row_status_is_the_worst_type():
    book = SyncBook()
    book.sent(T, nonce="1", version="1", at=0.0)
    book.answered(T, nonce="1", error=None, at=0.5)
    book.sent("B", nonce="1", version="1", at=0.0)
    assert book.status(1.0, STALE) is SyncState.PENDING
    assert book.status(20.0, STALE) is SyncState.STALE
    book.answered("B", nonce="1", error="no", at=21.0)
    assert book.status(22.0, STALE) is SyncState.NACK
    assert worst(["SYNCED", "NOT SENT"]) is SyncState.NOT_SENT
