from __future__ import annotations

from meshctl.core.gateway.conditions import Condition, merge

NOW = "2026-12-02T10:00:00Z"
EARLIER = "2026-12-01T09:00:00Z"


def _old(kind, status, *, generation=1, reason="Old"):
    return {
        "type": kind,
        "status": status,
        "observedGeneration": generation,
        "lastTransitionTime": EARLIER,
        "reason": reason,
        "message": "old",
    }


def test_unchanged_status_keeps_its_transition_time_but_takes_the_new_generation():
    [cond] = merge(
        [Condition("Accepted", True, "Accepted", "ok")],
        [_old("Accepted", "True")],
        generation=4,
        now=NOW,
    )
    assert cond["lastTransitionTime"] == EARLIER
    assert cond["observedGeneration"] == 4
    assert (cond["reason"], cond["message"]) == ("Accepted", "ok")


def test_changed_status_takes_the_time_now():
    [cond] = merge(
        [Condition("Accepted", False, "NoMatchingParent", "no")],
        [_old("Accepted", "True")],
        generation=2,
        now=NOW,
    )
    assert cond["lastTransitionTime"] == NOW
    assert cond["status"] == "False"


def test_foreign_conditions_stay_in_place_and_new_ones_append():
    previous = [_old("example.io/Custom", "True"), _old("Accepted", "True")]
    out = merge(
        [Condition("Accepted", True, "Accepted", "ok"), Condition("Programmed", True, "P", "p")],
        previous,
        generation=1,
        now=NOW,
    )
    assert [c["type"] for c in out] == ["example.io/Custom", "Accepted", "Programmed"]
    assert out[0] == previous[0]


def test_a_condition_from_a_newer_generation_is_left_alone():
    newer = _old("Accepted", "False", generation=9)
    [cond] = merge([Condition("Accepted", True, "Accepted", "ok")], [newer], generation=3, now=NOW)
    assert cond == newer
