"""Discovery as a control-plane component: Kubernetes watches -> the cluster index -> the store.

Owns the five watches discovery needs (Pods, Namespaces, Services, EndpointSlices and
``security.istio.io`` AuthorizationPolicies, through the shared list+watch loop), turning their
events into store updates (``core.cluster.index``) and handing them to the Delta ADS server,
which it registers on the control plane's gRPC server. Invariants: events are taken in batches
(everything queued when the consumer wakes becomes one store snapshot, so a relist of thousands
of pods is one push, not thousands); streams are answered only once every watch has delivered a
complete list (``not_ready`` says which are missing); a malformed object is logged and skipped,
never fatal; every policy converted with a loss is logged once per version, with why.
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from meshctl.core.k8s.cluster.index import ClusterIndex, Resource
from meshctl.core.k8s.cluster.objects import ObjectError
from meshctl.core.k8s.cluster.settings import ClusterSettings
from meshctl.core.mesh.store import Update
from meshctl.kube import resources
from meshctl.kube.watch import Watch, WatchEvent, object_key
from meshctl.proto import xds_pb2_grpc

from .crds import GROUP, PLURAL
from .xds_server import DiscoveryServer

if TYPE_CHECKING:
    from .plane import Plane
    from .settings import ControlPlaneSettings

log = logging.getLogger(__name__)

AUTHORIZATION_POLICIES = resources.Resource(GROUP, "v1", PLURAL, "AuthorizationPolicy")
WATCHED = {
    Resource.NAMESPACE: resources.NAMESPACES,
    Resource.POD: resources.PODS,
    Resource.SERVICE: resources.SERVICES,
    Resource.ENDPOINT_SLICE: resources.ENDPOINT_SLICES,
    Resource.AUTHORIZATION_POLICY: AUTHORIZATION_POLICIES,
}


def cluster_settings(settings: ControlPlaneSettings) -> ClusterSettings:
    return ClusterSettings(
        cluster_id=settings.cluster_id,
        trust_domain=settings.trust_domain,
        domain_suffix=settings.domain_suffix,
        root_namespace=settings.mesh_root_namespace,
    )


class Discovery:
    """The ``Component`` serving workload discovery (see ``plane.Part``)."""

    name = "discovery"

    def __init__(self, settings: ControlPlaneSettings) -> None:
        self.settings = settings
        self.index = ClusterIndex(cluster_settings(settings))
        self.server: DiscoveryServer | None = None
        self._watches: list[Watch] = []
        self._synced: set[Resource] = set()
        self._warned: dict[str, tuple[str, ...]] = {}
        self._events: asyncio.Queue[tuple[Resource, WatchEvent]] = asyncio.Queue()

    async def start(self, plane: Plane) -> None:
        self.server = DiscoveryServer(
            callers=plane.authenticator,
            cluster_id=self.settings.cluster_id,
            metrics=plane.metrics,
            synced=False,
        )
        plane.server.add(xds_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server, self.server)
        loop = asyncio.get_running_loop()
        for kind, resource in WATCHED.items():

            def deliver(event: WatchEvent, kind: Resource = kind) -> None:
                loop.call_soon_threadsafe(self._events.put_nowait, (kind, event))

            watch = Watch(plane.kube, resource, deliver)
            self._watches.append(watch)
            watch.start()
        plane.spawn(self._consume(), "discovery source")

    def drain(self) -> None:
        if self.server is not None:
            self.server.close_streams()

    async def stop(self) -> None:
        await asyncio.gather(*(asyncio.to_thread(w.stop, 1.0) for w in self._watches))

    def not_ready(self) -> str | None:
        missing = [k.value for k in WATCHED if k not in self._synced]
        if not missing:
            return None
        why = f"waiting for the first list of {', '.join(missing)}"
        if Resource.AUTHORIZATION_POLICY.value in missing:
            why += " (is the AuthorizationPolicy CRD installed?)"
        return why

    async def _consume(self) -> None:
        while True:
            batch = [await self._events.get()]
            while not self._events.empty():
                batch.append(self._events.get_nowait())
            updates: list[Update] = []
            for kind, event in batch:
                updates += self._take(kind, event)
            assert self.server is not None  # noqa: S101 (started before the watches)
            self.server.apply(updates)
            if len(self._synced) == len(WATCHED) and not self.server.synced.is_set():
                log.info(
                    "discovery: caches synced (%d workloads, %d services, %d policies)",
                    len(self.server.store.workloads),
                    len(self.server.store.services),
                    len(self.server.store.policies),
                )
                self.server.synced.set()
            self._report_lossy_policies()

    def _take(self, kind: Resource, event: WatchEvent) -> list[Update]:
        if event.type == "SYNCED":
            self._synced.add(kind)
            return []
        namespace, name = object_key(event.object)
        try:
            if event.type == "DELETED":
                return self.index.delete(kind, namespace, name)
            return self.index.upsert(kind, event.object)
        except ObjectError as exc:
            where = f"{namespace}/{name}" if namespace else name
            log.warning("discovery: %s %s ignored: %s", kind.value, where, exc)
            return []

    def _report_lossy_policies(self) -> None:
        current = self.index.warnings()
        for key, warnings in current.items():
            if self._warned.get(key) != warnings:
                for warning in warnings:
                    log.warning("discovery: AuthorizationPolicy %s: %s", key, warning)
        self._warned = current
