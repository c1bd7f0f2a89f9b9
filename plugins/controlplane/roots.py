"""Root distribution: the ConfigMap ``meshctl-ca-root-cert`` (key ``root-cert.pem``) everywhere.

Owns, while this replica leads, making every namespace hold the mesh's trust bundle as Istio
does with ``istio-ca-root-cert``: created in a namespace as soon as the namespace watch reports
it, repaired when someone edits or deletes it (the ConfigMaps are watched too; no polling), and
rewritten everywhere when the bundle changes (a new plug-in CA). Invariants: level-triggered
(each namespace is reconciled from the watches' current view, so any event order converges);
writes are create-only or guarded by the resourceVersion read; namespaces being deleted are
left alone; only ConfigMaps of this name are ever written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Callable
from typing import Any

from meshctl.kube import objects
from meshctl.kube.client import Kube
from meshctl.kube.resources import CONFIG_MAPS, NAMESPACES
from meshctl.kube.rest import ApiStatusError
from meshctl.kube.watch import AsyncWatch, WatchEvent

from .reconcile import WorkQueue

log = logging.getLogger(__name__)

ROOT_CONFIGMAP = "meshctl-ca-root-cert"
ROOT_KEY = "root-cert.pem"
LABELS = {"app.kubernetes.io/managed-by": "meshctl", "meshctl.io/config": "true"}


class RootPublisher:
    """Reconciles ``meshctl-ca-root-cert`` in every namespace to ``bundle()``."""

    def __init__(self, kube: Kube, bundle: Callable[[], str | None]) -> None:
        self._kube = kube
        self._bundle = bundle
        self._namespaces: dict[str, dict[str, Any]] = {}
        self._maps: dict[str, dict[str, Any]] = {}
        self._queue: WorkQueue[str] | None = None
        self.synced = asyncio.Event()

    def bundle_changed(self) -> None:
        """The trust bundle changed: rewrite it everywhere (no-op when not leading)."""
        if self._queue is not None:
            for name in self._namespaces:
                self._queue.add(name)

    @property
    def idle(self) -> bool:
        return self._queue is not None and self.synced.is_set() and self._queue.idle

    async def run(self) -> None:
        queue: WorkQueue[str] = WorkQueue("root ConfigMap", self._reconcile)
        self._queue = queue
        self._namespaces.clear()
        self._maps.clear()
        self.synced.clear()
        synced = {"namespaces": False, "configmaps": False}

        def seen(kind: str) -> None:
            synced[kind] = True
            if all(synced.values()):
                self.synced.set()
                for name in self._namespaces:  # the first full view: reconcile all
                    queue.add(name)

        async def follow_namespaces() -> None:
            async with AsyncWatch(self._kube, NAMESPACES) as events:
                async for event in events:
                    self._on_namespace(event, seen)

        async def follow_maps() -> None:
            async with AsyncWatch(
                self._kube, CONFIG_MAPS, field_selector=f"metadata.name={ROOT_CONFIGMAP}"
            ) as events:
                async for event in events:
                    self._on_map(event, seen)

        try:
            await asyncio.gather(follow_namespaces(), follow_maps(), queue.run())
        finally:
            self._queue = None

    def _on_namespace(self, event: WatchEvent, seen: Callable[[str], None]) -> None:
        if event.type == "SYNCED":
            seen("namespaces")
            return
        _, name = event.key
        if event.type == "DELETED":
            self._namespaces.pop(name, None)
            return
        self._namespaces[name] = event.object
        if self.synced.is_set() and self._queue is not None:
            self._queue.add(name)

    def _on_map(self, event: WatchEvent, seen: Callable[[str], None]) -> None:
        if event.type == "SYNCED":
            seen("configmaps")
            return
        namespace, _ = event.key
        if event.type == "DELETED":
            self._maps.pop(namespace, None)
        else:
            self._maps[namespace] = event.object
        if self.synced.is_set() and self._queue is not None:
            self._queue.add(namespace)

    async def _reconcile(self, namespace: str) -> None:
        bundle = self._bundle()
        ns = self._namespaces.get(namespace)
        if bundle is None or ns is None or _terminating(ns):
            return
        current = self._maps.get(namespace)
        if current is None:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": ROOT_CONFIGMAP, "namespace": namespace, "labels": LABELS},
                "data": {ROOT_KEY: bundle},
            }
            try:
                await asyncio.to_thread(objects.create, self._kube, CONFIG_MAPS, body, namespace)
            except ApiStatusError as exc:
                if not objects.is_conflict(exc):
                    raise
            else:
                log.info("root certificate published in %s", namespace)
                return
            current = await asyncio.to_thread(
                objects.get, self._kube, CONFIG_MAPS, ROOT_CONFIGMAP, namespace
            )
            if current is None:
                raise RuntimeError(f"{ROOT_CONFIGMAP} in {namespace} came and went; again")
        labels = (current.get("metadata") or {}).get("labels") or {}
        if current.get("data") == {ROOT_KEY: bundle} and labels.items() >= LABELS.items():
            return
        repaired = dict(current)
        repaired["metadata"] = {**current["metadata"], "labels": {**labels, **LABELS}}
        repaired["data"] = {ROOT_KEY: bundle}
        repaired.pop("binaryData", None)
        await asyncio.to_thread(objects.replace, self._kube, CONFIG_MAPS, repaired, namespace)
        log.info("root certificate repaired in %s", namespace)


def _terminating(namespace: dict[str, Any]) -> bool:
    meta = namespace.get("metadata") or {}
    status = namespace.get("status") or {}
    return bool(meta.get("deletionTimestamp")) or status.get("phase") == "Terminating"
