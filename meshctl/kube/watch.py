"""The one list+watch loop every controller shares (client-go's reflector, reduced).

Owns keeping a local view of one kind of object in step with the API server: list (paged), then
watch from the list's resourceVersion; a watch the server ends is resumed from the last version
seen (an event's or a bookmark's), never relisted; ``410 Gone`` (the version left the server's
window) relists and turns the difference into events, as client-go's Replace does; any other
failure backs off (``WATCH_BACKOFF``: 0.8 s doubling to 30 s, jittered, reset after two quiet
minutes) and retries. Each loop runs in its own thread and hands plain-dict ``WatchEvent``s to a
callback, in order; ``meshctl.kube.informer`` shares one loop per resource and selector among
the process's consumers and delivers on the asyncio loop.

Invariants: for every object the consumer sees ADDED first, then MODIFIED, then DELETED once (a
relist never repeats an unchanged object and reports what vanished meanwhile as DELETED with its
last known state); SYNCED follows every complete (re)list, so "the view is whole" is an event, not
a guess; a consumer's exception is logged and never stops the loop; ``stop`` returns within its
timeout even while a watch is blocked reading (the stream is shut down under it).
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, Literal, TypeVar, cast

from meshctl.core.backoff import Backoff
from meshctl.errors import KubeError
from meshctl.kube import api, objects
from meshctl.kube.client import Kube
from meshctl.kube.resources import Body, Resource
from meshctl.kube.rest import ApiStatusError

log = logging.getLogger(__name__)

EventType = Literal["ADDED", "MODIFIED", "DELETED", "SYNCED"]
Key = tuple[str, str]  # (namespace or "", name)


# client-go's reflector backs off 0.8 s doubling to 30 s, jittered (up to twice as long).
WATCH_BACKOFF = Backoff(first=0.8, cap=30.0, jitter=1.0)
RESET_AFTER = 120.0  # seconds of a loop without failure that forget the earlier failures


# Covariant: an event about a Pod is an event about a Pod or a Namespace (a stream of several
# kinds, told apart by ``resource``).
_Object_co = TypeVar("_Object_co", bound=Mapping[str, object], covariant=True)


@dataclass(frozen=True, slots=True)
class WatchEvent(Generic[_Object_co]):
    """One change, or ``SYNCED`` (``object`` empty) after a complete list has been delivered;
    ``resource``: the kind it is about (what a consumer of several kinds tells them apart by)."""

    type: EventType
    object: _Object_co
    resource: Resource[_Object_co] | None = None

    @property
    def key(self) -> Key:
        return object_key(self.object)


def object_key(obj: Mapping[str, object]) -> Key:
    meta = _metadata(obj)
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def resource_version(obj: Mapping[str, object]) -> str:
    return str(_metadata(obj).get("resourceVersion") or "")


def _metadata(obj: Mapping[str, object]) -> Mapping[str, object]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, Mapping) else {}


def synced(resource: Resource[Body]) -> WatchEvent[Body]:
    """The ``SYNCED`` event of ``resource``: no object (an empty one, which every view of an
    object admits: their fields are all optional)."""
    return WatchEvent("SYNCED", cast(Body, {}), resource)


@dataclass(slots=True)
class WatchStats:
    """Counters a test or a metric can read (written by the loop's thread only)."""

    lists: int = 0
    watches: int = 0
    bookmarks: int = 0
    gone: int = 0
    errors: int = 0


class _GoneError(Exception):
    """The resourceVersion we hold is too old: relist."""


_Viewed = TypeVar("_Viewed", bound=Mapping[str, object])
Deliver = Callable[[WatchEvent[_Viewed]], None]


class Watch(Generic[_Viewed]):
    """A list+watch loop over one resource in a thread of its own; ``deliver`` gets each event.

    ``resource_version`` and ``held`` resume from a version already held instead of listing
    first: events from there on, and a relist (after 410) reports the difference from ``held``.
    ``draw`` is the random source of the backoff's jitter (spreading, not secrecy).
    """

    def __init__(
        self,
        kube: Kube,
        resource: Resource[_Viewed],
        deliver: Deliver[_Viewed],
        *,
        namespace: str | None = None,
        label_selector: str | None = None,
        field_selector: str | None = None,
        resource_version: str | None = None,
        held: Sequence[_Viewed] = (),
        timeout_seconds: int | None = None,
        backoff: Backoff = WATCH_BACKOFF,
        reset_after: float = RESET_AFTER,
        draw: Callable[[], float] = random.random,
    ) -> None:
        self._kube = kube
        self._resource = resource
        self._deliver = deliver
        self._namespace = namespace
        self._label_selector = label_selector
        self._field_selector = field_selector
        self._version = resource_version or ""
        # client-go: a random 5-10 minutes, so that watchers do not all reconnect at once.
        self._timeout = timeout_seconds or random.randint(300, 600)  # noqa: S311
        self._backoff = backoff
        self._reset_after = reset_after
        self._draw = draw
        self._known: dict[Key, _Viewed] = {object_key(o): o for o in held}
        self._stopping = threading.Event()
        self._stream: api.Stream | None = None
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self.synced = threading.Event()
        self.stats = WatchStats()
        where = f" in {namespace}" if namespace else ""
        selectors = ",".join(s for s in (label_selector, field_selector) if s)
        self.name = f"{resource.plural}{where}" + (f" ({selectors})" if selectors else "")

    @property
    def version(self) -> str:
        """The last resourceVersion seen (list, event or bookmark)."""
        return self._version

    def start(self) -> None:
        if self._thread is not None:
            raise RuntimeError("a Watch starts once")
        self._thread = threading.Thread(target=self._run, name=f"watch {self.name}", daemon=True)
        self._thread.start()

    def stop(self, timeout: float = 5.0) -> None:
        """End the loop: interrupt the open stream and wait for the thread (up to ``timeout``)."""
        self._stopping.set()
        with self._lock:
            stream = self._stream
        if stream is not None:
            with contextlib.suppress(Exception):  # best effort: the thread may be closing it
                stream.shutdown()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def snapshot(self) -> list[_Viewed]:
        """The objects the loop holds now (a copy; safe from any thread)."""
        with self._lock:
            return list(self._known.values())

    # -- the loop (its own thread) -------------------------------------------------------------

    def _run(self) -> None:
        failures = 0
        need_list = not self._version
        while not self._stopping.is_set():
            started = time.monotonic()
            try:
                if need_list:
                    self._relist()
                    need_list = False
                self._watch_once()
                if time.monotonic() - started >= 1.0:
                    failures = 0
                    continue
                # Ended at once without an error (a proxy closing streams): do not spin.
            except _GoneError:
                self.stats.gone += 1
                log.info(
                    "watch %s: resourceVersion %s expired; relisting", self.name, self._version
                )
                need_list = True
                if time.monotonic() - started > 1.0:
                    continue  # a watch that ran a while: relist at once
            except KubeError as exc:
                self.stats.errors += 1
                if self._stopping.is_set():
                    break
                log.warning("watch %s: %s", self.name, exc.message)
            except Exception:  # never let the loop die: a view that stops updating is silent
                self.stats.errors += 1
                if self._stopping.is_set():
                    break
                log.exception("watch %s: unexpected failure; retrying", self.name)
            if time.monotonic() - started > self._reset_after:
                failures = 0
            failures += 1
            self._stopping.wait(self._backoff.delay(failures, draw=self._draw()))

    def _relist(self) -> None:
        items, version = objects.list_objects(
            self._kube,
            self._resource,
            self._namespace,
            label_selector=self._label_selector,
            field_selector=self._field_selector,
        )
        self.stats.lists += 1
        fresh = {object_key(o): o for o in items}
        with self._lock:
            old = self._known
            self._known = dict(fresh)
        self._version = version
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                self._emit("ADDED", obj)
            elif resource_version(before) != resource_version(obj):
                self._emit("MODIFIED", obj)
        for key, obj in old.items():
            if key not in fresh:
                self._emit("DELETED", obj)
        self.synced.set()
        self._deliver_event(synced(self._resource))

    def _watch_once(self) -> None:
        query = [
            ("watch", "1"),
            ("resourceVersion", self._version),
            ("allowWatchBookmarks", "true"),
            ("timeoutSeconds", str(self._timeout)),
        ]
        if self._label_selector:
            query.append(("labelSelector", self._label_selector))
        if self._field_selector:
            query.append(("fieldSelector", self._field_selector))
        try:
            stream = api.open_stream(
                self._kube,
                self._resource.path(self._namespace),
                query=query,
                read_timeout=self._timeout + 60.0,
            )
        except ApiStatusError as exc:
            if exc.status == 410:
                raise _GoneError from exc
            raise
        with self._lock:
            self._stream = stream
        if self._stopping.is_set():  # stop() ran before the stream was visible to it
            stream.shutdown()
        self.stats.watches += 1
        try:
            for event in stream.events():
                self._apply(event)
        finally:
            with self._lock:
                self._stream = None
            stream.close()

    def _apply(self, event: Mapping[str, object]) -> None:
        kind = event.get("type")
        raw = event.get("object")
        if not isinstance(raw, dict):
            raise ApiStatusError(f"watch {self.name}: an event without an object", status=200)
        obj = cast(_Viewed, raw)  # as the API serves this resource (an ERROR: a Status)
        if kind == "ERROR":
            code = int(raw.get("code") or 0)
            if code == 410:
                raise _GoneError
            raise ApiStatusError(
                f"watch {self.name}: {raw.get('message') or 'error event'}",
                status=code,
                reason=str(raw.get("reason") or ""),
            )
        version = resource_version(obj)
        if kind == "BOOKMARK":
            self.stats.bookmarks += 1
            self._version = version or self._version
            return
        if kind not in ("ADDED", "MODIFIED", "DELETED"):
            log.debug("watch %s: ignoring event type %r", self.name, kind)
            return
        key = object_key(obj)
        with self._lock:
            known = key in self._known
            if kind == "DELETED":
                self._known.pop(key, None)
            else:
                self._known[key] = obj
        self._version = version or self._version
        if kind == "DELETED":
            if known:
                self._emit("DELETED", obj)
        else:
            self._emit("MODIFIED" if known else "ADDED", obj)

    def _emit(self, kind: EventType, obj: _Viewed) -> None:
        self._deliver_event(WatchEvent(kind, obj, self._resource))

    def _deliver_event(self, event: WatchEvent[_Viewed]) -> None:
        if self._stopping.is_set():
            return
        try:
            self._deliver(event)
        except Exception:  # a consumer's bug must not end the watch
            log.exception("watch %s: the consumer failed on a %s event", self.name, event.type)
