"""Root distribution: the ConfigMap ``meshctl-ca-root-cert`` (key ``root-cert.pem``) everywhere.

Owns, while this replica leads, making every namespace hold the mesh's trust bundle as Istio
does with ``istio-ca-root-cert``: created in a namespace as soon as the namespace informer
reports it, repaired when someone edits or deletes it (the ConfigMaps are watched too; no
polling), and rewritten everywhere when the bundle changes (a new plug-in CA). The Namespaces
come from the plane's shared informer (discovery's too: one watch, one cache). Invariants:
level-triggered (each namespace is reconciled from the informers' caches, so any event order
converges);
writes are create-only or guarded by the resourceVersion read; namespaces being deleted are
left alone; only ConfigMaps of this name are ever written.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator, Callable
from typing import TYPE_CHECKING, Any

from meshctl.core.k8s import layout
from meshctl.kube import objects
from meshctl.kube.client import Kube
from meshctl.kube.informer import Informers, subscribe
from meshctl.kube.resources import CONFIG_MAPS, NAMESPACES
from meshctl.kube.rest import ApiStatusError
from meshctl.kube.watch import WatchEvent
from meshctl.kube.workqueue import WorkQueue

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import KubeObject, Namespace

log = logging.getLogger(__name__)

ROOT_CONFIGMAP = layout.ROOT_CONFIGMAP
ROOT_KEY = "root-cert.pem"
LABELS = {"app.kubernetes.io/managed-by": "meshctl", "meshctl.io/config": "true"}


class RootPublisher:
    """Reconciles ``meshctl-ca-root-cert`` in every namespace to ``bundle()``."""

    def __init__(self, informers: Informers, kube: Kube, bundle: Callable[[], str | None]) -> None:
        self._kube = kube
        self._bundle = bundle
        self._namespaces = informers.informer(NAMESPACES)
        self._maps = informers.informer(
            CONFIG_MAPS, field_selector=f"metadata.name={ROOT_CONFIGMAP}"
        )
        self._queue: WorkQueue[str] | None = None
        self.synced = asyncio.Event()

    def bundle_changed(self) -> None:
        """The trust bundle changed: rewrite it everywhere (no-op when not leading)."""
        if self._queue is not None:
            for namespace in self._namespaces.objects():
                self._queue.add(_name(namespace))

    @property
    def idle(self) -> bool:
        return self._queue is not None and self.synced.is_set() and self._queue.idle

    async def run(self) -> None:
        queue: WorkQueue[str] = WorkQueue("root ConfigMap", self._reconcile)
        self._queue = queue
        self.synced.clear()
        try:
            async with subscribe([self._namespaces, self._maps]) as events:
                await asyncio.gather(self._follow(events, queue), queue.run())
        finally:
            self._queue = None

    async def _follow(self, events: AsyncIterator[WatchEvent[Any]], queue: WorkQueue[str]) -> None:
        listed: set[str] = set()
        async for event in events:
            plural = event.resource.plural if event.resource is not None else ""
            if event.type == "SYNCED":
                listed.add(plural)
                if len(listed) == 2:  # a full view (the first, or after a relist): all
                    self.synced.set()
                    for namespace in self._namespaces.objects():
                        queue.add(_name(namespace))
            elif not self.synced.is_set():
                continue  # the first full view reconciles every namespace
            elif plural == NAMESPACES.plural:
                if event.type != "DELETED":
                    queue.add(event.key[1])
            else:
                queue.add(event.key[0])  # a ConfigMap: its namespace

    async def _reconcile(self, namespace: str) -> None:
        bundle = self._bundle()
        ns = self._namespaces.get(namespace)
        if bundle is None or ns is None or _terminating(ns):
            return
        current = self._maps.get(ROOT_CONFIGMAP, namespace)
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


def _name(obj: KubeObject) -> str:
    return str(obj.get("metadata", {}).get("name") or "")


def _terminating(namespace: Namespace) -> bool:
    meta = namespace.get("metadata", {})
    status = namespace.get("status", {})
    return bool(meta.get("deletionTimestamp")) or status.get("phase") == "Terminating"
