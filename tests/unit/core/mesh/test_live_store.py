"""The store its source owns: readers see the current snapshot and hear of each change."""

from __future__ import annotations

import ipaddress

from meshctl.core.mesh.records import Kind, Workload
from meshctl.core.mesh.store import LiveStore, Store, Update


def _workload(name: str, ip: str) -> Update:
    ips = (ipaddress.ip_address(ip),)
    record = Workload(uid=f"c//Pod/ns/{name}", name=name, namespace="ns", workload_ips=ips)
    return Update(kind=Kind.WORKLOAD, key=record.uid, record=record)


def test_readers_hear_each_change_with_both_snapshots_after_current_moved_on() -> None:
    live = LiveStore()
    heard: list[tuple[Store, Store, int]] = []
    live.subscribe(lambda old, new, updates: heard.append((old, new, len(updates))))
    first = live.current
    live.apply([_workload("a", "10.0.0.1")])
    assert heard == [(first, live.current, 1)]
    assert live.current.workload_by_ip("10.0.0.1") is not None
    assert first.workload_by_ip("10.0.0.1") is None  # a snapshot a reader held never changes


def test_no_updates_no_new_snapshot_and_nobody_is_told() -> None:
    live = LiveStore()
    heard: list[object] = []
    live.subscribe(lambda *change: heard.append(change))
    before = live.current
    assert live.apply([]) is before
    assert heard == []
