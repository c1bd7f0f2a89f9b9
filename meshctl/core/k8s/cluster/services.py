"""A Service (with its EndpointSlices) as the store's ``Service``, and which ports of it each pod
serves, the way Istio's control plane builds them for ztunnel (pilot ``ambient/services.go``).

Owns: ``ServiceFacts`` and ``SliceFacts`` (what the mesh reads of a Service and of an
EndpointSlice), ``build_service`` (hostname ``<name>.<namespace>.svc.<domain>``, VIPs = cluster IPs
and load-balancer ingress IPs, ports service -> numeric target, 0 for a named target) and
``ports_for_pod`` (a pod's port list for the ``Workload.services`` map: a named target port
resolved in that pod's containers, a port whose name the pod lacks left out). Membership: a
Service with a selector has the pods it selects (its namespace, non-empty selector); one without
a selector has the pods its EndpointSlices name. Invariant: pure; ExternalName services are none.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshctl.core.mesh.addresses import IPAddress
from meshctl.core.mesh.records import Service

from . import objects
from .pods import PodFacts
from .settings import ClusterSettings

SERVICE_NAME_LABEL = "kubernetes.io/service-name"  # EndpointSlice -> its Service


@dataclass(frozen=True, slots=True, kw_only=True)
class ServicePort:
    port: int
    target: int = 0  # 0: named (``target_name``), resolved per pod
    target_name: str = ""
    name: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class ServiceFacts:
    namespace: str
    name: str
    selector: Mapping[str, str] = field(default_factory=dict)  # empty: endpoints from slices
    vips: tuple[IPAddress, ...] = ()
    ports: tuple[ServicePort, ...] = ()
    external_name: bool = False

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


@dataclass(frozen=True, slots=True, kw_only=True)
class SliceFacts:
    """An EndpointSlice: its Service, the pods it names (by targetRef) and its port numbers."""

    namespace: str
    name: str
    service: str  # "" when the slice belongs to no Service
    pods: frozenset[str] = frozenset()
    ports: Mapping[str, int] = field(default_factory=dict)  # port name -> endpoint port

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def hostname(settings: ClusterSettings, namespace: str, name: str) -> str:
    return f"{name}.{namespace}.svc.{settings.domain_suffix}"


def store_key(settings: ClusterSettings, namespace: str, name: str) -> str:
    """The store's (and xDS's) key of a Service: ``<namespace>/<hostname>``."""
    return f"{namespace}/{hostname(settings, namespace, name)}"


def read_service(obj: Mapping[str, object]) -> ServiceFacts:
    namespace, name = objects.identify(obj, "Service")
    vips: list[IPAddress] = []
    cluster_ips = objects.items(obj, "spec", "clusterIPs") or [
        ip for ip in [objects.text(obj, "spec", "clusterIP")] if ip
    ]
    for ip in cluster_ips:
        if ip != "None":  # headless
            vips.append(objects.ip_literal(ip, "spec.clusterIPs[]"))
    for ingress in objects.items(obj, "status", "loadBalancer", "ingress"):
        if objects.text(ingress, "ip"):
            vips.append(objects.ip_literal(ingress["ip"], "status.loadBalancer.ingress[].ip"))
    ports = []
    for p in objects.items(obj, "spec", "ports"):
        number = objects.field(p, "port")
        if not isinstance(number, int) or isinstance(number, bool):
            raise objects.ObjectError(f"Service {namespace}/{name}: spec.ports[].port is no number")
        target = objects.field(p, "targetPort")
        if isinstance(target, str) and not target.isdigit():
            ports.append(ServicePort(port=number, target_name=target, name=_name(p)))
        else:
            value = int(target) if target is not None else number  # the API defaults to port
            ports.append(ServicePort(port=number, target=value, name=_name(p)))
    return ServiceFacts(
        namespace=namespace,
        name=name,
        selector=objects.string_map(obj, "spec", "selector"),
        vips=tuple(dict.fromkeys(vips)),
        ports=tuple(ports),
        external_name=objects.text(obj, "spec", "type") == "ExternalName",
    )


def _name(port: Any) -> str:
    name = objects.field(port, "name")
    return name if isinstance(name, str) else ""


def read_endpoint_slice(obj: Mapping[str, object]) -> SliceFacts:
    namespace, name = objects.identify(obj, "EndpointSlice")
    pods = set()
    for endpoint in objects.items(obj, "endpoints"):
        ref = objects.field(endpoint, "targetRef")
        if (
            objects.field(ref, "kind") == "Pod"
            and isinstance(objects.field(ref, "name"), str)
            and objects.field(ref, "namespace") in (None, namespace)
        ):
            pods.add(ref["name"])
    ports = {}
    for p in objects.items(obj, "ports"):
        if isinstance(objects.field(p, "port"), int):
            ports[_name(p)] = p["port"]
    return SliceFacts(
        namespace=namespace,
        name=name,
        service=objects.string_map(obj, "metadata", "labels").get(SERVICE_NAME_LABEL, ""),
        pods=frozenset(pods),
        ports=ports,
    )


def build_service(svc: ServiceFacts, settings: ClusterSettings) -> Service | None:
    if svc.external_name:
        return None
    return Service(
        name=svc.name,
        namespace=svc.namespace,
        hostname=hostname(settings, svc.namespace, svc.name),
        vips=tuple(("", ip) for ip in svc.vips),
        ports={p.port: p.target for p in svc.ports},
    )


def selects(svc: ServiceFacts, pod: PodFacts) -> bool:
    """The Service's selector picks the pod (same namespace; an empty selector picks none)."""
    return (
        svc.namespace == pod.namespace
        and bool(svc.selector)
        and objects.selects(svc.selector, pod.labels)
    )


def ports_for_pod(
    svc: ServiceFacts, pod: PodFacts, slice_ports: Mapping[str, int] | None = None
) -> dict[int, int]:
    """service port -> the port this pod serves it on.

    A named target resolves in the pod's container ports (left out when the pod has no port of
    that name); for a Service without a selector, its EndpointSlice's port of the same name wins.
    """
    out = {}
    for p in svc.ports:
        if slice_ports is not None and p.name in slice_ports:
            out[p.port] = slice_ports[p.name]
        elif p.target_name:
            if p.target_name in pod.ports:
                out[p.port] = pod.ports[p.target_name]
        else:
            out[p.port] = p.target
    return out
