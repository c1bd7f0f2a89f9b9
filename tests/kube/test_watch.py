"""The shared list+watch loop and its informers against the real kube-apiserver: events, resume,
410, stop, errors, fan-out."""

from __future__ import annotations

import asyncio
import queue
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from meshctl.core.backoff import Backoff
from meshctl.kube import objects
from meshctl.kube.client import Kube, KubeSettings, connect
from meshctl.kube.informer import Informers
from meshctl.kube.resources import CONFIG_MAPS, NAMESPACES, Resource
from meshctl.kube.watch import Watch, WatchEvent
from tests.harness.kube import KubeCluster, compact_etcd, free_port

pytestmark = pytest.mark.kube

EVENTS = Resource("", "v1", "events", "Event")


@pytest.fixture
def kube(kube_cluster: KubeCluster) -> Iterator[Kube]:
    client = connect(KubeSettings(kubeconfig=str(kube_cluster.kubeconfig)))
    try:
        yield client
    finally:
        client.api.close()


class Collector:
    """Events as (type, name, data value) tuples, and a way to wait for the next ones."""

    def __init__(self) -> None:
        self.events: queue.Queue[WatchEvent] = queue.Queue()

    def __call__(self, event: WatchEvent) -> None:
        self.events.put(event)

    def take(self, count: int, timeout: float = 15.0) -> list[tuple[str, str, str]]:
        out = []
        deadline = time.monotonic() + timeout
        while len(out) < count:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"got {out}, wanted {count} events")
            event = self.events.get(timeout=left)
            out.append(describe(event))
        return out

    def quiet(self, seconds: float) -> list[tuple[str, str, str]]:
        """Whatever else arrives within ``seconds`` (expected: nothing)."""
        time.sleep(seconds)
        out = []
        while not self.events.empty():
            out.append(describe(self.events.get()))
        return out


def describe(event: WatchEvent) -> tuple[str, str, str]:
    if event.type == "SYNCED":
        return ("SYNCED", "", "")
    data = event.object.get("data") or {}
    return (event.type, event.object["metadata"]["name"], str(data.get("v", "")))


def configmap(name: str, value: str, labels: dict[str, str] | None = None) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": name, "labels": labels or {"watched": "yes"}},
        "data": {"v": value},
    }


def test_lists_then_delivers_added_modified_deleted_in_order_with_selectors(
    kube: Kube, kube_namespace: str
) -> None:
    objects.create(kube, CONFIG_MAPS, configmap("before", "0"), kube_namespace)
    objects.create(kube, CONFIG_MAPS, configmap("other", "0", {"watched": "no"}), kube_namespace)
    got = Collector()
    watch = Watch(kube, CONFIG_MAPS, got, namespace=kube_namespace, label_selector="watched=yes")
    watch.start()
    try:
        assert got.take(2) == [("ADDED", "before", "0"), ("SYNCED", "", "")]
        assert watch.synced.is_set()
        objects.create(kube, CONFIG_MAPS, configmap("new", "1"), kube_namespace)
        objects.patch(kube, CONFIG_MAPS, "new", {"data": {"v": "2"}}, kube_namespace)
        objects.patch(kube, CONFIG_MAPS, "other", {"data": {"v": "3"}}, kube_namespace)
        objects.delete(kube, CONFIG_MAPS, "before", kube_namespace)
        assert got.take(3) == [
            ("ADDED", "new", "1"),
            ("MODIFIED", "new", "2"),
            ("DELETED", "before", "0"),
        ]
        assert got.quiet(0.5) == [], "the selector must keep 'other' out"
        assert {o["metadata"]["name"] for o in watch.snapshot()} == {"new"}
        assert all(o["kind"] == "ConfigMap" for o in watch.snapshot())
    finally:
        watch.stop()
    assert watch.stats.lists == 1


def test_a_watch_the_server_ends_resumes_from_the_last_version_without_relisting(
    kube: Kube, kube_namespace: str
) -> None:
    got = Collector()
    watch = Watch(kube, CONFIG_MAPS, got, namespace=kube_namespace, timeout_seconds=1)
    watch.start()
    try:
        assert got.take(1) == [("SYNCED", "", "")]
        for i in range(6):
            objects.create(kube, CONFIG_MAPS, configmap(f"cm{i}", str(i)), kube_namespace)
            time.sleep(0.4)  # spread over several one-second watches
        assert got.take(6) == [("ADDED", f"cm{i}", str(i)) for i in range(6)]
        assert got.quiet(1.5) == [], "a resumed watch must not replay what was delivered"
    finally:
        watch.stop()
    assert watch.stats.watches >= 3
    assert watch.stats.lists == 1
    assert watch.stats.gone == 0


def event(name: str, namespace: str, message: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"name": name},
        "involvedObject": {"kind": "Pod", "name": "p", "namespace": namespace},
        "reason": "Test",
        "message": message,
        "type": "Normal",
    }


