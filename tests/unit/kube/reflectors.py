"""A stand-in for the informers' list+watch loop: it delivers what a test tells it to, from a
thread of its own (as ``watch.Watch`` does), and records its start and stop."""

from __future__ import annotations

import threading
from typing import Any

from meshctl.kube.informer import Selector
from meshctl.kube.watch import Deliver, WatchEvent


class StandInReflector:
    """Delivers what the test tells it to, from a thread of its own (as ``Watch`` does)."""

    def __init__(self, selector: Selector, deliver: Deliver) -> None:
        self.selector = selector
        self.deliver = deliver
        self.started = self.stopped = False

    def start(self) -> None:
        self.started = True

    def stop(self, timeout: float = 5.0) -> None:
        self.stopped = True

    def send(self, kind: str, obj: dict[str, Any]) -> None:
        event = WatchEvent(kind, obj, self.selector.resource)  # type: ignore[arg-type]
        thread = threading.Thread(target=self.deliver, args=(event,))
        thread.start()
        thread.join()


class Reflectors:
    def __init__(self) -> None:
        self.made: list[StandInReflector] = []

    def __call__(self, selector: Selector, deliver: Deliver) -> StandInReflector:
        self.made.append(StandInReflector(selector, deliver))
        return self.made[-1]

    def of(self, plural: str) -> list[StandInReflector]:
        return [r for r in self.made if r.selector.resource.plural == plural]
