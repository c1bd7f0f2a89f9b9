"""One store with several sources (ztunnel's local config and xDS in one state): each source's
records are kept apart, so one source's removal never drops another's record."""

from __future__ import annotations

import ipaddress

import pytest

from meshctl.core.mesh.records import Kind, Workload
from meshctl.core.mesh.store import SourcedStore, Store, Update


def _workload(name: str, ip: str) -> Workload:
    ips = (ipaddress.ip_address(ip),)
    return Workload(uid=f"c//Pod/ns/{name}", name=name, namespace="ns", workload_ips=ips)


def _put(w: Workload, version: str = "") -> Update:
    return Update(kind=Kind.WORKLOAD, key=w.uid, record=w, version=version)


def _drop(w: Workload) -> Update:
    return Update(kind=Kind.WORKLOAD, key=w.uid)


def _names(store: Store) -> list[str]:
    return sorted(w.name for w in store.workloads)


def test_records_of_both_sources_land_in_one_store() -> None:
    store = SourcedStore(("local", "xds"))
    store.replace("local", Store.build([_workload("file", "10.0.0.1")]))
    store.apply("xds", [_put(_workload("discovered", "10.0.0.2"), "v1")])
    assert _names(store.current) == ["discovered", "file"]
    assert store.current.workload_by_ip("10.0.0.1").name == "file"  # type: ignore[union-attr]
    assert store.current.version(Kind.WORKLOAD, "c//Pod/ns/discovered") == "v1"


def test_a_removal_from_one_source_leaves_the_other_sources_records() -> None:
    store = SourcedStore(("local", "xds"))
    local, remote = _workload("file", "10.0.0.1"), _workload("discovered", "10.0.0.2")
    store.replace("local", Store.build([local]))
    store.apply("xds", [_put(remote)])
    store.replace("local", Store())  # the file emptied
    assert _names(store.current) == ["discovered"]
    store.replace("local", Store.build([local]))
    store.apply("xds", [_drop(remote)])
    assert _names(store.current) == ["file"]


def test_the_first_named_source_wins_a_key_both_hold_and_the_other_takes_over_when_it_goes() -> (
    None
):
    store = SourcedStore(("local", "xds"))
    from_file, from_xds = _workload("a", "10.0.0.1"), _workload("a", "10.0.0.9")
    store.replace("local", Store.build([from_file]))
    assert store.apply("xds", [_put(from_xds, "v1")]) == []  # shadowed: nobody is told
    assert store.current.workload_by_uid(from_file.uid) == from_file
    changed = store.replace("local", Store())
    assert changed == [_put(from_xds, "v1")]
    assert store.current.workload_by_uid(from_file.uid) == from_xds
    assert store.layer("xds").workload_by_uid(from_xds.uid) == from_xds


def test_a_source_update_reaches_consumers_as_it_came_even_unchanged() -> None:
    # The xDS client's updates pass through one for one (what the data plane hears of them).
    store = SourcedStore(("xds",))
    heard: list[int] = []
    store.live.subscribe(lambda _old, _new, updates: heard.append(len(updates)))
    w = _workload("a", "10.0.0.1")
    assert store.apply("xds", [_put(w, "v1")]) == [_put(w, "v1")]
    assert store.apply("xds", [_put(w, "v1")]) == [_put(w, "v1")]
    assert heard == [1, 1]


def test_replacing_a_document_with_the_same_records_changes_nothing() -> None:
    store = SourcedStore(("local", "xds"))
    doc = Store.build([_workload("a", "10.0.0.1"), _workload("b", "10.0.0.2")])
    assert len(store.replace("local", doc)) == 2
    before = store.current
    assert store.replace("local", Store.build(doc.workloads)) == []
    assert store.current is before


def test_source_names_are_distinct() -> None:
    with pytest.raises(ValueError, match="distinct"):
        SourcedStore(("xds", "xds"))
