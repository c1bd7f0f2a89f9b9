"""The gateway controller: Gateway API and Ingress objects in, gateway configs, status and
provisioned proxies out.

Owns, in every replica: informers on GatewayClasses, Gateways, HTTPRoutes, GRPCRoutes,
TLSRoutes, TCPRoutes (v1, as the pinned v1.6.3 standard channel serves them) and ReferenceGrants
(``gateway.networking.k8s.io``), IngressClasses and Ingresses, Services, EndpointSlices,
Namespaces and ``kubernetes.io/tls`` Secrets (shared with discovery where it watches the same),
and the Deployments it provisioned; every change queues one reconcile (the work queue coalesces
a burst into one run) that translates the whole cluster (``core.gateway.translate``), builds
each proxy's config (``core.gateway.assemble``: certificates of the served listeners, ready
endpoints, HBONE for mesh members by the workload store) and publishes them to discovery
(``gateway_configs``). Only while this replica leads: writes each status that changed through
the ``status`` subresource (a merge patch of the whole status: stale parents go with it) and
provisions each accepted Gateway's proxy (``core.k8s.gatewaypod``; server-side apply, only when
the rendering changed; an object of that name it does not own is left alone and said) and
deletes the proxies of Gateways no longer accepted. Invariants: level-triggered (every run reads
the whole cache, so any event order converges); nothing is translated before every informer has
listed once and the workload store is whole; a failed run is retried with the queue's backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from meshctl.core.gateway import assemble, ingress
from meshctl.core.gateway.config import GatewayConfig, KeyPair
from meshctl.core.gateway.gateways import GatewayRuntime
from meshctl.core.gateway.translate import Cluster, Options, StatusUpdate, Translation, translate
from meshctl.core.k8s import gatewaypod, layout
from meshctl.core.k8s.cluster import objects as fields
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.core.mesh.records import Protocol
from meshctl.core.mesh.store import LiveStore, Store, Update
from meshctl.kube import objects, resources
from meshctl.kube.informer import Informer, subscribe
from meshctl.kube.rest import ApiStatusError
from meshctl.kube.workqueue import WorkQueue

from .gateway_configs import INGRESS, GatewayConfigs

if TYPE_CHECKING:
    from .plane import Plane
    from .settings import ControlPlaneSettings

log = logging.getLogger(__name__)

GROUP = "gateway.networking.k8s.io"
_R = resources.Resource
GATEWAY_CLASSES: _R[dict[str, object]] = _R(
    GROUP, "v1", "gatewayclasses", "GatewayClass", namespaced=False
)
GATEWAYS: _R[dict[str, object]] = _R(GROUP, "v1", "gateways", "Gateway")
HTTP_ROUTES: _R[dict[str, object]] = _R(GROUP, "v1", "httproutes", "HTTPRoute")
GRPC_ROUTES: _R[dict[str, object]] = _R(GROUP, "v1", "grpcroutes", "GRPCRoute")
TLS_ROUTES: _R[dict[str, object]] = _R(GROUP, "v1", "tlsroutes", "TLSRoute")
TCP_ROUTES: _R[dict[str, object]] = _R(GROUP, "v1", "tcproutes", "TCPRoute")
REFERENCE_GRANTS: _R[dict[str, object]] = _R(GROUP, "v1beta1", "referencegrants", "ReferenceGrant")
INGRESS_CLASSES: _R[dict[str, object]] = _R(
    "networking.k8s.io", "v1", "ingressclasses", "IngressClass", namespaced=False
)
INGRESSES: _R[dict[str, object]] = _R("networking.k8s.io", "v1", "ingresses", "Ingress")
STATUS_RESOURCES = {
    "GatewayClass": GATEWAY_CLASSES,
    "Gateway": GATEWAYS,
    "HTTPRoute": HTTP_ROUTES,
    "GRPCRoute": GRPC_ROUTES,
    "TLSRoute": TLS_ROUTES,
    "TCPRoute": TCP_ROUTES,
    "Ingress": INGRESSES,
}
KINDS = {"ServiceAccount": resources.SERVICE_ACCOUNTS, "Deployment": resources.DEPLOYMENTS}
KINDS["Service"] = resources.SERVICES
FIELD_MANAGER = "meshctl-gateway-controller"
INGRESS_SERVICE = "meshctl-ingressgateway"  # the installed gateway that serves Ingresses
_KEY = "cluster"  # one key: every run translates the whole cluster


def now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class GatewayController:
    """The ``Part`` (see ``plane.Part``) running the gateway controller."""

    name = "gateway controller"

    def __init__(
        self,
        settings: ControlPlaneSettings,
        configs: GatewayConfigs,
        store: LiveStore,
        inject: InjectSettings,
        *,
        store_synced: asyncio.Event | None = None,
        class_options: Options | None = None,
    ) -> None:
        """``store_synced``: set once the workload store is whole (None: it is); no config is
        published before, so a mesh endpoint is never sent as a plaintext one."""
        self.settings = settings
        self.store_synced = store_synced
        self.configs = configs
        self.store = store
        self.inject = inject
        # The Ingress table on the ports the installed gateway's Service targets (80 -> 8080,
        # 443 -> 8443), not on 80/443 themselves.
        self.options = class_options or Options(ingress_ports=ingress.GATEWAY_PORTS)
        self.leading = False
        self.last: Translation | None = None
        self._plane: Plane | None = None
        self._informers: dict[str, Informer[Any]] = {}
        self._listed: set[str] = set()
        self._queue: WorkQueue[str] = WorkQueue("gateway", self._reconcile)
        self._pairs: dict[tuple[str, str], tuple[str, KeyPair | str]] = {}  # by resourceVersion
        self._applied: dict[tuple[str, str, str], str] = {}  # (kind, ns, name) -> digest
        self._task: asyncio.Task[None] | None = None

    # -- the Part --------------------------------------------------------------------------------

    async def start(self, plane: Plane) -> None:
        self._plane = plane
        inf = plane.informers
        self._informers = {
            "gatewayclasses": inf.informer(GATEWAY_CLASSES),
            "gateways": inf.informer(GATEWAYS),
            "httproutes": inf.informer(HTTP_ROUTES),
            "grpcroutes": inf.informer(GRPC_ROUTES),
            "tlsroutes": inf.informer(TLS_ROUTES),
            "tcproutes": inf.informer(TCP_ROUTES),
            "referencegrants": inf.informer(REFERENCE_GRANTS),
            "ingressclasses": inf.informer(INGRESS_CLASSES),
            "ingresses": inf.informer(INGRESSES),
            "services": inf.informer(resources.SERVICES),
            "endpointslices": inf.informer(resources.ENDPOINT_SLICES),
            "namespaces": inf.informer(resources.NAMESPACES),
            "secrets": inf.informer(resources.SECRETS, field_selector=f"type={assemble.TLS_TYPE}"),
            "deployments": inf.informer(
                resources.DEPLOYMENTS, label_selector=f"{gatewaypod.MANAGED_LABEL}=true"
            ),
        }
        self.store.subscribe(self._store_changed)
        plane.leader.add("gateway status and proxies", self._lead)
        self._task = plane.spawn(self._run(), "gateway controller")

    def drain(self) -> None:
        pass  # no long-lived calls of its own (discovery ends the streams)

    async def stop(self) -> None:
        self._queue.shut_down()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    def not_ready(self) -> str | None:
        return None  # gateways never hold the control plane's readiness (the CRDs are optional)

    # -- events ----------------------------------------------------------------------------------

    async def _run(self) -> None:
        async with subscribe(self._informers.values()) as events:
            runner = asyncio.ensure_future(self._queue.run(workers=1))
            whole = asyncio.ensure_future(self._when_store_whole())
            try:
                while True:
                    await events.batch()
                    self._listed = {n for n, i in self._informers.items() if i.synced}
                    self._queue.add(_KEY)
            finally:
                runner.cancel()
                whole.cancel()

    async def _when_store_whole(self) -> None:
        if self.store_synced is not None:
            await self.store_synced.wait()
            self._queue.add(_KEY)

    def _store_changed(self, old: Store, new: Store, updates: list[Update] | Any) -> None:
        self._queue.add(_KEY)  # mesh membership decides HBONE or plaintext per endpoint

    async def _lead(self) -> None:
        self.leading = True
        self._applied.clear()
        self._queue.add(_KEY)
        try:
            await asyncio.Event().wait()
        finally:
            self.leading = False

    # -- one run ---------------------------------------------------------------------------------

    def _objects(self, name: str) -> list[Any]:
        return self._informers[name].objects()

    async def _reconcile(self, key: str) -> None:
        missing = sorted(set(self._informers) - self._listed)
        if self.store_synced is not None and not self.store_synced.is_set():
            missing.append("workloads (discovery)")
        if missing:
            log.debug("gateway controller: waiting for the first list of %s", ", ".join(missing))
            return
        pairs = self._read_secrets()
        gateways = self._objects("gateways")
        cluster = Cluster(
            gateway_classes=self._objects("gatewayclasses"),
            gateways=gateways,
            http_routes=self._objects("httproutes"),
            grpc_routes=self._objects("grpcroutes"),
            tls_routes=self._objects("tlsroutes"),
            tcp_routes=self._objects("tcproutes"),
            reference_grants=self._objects("referencegrants"),
            services=self._objects("services"),
            namespaces=self._objects("namespaces"),
            ingress_classes=self._objects("ingressclasses"),
            ingresses=self._objects("ingresses"),
            certificates=assemble.certificate_facts(pairs),
            runtime=self._runtime(gateways),
            ingress_addresses=assemble.runtime(None, self._ingress_service()).addresses,
        )
        result = translate(cluster, now=now(), options=self.options)
        self.last = result
        for problem in result.problems:
            log.debug("gateway controller: %s", problem)
        self.configs.publish(self._configs(result, pairs))
        if self.leading:
            await self._write_statuses(result.statuses)
            await self._provision(result, gateways)

    def _read_secrets(self) -> dict[tuple[str, str], KeyPair | str]:
        out: dict[tuple[str, str], KeyPair | str] = {}
        fresh: dict[tuple[str, str], tuple[str, KeyPair | str]] = {}
        for secret in self._objects("secrets"):
            key = (
                fields.text(secret, "metadata", "namespace"),
                fields.text(secret, "metadata", "name"),
            )
            version = fields.text(secret, "metadata", "resourceVersion")
            known = self._pairs.get(key)
            if known is None or known[0] != version:
                known = (version, assemble.read_tls_secret(secret))
            fresh[key] = known
            out[key] = known[1]
        self._pairs = fresh
        return out

    def _runtime(self, gateways: list[Any]) -> dict[tuple[str, str], GatewayRuntime]:
        out = {}
        for gw in gateways:
            ns, name = fields.text(gw, "metadata", "namespace"), fields.text(gw, "metadata", "name")
            cls = fields.text(gw, "spec", "gatewayClassName")
            if not (ns and name and cls):
                continue
            proxy = gatewaypod.resource_name(name, cls)
            deployment = self._informers["deployments"].get(proxy, ns)
            service = self._informers["services"].get(proxy, ns)
            out[(ns, name)] = assemble.runtime(deployment, service)
        return out

    def _ingress_service(self) -> Any:
        """The installed ingress gateway of this revision (Istio's naming: ``-<rev>`` unless
        default), in the control plane's namespace."""
        name = layout.revisioned(INGRESS_SERVICE, self.settings.revision)
        return self._informers["services"].get(name, self.settings.namespace)

    def _mesh(self, ip: str) -> assemble.MeshMember | None:
        try:
            workload = self.store.current.workload_by_ip(ip)
        except ValueError:
            return None
        if workload is None or workload.protocol != Protocol.HBONE:
            return None
        return assemble.MeshMember(str(workload.identity), f"{workload.namespace}/{workload.name}")

    def _configs(
        self, result: Translation, pairs: Mapping[tuple[str, str], KeyPair | str]
    ) -> list[GatewayConfig]:
        services, slices = self._objects("services"), self._objects("endpointslices")
        tables = {f"{ns}/{name}": table for (ns, name), table in result.gateways.items()}
        tables[INGRESS] = result.ingress
        return [
            assemble.gateway_config(name, table, pairs, services, slices, self._mesh)
            for name, table in sorted(tables.items())
        ]

    # -- the leader's writes ---------------------------------------------------------------------

    async def _write_statuses(self, statuses: tuple[StatusUpdate, ...]) -> None:
        assert self._plane is not None  # noqa: S101 -- started
        kube = self._plane.kube
        for update in statuses:
            if not update.changed:
                continue
            resource = STATUS_RESOURCES[update.kind]
            namespace = update.namespace or None
            try:
                await asyncio.to_thread(
                    objects.patch,
                    kube,
                    resource,
                    update.name,
                    {"status": update.status},
                    namespace,
                    subresource="status",
                )
            except ApiStatusError as exc:
                if exc.status != 404:  # gone meanwhile: its next event says so
                    raise
            else:
                where = f"{update.namespace}/{update.name}" if update.namespace else update.name
                log.info("gateway controller: %s %s status written", update.kind, where)

    async def _provision(self, result: Translation, gateways: list[Any]) -> None:
        assert self._plane is not None  # noqa: S101 -- started
        wanted: set[tuple[str, str]] = set()
        for gw in gateways:
            ns, name = fields.text(gw, "metadata", "namespace"), fields.text(gw, "metadata", "name")
            if (ns, name) not in result.gateways:
                continue
            proxy = gatewaypod.GatewayProxy(
                namespace=ns,
                name=name,
                uid=fields.text(gw, "metadata", "uid"),
                class_name=fields.text(gw, "spec", "gatewayClassName"),
                ports=gatewaypod.listener_ports(fields.items(gw, "spec", "listeners")),
            )
            wanted.add((ns, gatewaypod.resource_name(proxy.name, proxy.class_name)))
            for obj in gatewaypod.render_proxy(proxy, self.inject):
                await self._apply(obj, proxy.uid)
        for deployment in self._objects("deployments"):
            ns = fields.text(deployment, "metadata", "namespace")
            name = fields.text(deployment, "metadata", "name")
            if (ns, name) not in wanted and _owned_by_a_gateway(deployment):
                await self._remove(ns, name)

    async def _apply(self, obj: dict[str, Any], uid: str) -> None:
        assert self._plane is not None  # noqa: S101 -- started
        kind, meta = obj["kind"], obj["metadata"]
        key = (kind, meta["namespace"], meta["name"])
        rendered = meta["annotations"][gatewaypod.RENDERED_ANNOTATION]
        cache = {"Deployment": "deployments", "Service": "services"}.get(kind)
        current = self._informers[cache].get(meta["name"], meta["namespace"]) if cache else None
        if current is not None:
            if not _owned_by(current, uid):
                log.warning(
                    "gateway controller: %s %s/%s exists and is not this Gateway's: left alone",
                    kind,
                    key[1],
                    key[2],
                )
                return
            annotations = fields.string_map(current, "metadata", "annotations")
            if annotations.get(gatewaypod.RENDERED_ANNOTATION) == rendered:
                self._applied[key] = rendered
                return
        elif cache is None and self._applied.get(key) == rendered:
            return
        await asyncio.to_thread(
            objects.apply,
            self._plane.kube,
            KINDS[kind],
            obj,
            meta["namespace"],
            field_manager=FIELD_MANAGER,
            force=True,
        )
        self._applied[key] = rendered
        log.info("gateway controller: %s %s/%s provisioned", kind, key[1], key[2])

    async def _remove(self, namespace: str, name: str) -> None:
        assert self._plane is not None  # noqa: S101 -- started
        for kind, resource in KINDS.items():
            await asyncio.to_thread(objects.delete, self._plane.kube, resource, name, namespace)
            self._applied.pop((kind, namespace, name), None)
        log.info(
            "gateway controller: proxy %s/%s removed (its Gateway is not ours)", namespace, name
        )


def _owners(obj: Any) -> list[Any]:
    return fields.items(obj, "metadata", "ownerReferences")


def _owned_by(obj: Any, uid: str) -> bool:
    return any(fields.text(o, "uid") == uid for o in _owners(obj))


def _owned_by_a_gateway(obj: Any) -> bool:
    return any(
        fields.text(o, "kind") == "Gateway" and fields.text(o, "apiVersion").startswith(GROUP)
        for o in _owners(obj)
    )
