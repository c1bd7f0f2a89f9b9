"""Backend references resolved against the cluster's Services and ReferenceGrants.

Owns when a backendRef takes traffic: a core ``Service`` (group ``""``) in the route's namespace,
or in another one a ReferenceGrant there allows (``RefNotPermitted`` otherwise, whether or not
the Service exists), that exists and has the port (``BackendNotFound`` otherwise); any other
group/kind is ``InvalidKind``. An ExternalName Service has no endpoints to send to: not found.
Invariant: pure; every backendRef gives a ``Backend`` (unresolved ones keep their weight, so their
share of the traffic answers 500).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from meshctl.core.k8s.cluster import objects
from meshctl.core.k8s.cluster.services import ServiceFacts

from .gatewayapi import GROUP, GrantFacts, number, permits
from .model import Backend

NOT_FOUND = "BackendNotFound"
NOT_PERMITTED = "RefNotPermitted"
INVALID_KIND = "InvalidKind"

Services = Mapping[tuple[str, str], ServiceFacts]


def service_backend(
    services: Services,
    namespace: str,
    name: str,
    *,
    port: int = 0,
    port_name: str = "",
    weight: int = 1,
) -> Backend:
    """A Service port by number (or, for Ingress, by name), resolved or with why not."""
    svc = services.get((namespace, name))
    if svc is not None and port_name and not port:
        port = next((p.port for p in svc.ports if p.name == port_name), 0)
    backend = Backend(namespace=namespace, name=name, port=port, weight=weight)
    if svc is None:
        return _unresolved(backend, NOT_FOUND, f"Service {namespace}/{name} not found")
    if svc.external_name:
        return _unresolved(backend, NOT_FOUND, f"Service {namespace}/{name} is ExternalName")
    if port_name and not port:
        return _unresolved(
            backend, NOT_FOUND, f"Service {namespace}/{name} has no port {port_name}"
        )
    if not port:
        return _unresolved(backend, NOT_FOUND, f"no port for Service {namespace}/{name}")
    if all(p.port != port for p in svc.ports):
        return _unresolved(backend, NOT_FOUND, f"Service {namespace}/{name} has no port {port}")
    return backend


def route_backend(
    ref: Mapping[str, Any],
    *,
    route_kind: str,
    route_namespace: str,
    services: Services,
    grants: list[GrantFacts],
) -> Backend:
    """An HTTPRoute's backendRef (the API's defaults: group "", kind Service, the route's
    namespace, weight 1)."""
    group = objects.text(ref, "group")
    kind = objects.text(ref, "kind", default="Service")
    namespace = objects.text(ref, "namespace", default=route_namespace) or route_namespace
    name = objects.text(ref, "name")
    port = number(ref, "port")
    weight = number(ref, "weight", default=1)
    if (group, kind) != ("", "Service"):
        backend = Backend(namespace=namespace, name=name, port=port, weight=weight)
        what = f"{kind}.{group}" if group else kind
        return _unresolved(backend, INVALID_KIND, f"{what} {namespace}/{name} is not a Service")
    if not permits(grants, (GROUP, route_kind, route_namespace), ("", "Service", namespace, name)):
        backend = Backend(namespace=namespace, name=name, port=port, weight=weight)
        return _unresolved(
            backend,
            NOT_PERMITTED,
            f"no ReferenceGrant in {namespace} allows {route_kind}s of {route_namespace} "
            f"to Service {name}",
        )
    return service_backend(services, namespace, name, port=port, weight=weight)


def _unresolved(backend: Backend, problem: str, detail: str) -> Backend:
    return Backend(
        namespace=backend.namespace,
        name=backend.name,
        port=backend.port,
        weight=backend.weight,
        problem=problem,
        detail=detail,
    )
