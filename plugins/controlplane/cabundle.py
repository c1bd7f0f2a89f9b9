"""The injection webhook's ``caBundle``, kept equal to the mesh's roots by the leader.

Owns, while this replica leads, patching ``clientConfig.caBundle`` of every webhook in the
configuration ``meshctl-sidecar-injector[-<rev>]`` (installed by the manifest with an empty
bundle) to the trust bundle that verifies the control plane's serving certificate, and patching
it again whenever someone changes it or the bundle changes. Invariants: level-triggered from the
watched object; a JSON patch that tests the resourceVersion read, so a concurrent edit is never
overwritten blindly (the next event brings it back here); only ``caBundle`` fields are touched;
a configuration that does not exist is waited for, never created.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict, cast

from meshctl.kube import objects
from meshctl.kube.client import Kube
from meshctl.kube.informer import Informers
from meshctl.kube.resources import MUTATING_WEBHOOK_CONFIGURATIONS
from meshctl.kube.workqueue import WorkQueue

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import MutatingWebhookConfiguration

log = logging.getLogger(__name__)


class PatchOperation(TypedDict):
    """One RFC 6902 operation."""

    op: str
    path: str
    value: object


def bundle_patch(
    configuration: MutatingWebhookConfiguration, bundle_pem: str
) -> list[PatchOperation]:
    """RFC 6902 operations that set every webhook's caBundle (empty when all are right)."""
    wanted = base64.b64encode(bundle_pem.encode()).decode()
    ops: list[PatchOperation] = []
    for index, hook in enumerate(configuration.get("webhooks") or ()):
        client = hook.get("clientConfig") or {}
        if client.get("caBundle") == wanted:
            continue
        path = f"/webhooks/{index}/clientConfig/caBundle"
        ops.append(
            {"op": "replace" if "caBundle" in client else "add", "path": path, "value": wanted}
        )
    if not ops:
        return []
    version = configuration.get("metadata", {}).get("resourceVersion")
    return [{"op": "test", "path": "/metadata/resourceVersion", "value": version}, *ops]


class CaBundlePatcher:
    """Reconciles the named MutatingWebhookConfiguration's caBundles to ``bundle()``."""

    def __init__(
        self, informers: Informers, kube: Kube, name: str, bundle: Callable[[], str | None]
    ) -> None:
        self._kube = kube
        self.name = name
        self._bundle = bundle
        self._configuration = informers.informer(
            MUTATING_WEBHOOK_CONFIGURATIONS, field_selector=f"metadata.name={name}"
        )
        self._queue: WorkQueue[str] | None = None

    def bundle_changed(self) -> None:
        if self._queue is not None:
            self._queue.add(self.name)

    async def run(self) -> None:
        queue: WorkQueue[str] = WorkQueue("webhook caBundle", self._reconcile)
        self._queue = queue

        async def follow() -> None:
            async with self._configuration.subscribe() as events:
                async for event in events:
                    if event.type == "SYNCED" and self._current() is None:
                        log.info("waiting for MutatingWebhookConfiguration %s to exist", self.name)
                    queue.add(self.name)

        try:
            await asyncio.gather(follow(), queue.run(workers=1))
        finally:
            self._queue = None

    def _current(self) -> MutatingWebhookConfiguration | None:
        # The informer's objects are plain dicts (install reads them too): viewed as served.
        return cast("MutatingWebhookConfiguration | None", self._configuration.get(self.name))

    async def _reconcile(self, _name: str) -> None:
        bundle = self._bundle()
        current = self._current()
        if bundle is None or current is None:
            return
        ops = bundle_patch(current, bundle)
        if not ops:
            return
        await asyncio.to_thread(
            objects.patch,
            self._kube,
            MUTATING_WEBHOOK_CONFIGURATIONS,
            self.name,
            ops,
            patch_type="json",
        )
        log.info("caBundle of %s set to the mesh roots (%d webhooks)", self.name, len(ops) - 1)