def test_an_expired_resource_version_relists_and_reports_the_difference(
    kube: Kube, kube_cluster: KubeCluster, kube_namespace: str
) -> None:
    # Events have no watch cache: a watch from a compacted version reaches etcd and ends with
    # an ERROR event carrying 410, exactly what a watcher that fell behind gets.
    objects.create(kube, EVENTS, event("kept", kube_namespace, "k"), kube_namespace)
    objects.create(kube, EVENTS, event("going", kube_namespace, "g"), kube_namespace)
    _, held = objects.list_objects(kube, EVENTS, kube_namespace)
    got = Collector()
    watch = Watch(kube, EVENTS, got, namespace=kube_namespace)
    watch.start()
    try:
        assert sorted(got.take(3)) == [
            ("ADDED", "going", ""),
            ("ADDED", "kept", ""),
            ("SYNCED", "", ""),
        ]
    finally:
        watch.stop()
    # While nobody watches: one changes, one goes, one comes; then history is compacted.
    objects.patch(kube, EVENTS, "kept", {"message": "k2"}, kube_namespace)
    objects.delete(kube, EVENTS, "going", kube_namespace)
    objects.create(kube, EVENTS, event("new", kube_namespace, "n"), kube_namespace)
    _, now = objects.list_objects(kube, EVENTS, kube_namespace)
    compact_etcd(kube_cluster, now)

    later = Collector()
    # Resumed from what the first loop held: the relist must turn the difference into events.
    resumed = Watch(
        kube,
        EVENTS,
        later,
        namespace=kube_namespace,
        resource_version=held,
        held=watch.snapshot(),
    )
    resumed.start()
    try:
        changes = later.take(4)
    finally:
        resumed.stop()
    assert changes[-1] == ("SYNCED", "", "")
    assert sorted(changes[:-1]) == [
        ("ADDED", "new", ""),
        ("DELETED", "going", ""),
        ("MODIFIED", "kept", ""),
    ]
    assert resumed.stats.gone == 1
    assert resumed.stats.lists == 1


def test_stop_interrupts_a_blocked_watch_promptly(kube: Kube, kube_namespace: str) -> None:
    got = Collector()
    watch = Watch(kube, CONFIG_MAPS, got, namespace=kube_namespace, timeout_seconds=600)
    watch.start()
    assert got.take(1) == [("SYNCED", "", "")]
    time.sleep(0.3)  # now blocked reading a stream that would stay open ten minutes
    started = time.monotonic()
    watch.stop(timeout=5)
    assert time.monotonic() - started < 2.0
    assert not any(t.name.startswith("watch configmaps") for t in threading.enumerate())


def test_an_unreachable_server_is_retried_with_backoff_until_stopped(
    kube_cluster: KubeCluster,
) -> None:
    base = connect(KubeSettings(kubeconfig=str(kube_cluster.kubeconfig)))
    base.api.configuration.host = f"https://127.0.0.1:{free_port()}"  # nothing listens there
    got = Collector()
    watch = Watch(base, NAMESPACES, got, backoff=Backoff(first=0.2, cap=0.4))
    watch.start()
    time.sleep(1.5)
    watch.stop()
    base.api.close()
    # 0.2 + 0.4 + 0.4 + ... within 1.5 s: a handful of attempts, never a tight loop.
    assert 2 <= watch.stats.errors <= 6
    assert got.quiet(0) == []
    assert not watch.synced.is_set()


def test_a_consumer_that_raises_does_not_stop_the_loop(kube: Kube, kube_namespace: str) -> None:
    seen: list[str] = []

    def fragile(event: WatchEvent) -> None:
        seen.append(describe(event)[1])
        if event.type == "ADDED":
            raise RuntimeError("consumer bug")

    watch = Watch(kube, CONFIG_MAPS, fragile, namespace=kube_namespace)
    watch.start()
    try:
        watch.synced.wait(10)
        objects.create(kube, CONFIG_MAPS, configmap("a", "1"), kube_namespace)
        objects.create(kube, CONFIG_MAPS, configmap("b", "1"), kube_namespace)
        deadline = time.monotonic() + 10
        while seen.count("b") < 1 and time.monotonic() < deadline:
            time.sleep(0.05)
    finally:
        watch.stop()
    assert seen == ["", "a", "b"]


def test_a_shared_informer_delivers_on_the_loop_to_each_subscriber_and_stops_with_the_last(
    kube: Kube, kube_namespace: str
) -> None:
    async def scenario() -> tuple[list[tuple[str, str, str]], list[tuple[str, str, str]]]:
        informer = Informers(kube).informer(CONFIG_MAPS, namespace=kube_namespace)
        first: list[tuple[str, str, str]] = []
        async with informer.subscribe() as events:
            async for event in events:
                first.append(describe(event))
                if event.type == "SYNCED":
                    await asyncio.to_thread(
                        objects.create, kube, CONFIG_MAPS, configmap("x", "9"), kube_namespace
                    )
                elif event.type == "ADDED":
                    break
            assert informer.get("x", kube_namespace) is not None
            # A second subscriber shares the watch: the cache first, then what comes.
            async with informer.subscribe() as late:
                second = [describe(await anext(late)) for _ in range(2)]
            watching = [t for t in threading.enumerate() if t.name.startswith("watch configmaps")]
            assert len(watching) == 1
        return first, second

    first, second = asyncio.run(asyncio.wait_for(scenario(), 20))
    assert first == [("SYNCED", "", ""), ("ADDED", "x", "9")]
    assert second == [("ADDED", "x", "9"), ("SYNCED", "", "")]
    assert not any(t.name.startswith("watch configmaps") for t in threading.enumerate())


def test_cluster_scoped_watch_sees_a_new_namespace(
    kube: Kube, kube_api: k8s.ApiClient, kube_namespace: str
) -> None:
    got = Collector()
    watch = Watch(kube, NAMESPACES, got, field_selector=f"metadata.name={kube_namespace}-x")
    watch.start()
    try:
        assert got.take(1) == [("SYNCED", "", "")]
        k8s.CoreV1Api(kube_api).create_namespace({"metadata": {"name": f"{kube_namespace}-x"}})
        try:
            assert got.take(1) == [("ADDED", f"{kube_namespace}-x", "")]
        finally:
            k8s.CoreV1Api(kube_api).delete_namespace(f"{kube_namespace}-x")
    finally:
        watch.stop()
