"""``meshctl top``'s frames: per pod rows, busiest first, each over the last interval.

Each frame lists the pods again (new pods join, deleted ones leave) and reuses the previous
frame's scrape as its start, so one scrape per proxy per interval.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from meshctl.core.stat.rows import rows

from . import collect

Emit = Callable[[list[dict[str, object]]], None]


def busiest_first(found: list[dict[str, object]]) -> list[dict[str, object]]:
    def key(row: dict[str, object]) -> tuple[float, float, str, str]:
        rps, cps = row.get("rps"), row.get("cps")
        return (
            -(rps if isinstance(rps, int | float) else 0.0),
            -(cps if isinstance(cps, int | float) else 0.0),
            str(row["namespace"]),
            str(row["name"]),
        )

    return sorted(found, key=key)


def frame(
    kube: Any, namespace: str | None, before: Any, seconds: float
) -> tuple[list[dict[str, object]], Any]:
    """One frame: the pods now, scraped now, against ``before`` (the last frame's scrape)."""
    where = collect.scope(kube, namespace)
    after = collect.scrape(kube, where)
    found = rows(
        "pod", pods=where.pods, plan=where.plan, before=before, after=after, window=seconds
    )
    return busiest_first([r for r in found if r["meshedPods"]]), after


def run(
    kube: Any, namespace: str | None, interval: float, *, once: bool, live: bool, emit: Emit
) -> None:
    where = collect.scope(kube, namespace)
    before = collect.scrape(kube, where)
    last = time.monotonic()
    screen = None
    if live:
        from . import screen as screen_module

        screen = screen_module.Screen(interval)
    try:
        while True:
            time.sleep(max(0.0, interval - (time.monotonic() - last)))
            now = time.monotonic()
            found, before = frame(kube, namespace, before, now - last)
            last = now
            if screen is not None:
                screen.show(found, namespaces=namespace is None)
            else:
                emit(found)
            if once:
                return
    finally:
        if screen is not None:
            screen.close()
