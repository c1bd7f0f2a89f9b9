"""The whole cluster, as the controller's caches hold it, translated into what each gateway
proxy serves and the status of every object we own.

Owns the reconcile's pure step: Kubernetes objects (plain dicts) and the caller's facts in
(certificate validity, each Gateway's proxy readiness and addresses, the Ingress gateway's
addresses, the time now), route tables and status out. Status is recomputed from the whole
input for every parent each time, with each object's current ``metadata.generation``; a
condition keeps its ``lastTransitionTime`` while its status holds (the previous status is read
from the objects themselves). Invariants: pure; a malformed object is skipped with a problem
line, never an exception; the output does not depend on the order of the input lists.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, TypeVar

from meshctl.core.k8s.cluster import objects
from meshctl.core.k8s.cluster.objects import ObjectError
from meshctl.core.k8s.cluster.services import ServiceFacts, read_service

from . import ingress, table
from .attachment import ParentResult, attach, resolved_refs, route_status
from .backends import route_backend
from .gatewayapi import (
    CONTROLLER,
    GROUP,
    GrantFacts,
    RouteFacts,
    read_gateway,
    read_gateway_class,
    read_grant,
    read_route,
)
from .gateways import (
    Address,
    CertificateFacts,
    GatewayRuntime,
    GatewayState,
    class_accepted,
    class_status,
    gateway_state,
    gateway_status,
)
from .grpcroute import read_grpc_rules
from .model import Route, RouteKey, RouteTable
from .rules import read_backend_rules, read_rules

_T = TypeVar("_T")


@dataclass(frozen=True, slots=True, kw_only=True)
class Cluster:
    """The input: every object of these kinds the controller sees, and facts about them."""

    gateway_classes: Sequence[Any] = ()
    gateways: Sequence[Any] = ()
    http_routes: Sequence[Any] = ()
    grpc_routes: Sequence[Any] = ()  # v1
    tls_routes: Sequence[Any] = ()  # v1 (or v1alpha2: the same fields)
    tcp_routes: Sequence[Any] = ()  # v1 (or v1alpha2)
    reference_grants: Sequence[Any] = ()
    services: Sequence[Any] = ()
    namespaces: Sequence[Any] = ()
    ingress_classes: Sequence[Any] = ()
    ingresses: Sequence[Any] = ()
    certificates: Mapping[tuple[str, str], CertificateFacts] = field(default_factory=dict)
    runtime: Mapping[tuple[str, str], GatewayRuntime] = field(default_factory=dict)
    ingress_addresses: tuple[Address, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class Options:
    controller: str = CONTROLLER  # our GatewayClasses' spec.controllerName
    ingress_class: str = ingress.CLASS
    ingress_ports: tuple[int, int] = (80, 443)  # HTTP, HTTPS
    misdirected_by_listener: bool = False  # see RouteTable


@dataclass(frozen=True, slots=True, kw_only=True)
class StatusUpdate:
    kind: str  # GatewayClass | Gateway | HTTPRoute | GRPCRoute | TLSRoute | TCPRoute | Ingress
    namespace: str  # "" for GatewayClass
    name: str
    status: dict[str, Any]
    changed: bool  # differs from the status the object carries


@dataclass(frozen=True, slots=True, kw_only=True)
class Translation:
    gateways: Mapping[tuple[str, str], RouteTable]  # per accepted Gateway of ours
    ingress: RouteTable
    statuses: tuple[StatusUpdate, ...]
    problems: tuple[str, ...]  # objects or parts skipped, one line each


def _read_all(
    items: Sequence[Any], reader: Callable[[Any], _T], kind: str, problems: list[str]
) -> list[_T]:
    out = []
    for obj in items:
        try:
            out.append(reader(obj))
        except ObjectError as exc:
            name = objects.field(obj, "metadata", "name")
            problems.append(f"{kind} {name if isinstance(name, str) else '?'} skipped: {exc}")
    return out


def _update(
    kind: str, namespace: str, name: str, status: dict[str, Any], before: Any
) -> StatusUpdate:
    return StatusUpdate(
        kind=kind, namespace=namespace, name=name, status=status, changed=status != before
    )


def translate(cluster: Cluster, *, now: str, options: Options = Options()) -> Translation:
    """Route tables and status for the whole input (see the module's docstring)."""
    problems: list[str] = []
    statuses: list[StatusUpdate] = []
    classes = _classes(cluster, options, now, statuses, problems)
    grants = _read_all(cluster.reference_grants, read_grant, "ReferenceGrant", problems)
    grants.sort(key=lambda g: (g.namespace, g.sources, g.targets))
    services: dict[tuple[str, str], ServiceFacts] = {
        s.key: s for s in _read_all(cluster.services, read_service, "Service", problems)
    }
    gateways: dict[tuple[str, str], GatewayState] = {}
    for gw in sorted(
        _read_all(cluster.gateways, read_gateway, "Gateway", problems), key=lambda g: g.meta.key
    ):
        if gw.class_name in classes:
            gateways[gw.meta.key] = gateway_state(
                gw,
                class_ok=classes[gw.class_name],
                certificates=cluster.certificates,
                grants=grants,
            )
    attached = _routes(cluster, options, now, gateways, services, grants, statuses, problems)
    tables: dict[tuple[str, str], RouteTable] = {}
    for key, state in gateways.items():
        runtime = cluster.runtime.get(key, GatewayRuntime())
        counts = {name: len(rs) for name, rs in attached[key].items()}
        status = gateway_status(state, attached=counts, runtime=runtime, now=now)
        statuses.append(_update("Gateway", key[0], key[1], status, state.facts.status))
        if state.accepted.status:
            tables[key] = table.build(
                [
                    (ls.listener, attached[key].get(ls.spec.name, []))
                    for ls in state.listeners
                    if ls.serves
                ],
                misdirected_by_listener=options.misdirected_by_listener,
            )
    ingress_routes = _ingresses(cluster, options, services, statuses, problems)
    statuses.sort(key=lambda s: (s.kind, s.namespace, s.name))
    return Translation(
        gateways=tables,
        ingress=ingress_routes,
        statuses=tuple(statuses),
        problems=tuple(sorted(problems)),
    )


def _classes(
    cluster: Cluster,
    options: Options,
    now: str,
    statuses: list[StatusUpdate],
    problems: list[str],
) -> dict[str, bool]:
    """Our GatewayClasses (name -> accepted), their status appended."""
    out = {}
    for cls in _read_all(cluster.gateway_classes, read_gateway_class, "GatewayClass", problems):
        if cls.controller != options.controller:
            continue
        out[cls.meta.name] = class_accepted(cls).status
        status = class_status(cls, now=now)
        statuses.append(_update("GatewayClass", "", cls.meta.name, status, cls.status))
    return out


def _routes(
    cluster: Cluster,
    options: Options,
    now: str,
    gateways: Mapping[tuple[str, str], GatewayState],
    services: Mapping[tuple[str, str], ServiceFacts],
    grants: list[GrantFacts],
    statuses: list[StatusUpdate],
    problems: list[str],
) -> dict[tuple[str, str], dict[str, list[Route]]]:
    """Per Gateway of ours, per listener name, the routes attached; routes' status appended."""
    labels = _namespace_labels(cluster.namespaces)
    attached: dict[tuple[str, str], dict[str, list[Route]]] = {k: {} for k in gateways}
    for kind, items in (
        ("HTTPRoute", cluster.http_routes),
        ("GRPCRoute", cluster.grpc_routes),
        ("TLSRoute", cluster.tls_routes),
        ("TCPRoute", cluster.tcp_routes),
    ):
        routes = _read_all(items, functools.partial(read_route, kind=kind), kind, problems)
        for route in sorted(routes, key=lambda r: r.meta.key):
            _one_route(
                kind,
                route,
                options,
                now,
                gateways,
                services,
                grants,
                labels,
                attached,
                statuses,
                problems,
            )
    return attached


def _one_route(
    kind: str,
    route: RouteFacts,
    options: Options,
    now: str,
    gateways: Mapping[tuple[str, str], GatewayState],
    services: Mapping[tuple[str, str], ServiceFacts],
    grants: list[GrantFacts],
    labels: Mapping[str, Mapping[str, str]],
    attached: dict[tuple[str, str], dict[str, list[Route]]],
    statuses: list[StatusUpdate],
    problems: list[str],
) -> None:
    """One route: attached where it may be (into ``attached``), its status appended."""
    try:
        results, model = _route(kind, route, gateways, services, grants, labels)
    except ObjectError as exc:  # a rule of a shape the API's validation would refuse
        problems.append(f"{kind} {route.meta.name} skipped: {exc}")
        return
    for result in results:
        if result.ref.gateway is None:
            continue
        per_listener = attached[result.ref.gateway]
        for name in result.listeners:
            served = per_listener.setdefault(name, [])
            if model not in served:
                served.append(model)
    if results or _has_ours(route, options.controller):
        status = route_status(
            route,
            results,
            resolved_refs(model.rules),
            controller=options.controller,
            now=now,
        )
        statuses.append(_update(kind, route.meta.namespace, route.meta.name, status, route.status))


def _ingresses(
    cluster: Cluster,
    options: Options,
    services: Mapping[tuple[str, str], ServiceFacts],
    statuses: list[StatusUpdate],
    problems: list[str],
) -> RouteTable:
    """The Ingress table; the status of each Ingress of ours appended."""
    default_class = ingress.is_default_class(cluster.ingress_classes, options.ingress_class)
    ours = [
        obj
        for obj in cluster.ingresses
        if ingress.is_ours(obj, options.ingress_class, default=default_class)
    ]
    routes, found = ingress.ingress_table(
        ours,
        services=services,
        certificates=cluster.certificates,
        http_port=options.ingress_ports[0],
        https_port=options.ingress_ports[1],
    )
    problems.extend(found)
    for obj in ours:
        try:
            namespace, name = objects.identify(obj, "Ingress")
        except ObjectError:
            continue  # said by ingress_table
        status = ingress.ingress_status(obj, cluster.ingress_addresses)
        statuses.append(_update("Ingress", namespace, name, status, objects.field(obj, "status")))
    return routes


def _namespace_labels(namespaces: Sequence[Any]) -> dict[str, Mapping[str, str]]:
    out: dict[str, Mapping[str, str]] = {}
    for obj in namespaces:
        name = objects.field(obj, "metadata", "name")
        if isinstance(name, str):
            try:
                out[name] = objects.string_map(obj, "metadata", "labels")
            except ObjectError:
                out[name] = {}
    return out


def _has_ours(route: RouteFacts, controller: str) -> bool:
    """The route carries a parent entry we wrote earlier (to be dropped now)."""
    return any(
        isinstance(p, Mapping) and p.get("controllerName") == controller
        for p in route.status.get("parents") or ()
    )


def _route(
    kind: str,
    route: RouteFacts,
    gateways: Mapping[tuple[str, str], GatewayState],
    services: Mapping[tuple[str, str], ServiceFacts],
    grants: list[GrantFacts],
    labels: Mapping[str, Mapping[str, str]],
) -> tuple[tuple[ParentResult, ...], Route]:
    """The route's parent results and the route as the table takes it."""
    namespace = route.meta.namespace

    def resolve(ref: Mapping[str, Any]) -> Any:
        return route_backend(
            ref, route_kind=kind, route_namespace=namespace, services=services, grants=grants
        )

    if kind == "HTTPRoute":
        rules, route_problems = read_rules(route.rules, resolve)
    elif kind == "GRPCRoute":
        rules, route_problems = read_grpc_rules(route.rules, resolve)
    else:
        rules, route_problems = read_backend_rules(route.rules, resolve, kind)
    results = attach(route, gateways, labels, route_problems, (GROUP, kind))
    model = Route(
        key=RouteKey(kind, namespace, route.meta.name),
        created=route.meta.created,
        hostnames=route.hostnames,
        rules=rules,
    )
    return results, model


__all__ = [
    "Address",
    "CertificateFacts",
    "Cluster",
    "GatewayRuntime",
    "Options",
    "StatusUpdate",
    "Translation",
    "translate",
]
