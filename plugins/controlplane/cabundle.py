"""The injection webhooks' ``caBundle``, kept equal to the mesh's roots by the leader.

Owns, while this replica leads, patching ``clientConfig.caBundle`` of every webhook in the
configuration ``meshctl-sidecar-injector[-<rev>]`` (installed by the manifest with an empty
bundle) and in every revision tag's configuration that names this revision (``meshctl tag set``
copies the bundle once; a root rotation would otherwise leave tagged namespaces with a webhook
the API server cannot call), to the trust bundle that verifies the control plane's serving
certificate, and patching them again whenever someone changes them or the bundle changes, as
istiod does for the configurations labelled with its revision. Invariants: level-triggered from
the watched objects; a JSON patch that tests the resourceVersion read, so a concurrent edit is
never overwritten blindly (the next event brings it back here); only ``caBundle`` fields are
touched; only configurations meshctl made for this revision (its own, its tags'); a
configuration that does not exist is waited for, never created.
"""

from __future__ import annotations

import asyncio
import base64
import logging
from collections.abc import Callable
from typing import TYPE_CHECKING, TypedDict, cast

from meshctl.core.k8s import tags
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


def is_patched(configuration: MutatingWebhookConfiguration, own: str) -> bool:
    """The revision's own configuration, or a tag of it that meshctl wrote (the informer
    already selects ``istio.io/rev=<revision>``)."""
    metadata = configuration.get("metadata", {})
    if metadata.get("name") == own:
        return True
    labels = metadata.get("labels") or {}
    return tags.TAG_LABEL in labels and labels.get(tags.MANAGED_BY_LABEL) == tags.MANAGED_BY


class CaBundlePatcher:
    """Reconciles the caBundles of the revision's webhook configurations to ``bundle()``."""

    def __init__(
        self,
        informers: Informers,
        kube: Kube,
        name: str,
        revision: str,
        bundle: Callable[[], str | None],
    ) -> None:
        self._kube = kube
        self.name = name
        self._bundle = bundle
        # The revision's own configuration and its tags all carry istio.io/rev=<revision>.
        self._configurations = informers.informer(
            MUTATING_WEBHOOK_CONFIGURATIONS, label_selector=f"{tags.REVISION_LABEL}={revision}"
        )
        self._queue: WorkQueue[str] | None = None

    def bundle_changed(self) -> None:
        if self._queue is not None:
            for name in self._names():
                self._queue.add(name)

    async def run(self) -> None:
        queue: WorkQueue[str] = WorkQueue("webhook caBundle", self._reconcile)
        self._queue = queue

        async def follow() -> None:
            async with self._configurations.subscribe() as events:
                async for event in events:
                    if event.type == "SYNCED":
                        if self._current(self.name) is None:
                            log.info(
                                "waiting for MutatingWebhookConfiguration %s to exist", self.name
                            )
                        for name in self._names():
                            queue.add(name)
                        continue
                    queue.add(event.key[1])

        try:
            await asyncio.gather(follow(), queue.run(workers=1))
        finally:
            self._queue = None

    def _names(self) -> list[str]:
        found = [
            str(c.get("metadata", {}).get("name"))
            for c in self._configurations.objects()
            if is_patched(cast("MutatingWebhookConfiguration", c), self.name)
        ]
        return found or [self.name]

    def _current(self, name: str) -> MutatingWebhookConfiguration | None:
        # The informer's objects are plain dicts (install reads them too): viewed as served.
        return cast("MutatingWebhookConfiguration | None", self._configurations.get(name))

    async def _reconcile(self, name: str) -> None:
        bundle = self._bundle()
        current = self._current(name)
        if bundle is None or current is None or not is_patched(current, self.name):
            return
        ops = bundle_patch(current, bundle)
        if not ops:
            return
        await asyncio.to_thread(
            objects.patch,
            self._kube,
            MUTATING_WEBHOOK_CONFIGURATIONS,
            name,
            ops,
            patch_type="json",
        )
        log.info("caBundle of %s set to the mesh roots (%d webhooks)", name, len(ops) - 1)
