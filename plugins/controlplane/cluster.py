"""Discovery as a control-plane component: Kubernetes informers -> the cluster index -> the store.

Owns the workload store and the five informers that feed it (Pods, Namespaces, Services,
EndpointSlices and ``security.istio.io`` AuthorizationPolicies, from the plane's shared
informers), turning their events into store updates (``core.cluster.index``); the Delta ADS
servicer it registers on the control plane's gRPC server only reads the store's snapshots.
Invariants: events are taken in batches (everything queued when the consumer wakes becomes one
store snapshot, so a relist of thousands of pods is one push, not thousands); streams are
answered only once every informer has delivered a complete list (``not_ready`` says which are
missing); a malformed object is logged and skipped, never fatal; every policy converted with a
loss is logged once per version, with why.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
from collections.abc import Mapping
from typing import TYPE_CHECKING

from meshctl.core.k8s.cluster.index import ClusterIndex, Resource
from meshctl.core.k8s.cluster.objects import ObjectError
from meshctl.core.k8s.cluster.settings import ClusterSettings
from meshctl.core.mesh.store import LiveStore, Update
from meshctl.kube import resources
from meshctl.kube.informer import Subscription, subscribe
from meshctl.kube.watch import WatchEvent, object_key
from meshctl.proto import xds_pb2_grpc

from .crds import GROUP, PLURAL
from .gateway_configs import GatewayConfigs
from .xds_server import DebugSettings, DiscoveryServer

if TYPE_CHECKING:
    from .plane import Plane
    from .settings import ControlPlaneSettings

log = logging.getLogger(__name__)

AUTHORIZATION_POLICIES: resources.Resource[dict[str, object]] = resources.Resource(
    GROUP, "v1", PLURAL, "AuthorizationPolicy"
)
# Read by the cluster index's own defensive readers, whatever view a resource has.
WATCHED: dict[Resource, resources.Resource[Mapping[str, object]]] = {
    Resource.NAMESPACE: resources.NAMESPACES,
    Resource.POD: resources.PODS,
    Resource.SERVICE: resources.SERVICES,
    Resource.ENDPOINT_SLICE: resources.ENDPOINT_SLICES,
    Resource.AUTHORIZATION_POLICY: AUTHORIZATION_POLICIES,
}
KIND_OF = {resource: kind for kind, resource in WATCHED.items()}


def cluster_settings(settings: ControlPlaneSettings) -> ClusterSettings:
    return ClusterSettings(
        cluster_id=settings.cluster_id,
        trust_domain=settings.trust_domain,
        domain_suffix=settings.domain_suffix,
        root_namespace=settings.mesh_root_namespace,
    )


class Discovery:
    """The ``Part`` serving workload discovery (see ``plane.Part``); owns the store."""

    name = "discovery"

    def __init__(
        self, settings: ControlPlaneSettings, gateways: GatewayConfigs | None = None
    ) -> None:
        """``gateways``: the gateway controller's configs, served on the same streams."""
        self.settings = settings
        self.gateways = gateways
        self.index = ClusterIndex(cluster_settings(settings))
        self.store = LiveStore()
        self.synced = asyncio.Event()  # the store is whole: every informer listed once
        self.server: DiscoveryServer | None = None
        self._synced: set[Resource] = set()
        self._warned: dict[str, tuple[str, ...]] = {}
        self._source: asyncio.Task[None] | None = None

    async def start(self, plane: Plane) -> None:
        self.server = DiscoveryServer(
            self.store,
            callers=plane.authenticator,
            cluster_id=self.settings.cluster_id,
            metrics=plane.metrics,
            synced=self.synced,
            gateways=self.gateways,
            ingress_namespace=self.settings.namespace,
            debug=DebugSettings(
                namespace=self.settings.namespace,
                replica=self.settings.pod_name or socket.gethostname(),
                issued=plane.issued,
            ),
        )
        plane.server.add(xds_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server, self.server)
        events = subscribe(plane.informers.informer(r) for r in WATCHED.values())
        self._source = plane.spawn(self._consume(events), "discovery source")

    def drain(self) -> None:
        if self.server is not None:
            self.server.close_streams()

    async def stop(self) -> None:
        if self._source is not None:
            self._source.cancel()  # leaving the subscription stops the informers nobody shares
            with contextlib.suppress(asyncio.CancelledError):
                await self._source

    def not_ready(self) -> str | None:
        missing = [k.value for k in WATCHED if k not in self._synced]
        if not missing:
            return None
        why = f"waiting for the first list of {', '.join(missing)}"
        if Resource.AUTHORIZATION_POLICY.value in missing:
            why += " (is the AuthorizationPolicy CRD installed?)"
        return why

    async def _consume(self, subscription: Subscription[Mapping[str, object]]) -> None:
        async with subscription as events:
            while True:
                updates: list[Update] = []
                for event in await events.batch():
                    if event.resource is not None:
                        updates += self._take(KIND_OF[event.resource], event)
                self.store.apply(updates)
                if len(self._synced) == len(WATCHED) and not self.synced.is_set():
                    store = self.store.current
                    log.info(
                        "discovery: caches synced (%d workloads, %d services, %d policies)",
                        len(store.workloads),
                        len(store.services),
                        len(store.policies),
                    )
                    self.synced.set()
                self._report_lossy_policies()

    def _take(self, kind: Resource, event: WatchEvent[Mapping[str, object]]) -> list[Update]:
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
