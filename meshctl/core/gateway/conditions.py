"""Status conditions (metav1.Condition) written the way the Gateway API asks: merged by type
into the previous list, with the object's current generation and stable transition times.

Owns the merge. A condition we write replaces the previous one of its type; its
``lastTransitionTime`` is the previous one's while the status (True/False/Unknown) is unchanged,
else the caller's ``now``; conditions of types we do not write are kept as they were, in their
place; one whose ``observedGeneration`` is newer than the object we read is kept untouched (our
view is stale: a later reconcile writes it). Invariant: pure; same input, same output.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True, slots=True)
class Condition:
    type: str
    status: bool
    reason: str
    message: str


def merge(
    written: Sequence[Condition],
    previous: Iterable[Mapping[str, Any]],
    *,
    generation: int,
    now: str,
) -> list[dict[str, Any]]:
    """The condition list to write: ``written`` merged into ``previous`` (see the module)."""
    ours = {c.type: c for c in written}
    out: list[dict[str, Any]] = []
    done: set[str] = set()
    for old in previous:
        kind = old.get("type")
        if not isinstance(kind, str) or kind in done:
            continue
        done.add(kind)
        out.append(_written(ours[kind], old, generation, now) if kind in ours else dict(old))
    out.extend(_written(c, None, generation, now) for c in written if c.type not in done)
    return out


def _written(
    cond: Condition, old: Mapping[str, Any] | None, generation: int, now: str
) -> dict[str, Any]:
    observed = old.get("observedGeneration") if old is not None else None
    if old is not None and isinstance(observed, int) and observed > generation:
        return dict(old)
    status = "True" if cond.status else "False"
    since = now
    if old is not None and old.get("status") == status and old.get("lastTransitionTime"):
        since = str(old["lastTransitionTime"])
    return {
        "type": cond.type,
        "status": status,
        "observedGeneration": generation,
        "lastTransitionTime": since,
        "reason": cond.reason,
        "message": cond.message,
    }
