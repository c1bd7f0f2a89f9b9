"""Shared informers: one list+watch and one cache per resource and selector in a process, their
events fanned out to every subscriber on the asyncio loop (client-go's SharedInformer, reduced).

Owns ``Informers`` (the process's set, built once at its edge and passed down: no module-level
cache), each ``Informer`` (one ``watch.Watch`` thread: resume, bookmarks, relist on 410 Gone,
backoff; and the cache of what it holds) and ``Subscription`` (the one way events reach a
consumer: ``async with informer.subscribe() as events: async for event in events``; several
informers may share one subscription). Invariants: the watch starts with the first subscriber
and stops when the last leaves (its cache is then dropped); the cache changes on the loop just
before an event is handed out, so a handler reading it sees at least what the event says; a
subscriber that joins late first gets the cache (ADDED each object, then SYNCED if the list was
complete), then the same events as everyone, in order; each subscriber has its own queue, so a
slow one holds up no other; events of a stopped watch are never delivered.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Generic, Protocol, TypeVar

from meshctl.kube.client import Kube
from meshctl.kube.resources import Resource
from meshctl.kube.watch import Deliver, Key, Watch, WatchEvent, synced

# The view an informer's objects are read as (its resource's).
Viewed = TypeVar("Viewed", bound=Mapping[str, object])

log = logging.getLogger(__name__)

_STOP_TIMEOUT = 1.0  # seconds to wait for a watch thread to end (its stream is shut under it)


@dataclass(frozen=True, slots=True)
class Selector(Generic[Viewed]):
    """What one informer lists and watches."""

    resource: Resource[Viewed]
    namespace: str | None = None
    label_selector: str | None = None
    field_selector: str | None = None


class Reflector(Protocol):
    """What an informer needs of its list+watch loop (``watch.Watch``; a test's stand-in)."""

    def start(self) -> None: ...

    def stop(self, timeout: float = ...) -> None: ...


# The loop delivers whatever its resource serves: the informer that started it knows the view.
ReflectorFactory = Callable[[Selector[Any], Deliver[Any]], Reflector]


class Informers:
    """The process's informers: ``informer(...)`` gives the one for that resource and selector."""

    def __init__(self, kube: Kube | None, *, reflector: ReflectorFactory | None = None) -> None:
        """``reflector`` builds the list+watch loop (default: a ``Watch`` on ``kube``)."""
        if reflector is None and kube is None:
            raise ValueError("informers need an API server or a reflector")
        self._kube = kube
        self._reflector = reflector or self._watch
        # Each informer is of its selector's resource's view (``informer`` keys them so).
        self._informers: dict[Selector[Any], Informer[Any]] = {}

    def informer(
        self,
        resource: Resource[Viewed],
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
    ) -> Informer[Viewed]:
        selector = Selector(resource, namespace, label_selector, field_selector)
        informer: Informer[Viewed] | None = self._informers.get(selector)
        if informer is None:
            informer = self._informers[selector] = Informer(selector, self._reflector)
        return informer

    def _watch(self, selector: Selector[Any], deliver: Deliver[Any]) -> Reflector:
        assert self._kube is not None  # noqa: S101 -- checked in __init__
        return Watch(
            self._kube,
            selector.resource,
            deliver,
            namespace=selector.namespace,
            label_selector=selector.label_selector,
            field_selector=selector.field_selector,
        )


class Informer(Generic[Viewed]):
    """One resource and selector: its cache and its subscribers (see the module's invariants)."""

    def __init__(self, selector: Selector[Viewed], reflector: ReflectorFactory) -> None:
        self.selector = selector
        self._reflector = reflector
        self._cache: dict[Key, Viewed] = {}
        self._synced = False
        self._subscribers: list[Subscription[Viewed]] = []
        self._running: Reflector | None = None
        self._generation = 0  # of the running reflector: a stopped one's late events are dropped
        self._loop: asyncio.AbstractEventLoop | None = None

    @property
    def synced(self) -> bool:
        """A complete list has been delivered since the watch started."""
        return self._synced

    def get(self, name: str, namespace: str = "") -> Viewed | None:
        return self._cache.get((namespace, name))

    def objects(self) -> list[Viewed]:
        return list(self._cache.values())

    def subscribe(self) -> Subscription[Viewed]:
        return Subscription(self)

    # -- subscribers (on the loop) ---------------------------------------------------------------

    def _attach(self, subscription: Subscription[Viewed]) -> None:
        resource = self.selector.resource
        for obj in self._cache.values():
            subscription.put(WatchEvent("ADDED", obj, resource))
        if self._synced:
            subscription.put(synced(resource))
        self._subscribers.append(subscription)
        if self._running is None:
            self._loop = asyncio.get_running_loop()
            self._generation += 1
            generation = self._generation

            def deliver(event: WatchEvent[Viewed]) -> None:  # on the watch's thread
                loop = self._loop
                if loop is not None:
                    with contextlib.suppress(RuntimeError):  # the loop closed: nobody listens
                        loop.call_soon_threadsafe(self._dispatch, generation, event)

            self._running = self._reflector(self.selector, deliver)
            self._running.start()

    async def _detach(self, subscription: Subscription[Viewed]) -> None:
        with contextlib.suppress(ValueError):
            self._subscribers.remove(subscription)
        if self._subscribers or self._running is None:
            return
        running, self._running = self._running, None
        self._generation += 1
        self._cache.clear()
        self._synced = False
        await asyncio.to_thread(running.stop, _STOP_TIMEOUT)

    def _dispatch(self, generation: int, event: WatchEvent[Viewed]) -> None:
        if generation != self._generation:
            return  # from a reflector stopped since
        if event.type == "SYNCED":
            self._synced = True
        elif event.type == "DELETED":
            self._cache.pop(event.key, None)
        else:
            self._cache[event.key] = event.object
        for subscription in self._subscribers:
            subscription.put(event)


class Subscription(Generic[Viewed]):
    """Events of one or more informers, each informer's in order, on the running loop.

    ``async with`` attaches (the first subscriber starts an informer's watch) and detaches
    (the last one stops it); iterate for one event at a time, or ``batch()`` for all waiting.
    """

    def __init__(self, *informers: Informer[Viewed]) -> None:
        self.informers = informers
        self._events: deque[WatchEvent[Viewed]] = deque()
        self._wake = asyncio.Event()
        self._open = False

    def put(self, event: WatchEvent[Viewed]) -> None:
        self._events.append(event)
        self._wake.set()

    async def __aenter__(self) -> Subscription[Viewed]:
        self._open = True
        for informer in self.informers:
            informer._attach(self)
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._open = False
        self._wake.set()
        await asyncio.gather(*(i._detach(self) for i in self.informers))

    def __aiter__(self) -> Subscription[Viewed]:
        return self

    async def __anext__(self) -> WatchEvent[Viewed]:
        while not self._events:
            if not self._open:
                raise StopAsyncIteration
            self._wake.clear()
            await self._wake.wait()
        return self._events.popleft()

    async def batch(self) -> list[WatchEvent[Viewed]]:
        """Everything waiting (at least one event: waits for it); empty once closed."""
        while not self._events and self._open:
            self._wake.clear()
            await self._wake.wait()
        events = list(self._events)
        self._events.clear()
        return events


def subscribe(informers: Iterable[Informer[Any]]) -> Subscription[Any]:
    """One subscription to several informers (each one's events in its order); events of
    several kinds, told apart by ``event.resource``."""
    return Subscription(*informers)
