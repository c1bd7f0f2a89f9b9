"""``meshctl top``'s frames: busiest pod first, unmeshed pods left out, and each frame's start
is the previous frame's scrape (one scrape per proxy per interval)."""

from __future__ import annotations

from typing import Any

import pytest
from meshctl_plugins.stat import collect, frames

from meshctl.core.stat import exposition as ex
from meshctl.core.stat.pods import MeshPod
from meshctl.core.stat.rows import plan

LABELS = (("reporter", "destination"),)


def pod(name: str, mode: str = "sidecar") -> MeshPod:
    return MeshPod(namespace="shop", name=name, workload=name, node="n1", mode=mode, running=True)  # type: ignore[arg-type]


def test_frames_are_busiest_first_and_each_starts_where_the_last_ended(monkeypatch):
    pods = [pod("quiet"), pod("busy"), pod("plain", mode="")]
    where = collect.Scope(namespace="shop", pods=pods, plan=plan(pods, []))
    totals = {"quiet": 0.0, "busy": 0.0}
    scrapes: list[dict[Any, Any]] = []

    def scrape(kube: Any, scope: Any, keys: Any = None) -> dict[Any, Any]:
        totals["quiet"] += 1
        totals["busy"] += 50
        at = float(len(scrapes))
        found = {
            ("shop", n): ex.Snapshot(at=at, values={(ex.TCP_OPENED, LABELS): v})
            for n, v in totals.items()
        }
        scrapes.append(found)
        return found

    monkeypatch.setattr(collect, "scope", lambda kube, namespace: where)
    monkeypatch.setattr(collect, "scrape", scrape)
    monkeypatch.setattr(frames.time, "sleep", lambda s: None)
    shown: list[list[dict[str, object]]] = []
    frames.run(None, "shop", 1.0, once=True, live=False, emit=shown.append)
    assert len(scrapes) == 2  # the start and the one frame
    [frame] = shown
    assert [r["name"] for r in frame] == ["busy", "quiet"]  # "plain" has no proxy: not listed
    assert [r["connections"] for r in frame] == [50, 1]


def test_busiest_first_orders_by_rps_then_cps_then_name():
    rows = [
        {"namespace": "a", "name": "x", "rps": None, "cps": 3.0},
        {"namespace": "a", "name": "y", "rps": 1.0, "cps": 0.0},
        {"namespace": "a", "name": "w", "rps": None, "cps": 3.0},
    ]
    assert [r["name"] for r in frames.busiest_first(rows)] == ["y", "w", "x"]


@pytest.mark.parametrize("value", [None, 0.0])
def test_rows_without_rates_sort_last(value):
    rows = [{"namespace": "a", "name": "z", "rps": value, "cps": value},
            {"namespace": "a", "name": "b", "rps": 0.5, "cps": None}]  # fmt: skip
    assert frames.busiest_first(rows)[0]["name"] == "b"
