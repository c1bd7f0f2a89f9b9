"""Shared informers with a stand-in reflector (the list+watch loop itself is tested against a
real API server in tests/kube/test_watch.py): one loop and cache per resource and selector,
fan-out, late subscribers, and the loop's life following its subscribers."""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import pytest

from meshctl.kube.informer import Informers, subscribe
from meshctl.kube.resources import CONFIG_MAPS, NAMESPACES, PODS
from tests.unit.kube.reflectors import Reflectors


def ns(name: str, version: str = "1") -> dict[str, Any]:
    return {"metadata": {"name": name, "resourceVersion": version}}


async def settle() -> None:
    for _ in range(3):
        await asyncio.sleep(0)


async def take(events: Any, count: int) -> list[tuple[str, str]]:
    out = []
    async with asyncio.timeout(2):
        while len(out) < count:
            event = await anext(events)
            out.append((event.type, event.key[1]))
    return out


def scenario(body: Callable[[Informers, Reflectors], Any]) -> None:
    reflectors = Reflectors()
    asyncio.run(body(Informers(None, reflector=reflectors), reflectors))


def test_one_informer_per_resource_and_selector() -> None:
    informers = Informers(None, reflector=Reflectors())
    assert informers.informer(NAMESPACES) is informers.informer(NAMESPACES)
    assert informers.informer(PODS) is not informers.informer(PODS, field_selector="x=y")


def test_two_subscribers_share_one_watch_and_each_gets_every_event() -> None:
    async def body(informers: Informers, reflectors: Reflectors) -> None:
        namespaces = informers.informer(NAMESPACES)
        async with namespaces.subscribe() as a, namespaces.subscribe() as b:
            (reflector,) = reflectors.made
            reflector.send("ADDED", ns("one"))
            reflector.send("SYNCED", {})
            assert await take(a, 2) == [("ADDED", "one"), ("SYNCED", "")]
            assert await take(b, 2) == [("ADDED", "one"), ("SYNCED", "")]
            assert namespaces.get("one") == ns("one")
            assert namespaces.synced

    scenario(body)


def test_a_late_subscriber_gets_the_cache_first_then_the_same_events() -> None:
    async def body(informers: Informers, reflectors: Reflectors) -> None:
        namespaces = informers.informer(NAMESPACES)
        async with namespaces.subscribe() as early:
            (reflector,) = reflectors.made
            for name in ("one", "two"):
                reflector.send("ADDED", ns(name))
            reflector.send("SYNCED", {})
            reflector.send("DELETED", ns("one"))
            await take(early, 4)
            async with namespaces.subscribe() as late:
                assert await take(late, 2) == [("ADDED", "two"), ("SYNCED", "")]
                reflector.send("MODIFIED", ns("two", "2"))
                assert await take(late, 1) == [("MODIFIED", "two")]
                assert await take(early, 1) == [("MODIFIED", "two")]
            assert len(reflectors.made) == 1  # no second list+watch for the late one

    scenario(body)


def test_the_watch_stops_with_its_last_subscriber_and_its_late_events_are_dropped() -> None:
    async def body(informers: Informers, reflectors: Reflectors) -> None:
        namespaces = informers.informer(NAMESPACES)
        async with namespaces.subscribe():
            async with namespaces.subscribe():
                pass
            (first,) = reflectors.made
            assert not first.stopped  # one subscriber left
            first.send("ADDED", ns("kept"))
            await settle()
        assert first.stopped
        assert namespaces.get("kept") is None  # the cache went with the watch
        first.send("ADDED", ns("late"))  # a stopped loop's last words
        async with namespaces.subscribe() as again:
            second = reflectors.made[1]
            assert second.started
            second.send("SYNCED", {})
            assert await take(again, 1) == [("SYNCED", "")]
        assert namespaces.get("late") is None

    scenario(body)


def test_one_subscription_to_several_informers_tells_them_apart_and_batches() -> None:
    async def body(informers: Informers, reflectors: Reflectors) -> None:
        kinds = [informers.informer(NAMESPACES), informers.informer(CONFIG_MAPS)]
        async with subscribe(kinds) as events:
            namespaces, maps = reflectors.made
            namespaces.send("ADDED", ns("a"))
            maps.send("ADDED", {"metadata": {"name": "m", "namespace": "a"}})
            maps.send("SYNCED", {})
            await settle()
            batch = await events.batch()
            assert [(e.resource, e.type) for e in batch] == [
                (NAMESPACES, "ADDED"),
                (CONFIG_MAPS, "ADDED"),
                (CONFIG_MAPS, "SYNCED"),
            ]
        assert namespaces.stopped
        assert maps.stopped

    scenario(body)


def test_informers_need_a_source() -> None:
    with pytest.raises(ValueError, match="API server"):
        Informers(None)
