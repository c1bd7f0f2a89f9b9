"""The node agent's Pods and Namespaces from ``--local-inventory`` instead of the API's watches.

Owns following the file: read at start (an unusable file is a ``UserError`` naming the path and
what is wrong), then re-read whenever it changes (size, mtime or inode: an editor's rename
counts), each difference delivered as the watch would deliver it (ADDED, MODIFIED, DELETED, and
one SYNCED per kind after the first read), so the agent's one reconciler serves both sources:
it is a ``PodSource`` (``apiserver.py``) like the API's informers.
Invariants: only pods of this node (``spec.nodeName``), as the watch's field selector; a bad edit
after start is logged once and ignored (the pods enrolled from the last good file stay as they
are); an object unchanged is not delivered again.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncGenerator, AsyncIterator, Mapping
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from meshctl import inputs
from meshctl.core.k8s import podlist
from meshctl.errors import UserError
from meshctl.kube.resources import NAMESPACES, PODS, Resource
from meshctl.kube.watch import WatchEvent, synced
from meshctl.structured import InputError

from .apiserver import PodEvent

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Namespace, Pod

log = logging.getLogger(__name__)

Viewed = TypeVar("Viewed", "Pod", "Namespace")

Stamp = tuple[int, int, int]
HINT = (
    "a Kubernetes v1 List (kubectl get -o yaml) of v1 Namespace and Pod objects; "
    "pods of this node have spec.nodeName set to --node-name"
)


class InventoryFile:
    """The file's current view, and the changes since the last read."""

    def __init__(self, path: Path, *, node_name: str, interval: float = 0.25) -> None:
        self.path = path
        self.name = f"local inventory {path}"
        self._node = node_name
        self._interval = interval
        self._stamp: Stamp | None = None
        self._problem = ""
        self.current = self._read(strict=True) or podlist.Inventory()

    def _read(self, *, strict: bool) -> podlist.Inventory | None:
        """The file's inventory when it changed since the last read, else None."""
        try:
            st = self.path.stat()
            stamp = (st.st_mtime_ns, st.st_size, st.st_ino)
            if stamp == self._stamp:
                return None
            limits = inputs.limits()
            data = inputs.read_bytes(self.path, str(self.path), limits)
            parsed = podlist.parse(data, str(self.path), limits)
        except OSError as exc:
            reason = getattr(exc, "strerror", None) or str(exc)
            if strict:
                raise UserError(
                    f"cannot read the local inventory {self.path}: {reason}", hint=HINT
                ) from exc
            self._warn(f"local inventory {self.path} unreadable ({reason})")
            return None
        except (podlist.InventoryError, InputError) as exc:  # bad content, or too large
            if strict:
                raise UserError(str(exc), hint=HINT) from exc
            self._stamp = stamp  # the same bad content is not parsed (or reported) again
            self._warn(f"local inventory refused: {exc}")
            return None
        self._stamp, self._problem = stamp, ""
        return parsed

    def _warn(self, problem: str) -> None:
        if problem != self._problem:
            log.warning("%s; keeping the pods and namespaces read before", problem)
            self._problem = problem

    def events(self, old: podlist.Inventory, new: podlist.Inventory) -> list[PodEvent]:
        """What a watch would have said between ``old`` and ``new`` (namespaces first, so a
        pod's decision sees its namespace's labels)."""
        namespaces = _diff(NAMESPACES, old.namespaces, new.namespaces)
        return [*namespaces, *_diff(PODS, old.pods_on(self._node), new.pods_on(self._node))]

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[AsyncIterator[PodEvent]]:
        """The first read and a SYNCED per kind, then every change (until left)."""
        events = self.follow()
        try:
            yield events
        finally:
            await events.aclose()

    async def follow(self) -> AsyncGenerator[PodEvent, None]:
        for event in self.events(podlist.Inventory(), self.current):
            yield event
        yield synced(NAMESPACES)
        yield synced(PODS)
        while True:
            await asyncio.sleep(self._interval)
            fresh = self._read(strict=False)
            if fresh is None:
                continue
            changes = self.events(self.current, fresh)
            self.current = fresh
            if changes:
                log.info("local inventory %s changed: %d objects", self.path, len(changes))
            for event in changes:
                yield event


def _diff(
    kind: Resource[Viewed], before: Mapping[str, Viewed], after: Mapping[str, Viewed]
) -> list[WatchEvent[Viewed]]:
    out: list[WatchEvent[Viewed]] = []
    for key, obj in after.items():
        if key not in before:
            out.append(WatchEvent("ADDED", obj, kind))
        elif before[key] != obj:
            out.append(WatchEvent("MODIFIED", obj, kind))
    out += [WatchEvent("DELETED", obj, kind) for key, obj in before.items() if key not in after]
    return out
