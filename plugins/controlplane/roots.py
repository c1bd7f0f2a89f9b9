"""Root distribution: the ConfigMap ``meshctl-ca-root-cert`` (key ``root-cert.pem``) everywhere,
and under each alias name asked for (Istio's ``istio-ca-root-cert``, for Istio's ztunnel chart).

Owns, while this replica leads, making every namespace hold the mesh's trust bundle as Istio
does with ``istio-ca-root-cert``: created in a namespace as soon as the namespace informer
reports it, repaired when someone edits or deletes it (the ConfigMaps are watched too; no
polling), and rewritten everywhere when the bundle changes (a new plug-in CA). The Namespaces
come from the plane's shared informer (discovery's too: one watch, one cache). Invariants:
level-triggered (each namespace is reconciled from the informers' caches, so any event order
converges);
writes are create-only or guarded by the resourceVersion read; namespaces being deleted are
left alone; only ConfigMaps of the names given are ever written.
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
    """Reconciles ``meshctl-ca-root-cert`` (and each of ``names``) in every namespace to
    ``bundle()``."""

    def __init__(
        self,
        informers: Informers,
        kube: Kube,
        bundle: Callable[[], str | None],
        *,
        names: tuple[str, ...] = (ROOT_CONFIGMAP,),
    ) -> None:
        self._kube = kube
        self._bundle = bundle
        self._namespaces = informers.informer(NAMESPACES)
        # One watch per name: a field selector names one object name.
        self._maps = {
            name: informers.informer(CONFIG_MAPS, field_selector=f"metadata.name={name}")
            for name in dict.fromkeys(names)
        }
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
            async with subscribe([self._namespaces, *self._maps.values()]) as events:
                await asyncio.gather(self._follow(events, queue), queue.run())
        finally:
            self._queue = None

    async def _follow(self, events: AsyncIterator[WatchEvent[Any]], queue: WorkQueue[str]) -> None:
        async for event in events:
            plural = event.resource.plural if event.resource is not None else ""
            if event.type == "SYNCED":
                # A full view (the first, or after a relist) once every informer has listed.
                maps_synced = all(i.synced for i in self._maps.values())
                if self._namespaces.synced and maps_synced:
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
        for name, informer in self._maps.items():
            await self._publish(name, informer.get(name, namespace), namespace, bundle)

    async def _publish(
        self, name: str, current: dict[str, Any] | None, namespace: str, bundle: str
    ) -> None:
        if current is None:
            body = {
                "apiVersion": "v1",
                "kind": "ConfigMap",
                "metadata": {"name": name, "namespace": namespace, "labels": LABELS},
                "data": {ROOT_KEY: bundle},
            }
            try:
                await asyncio.to_thread(objects.create, self._kube, CONFIG_MAPS, body, namespace)
            except ApiStatusError as exc:
                if not objects.is_conflict(exc):
                    raise
            else:
                log.info("root certificate published in %s (%s)", namespace, name)
                return
            current = await asyncio.to_thread(objects.get, self._kube, CONFIG_MAPS, name, namespace)
            if current is None:
                raise RuntimeError(f"{name} in {namespace} came and went; again")
        labels = (current.get("metadata") or {}).get("labels") or {}
        if current.get("data") == {ROOT_KEY: bundle} and labels.items() >= LABELS.items():
            return
        repaired = dict(current)
        repaired["metadata"] = {**current["metadata"], "labels": {**labels, **LABELS}}
        repaired["data"] = {ROOT_KEY: bundle}
        repaired.pop("binaryData", None)
        await asyncio.to_thread(objects.replace, self._kube, CONFIG_MAPS, repaired, namespace)
        log.info("root certificate repaired in %s (%s)", namespace, name)


def _name(obj: KubeObject) -> str:
    return str(obj.get("metadata", {}).get("name") or "")


def _terminating(namespace: Namespace) -> bool:
    meta = namespace.get("metadata", {})
    status = namespace.get("status", {})
    return bool(meta.get("deletionTimestamp")) or status.get("phase") == "Terminating"
