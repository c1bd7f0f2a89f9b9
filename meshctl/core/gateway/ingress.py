"""Kubernetes Ingresses (``networking.k8s.io/v1``) of our class on the same engine as the
Gateway API: one route table for all of them, and each one's ``status.loadBalancer``.

Owns Ingress's rules as routes. Ours: ``ingressClassName`` (or the older
``kubernetes.io/ingress.class`` annotation) naming our class, or neither when our IngressClass
is annotated ``ingressclass.kubernetes.io/is-default-class: "true"``. Each rule is a route for
its host (``*.`` = exactly one label; no host = every host); ``pathType`` Exact is Exact,
Prefix and ImplementationSpecific (our choice) are the element-wise prefix; across Ingresses of
a host the longest path wins, Exact before Prefix on a tie, then the oldest Ingress. Port 80
serves every host; port 443 one TLS listener per ``tls[].hosts`` entry (the first Ingress to
name a host owns it; no hosts: every host), with the ``secretName`` of the Ingress's namespace.
``defaultBackend`` (the oldest Ingress's) takes what nothing else matches, on both ports.
Invariant: pure; a path, backend or TLS entry we cannot use is a problem line, never an error.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl.core.k8s.cluster import objects
from meshctl.core.k8s.cluster.objects import ObjectError

from . import paths, table
from .backends import INVALID_KIND, Services, service_backend
from .gatewayapi import Meta, meta, number
from .gateways import Address, CertificateFacts
from .hostnames import ANY
from .model import (
    Backend,
    Entry,
    Listener,
    PathMatch,
    PathType,
    Protocol,
    Route,
    RouteKey,
    RouteMatch,
    RouteTable,
    Rule,
    SecretRef,
)

CLASS = "meshctl"
DEFAULT_CLASS_ANNOTATION = "ingressclass.kubernetes.io/is-default-class"
LEGACY_CLASS_ANNOTATION = "kubernetes.io/ingress.class"
OWNER = "ingress"
# Where the installed ingress gateway's container serves Ingresses (HTTP, HTTPS): its Service
# maps 80 and 443 there, the shape of Istio's demo gateway (8080/8443 need no low-port sysctl).
GATEWAY_PORTS = (8080, 8443)
_PATH_TYPES = {
    "Exact": PathType.EXACT,
    "Prefix": PathType.PREFIX,
    "ImplementationSpecific": PathType.PREFIX,  # documented in docs/gateway.md
}


def is_default_class(ingress_classes: Sequence[Any], class_name: str) -> bool:
    """Our IngressClass exists and takes Ingresses that name no class."""
    for obj in ingress_classes:
        if objects.field(obj, "metadata", "name") == class_name:
            annotations = objects.field(obj, "metadata", "annotations")
            return isinstance(annotations, Mapping) and (
                annotations.get(DEFAULT_CLASS_ANNOTATION) == "true"
            )
    return False


def is_ours(obj: Any, class_name: str, *, default: bool) -> bool:
    named = objects.field(obj, "spec", "ingressClassName")
    if not isinstance(named, str) or not named:
        annotations = objects.field(obj, "metadata", "annotations")
        legacy = (
            annotations.get(LEGACY_CLASS_ANNOTATION) if isinstance(annotations, Mapping) else None
        )
        named = legacy if isinstance(legacy, str) else ""
    return named == class_name if named else default


def _backend(obj: Any, namespace: str, services: Services) -> Backend:
    if objects.field(obj, "resource") is not None:
        name = objects.text(obj, "resource", "name")
        return Backend(
            namespace=namespace,
            name=name,
            port=0,
            problem=INVALID_KIND,
            detail=f"resource backend {name} is not a Service",
        )
    return service_backend(
        services,
        namespace,
        objects.text(obj, "service", "name"),
        port=number(obj, "service", "port", "number"),
        port_name=objects.text(obj, "service", "port", "name"),
    )


@dataclass(frozen=True, slots=True, kw_only=True)
class IngressFacts:
    meta: Meta
    routes: tuple[Route, ...]  # one per rule, for its host
    fallback: Rule | None  # defaultBackend
    tls: tuple[tuple[tuple[str, ...], str], ...]  # (hosts, secretName) per tls[] entry


def read_ingress(obj: Any, services: Services, problems: list[str]) -> IngressFacts:
    """What we serve of an Ingress; a part we cannot use is a problem line."""
    m = meta(obj, "Ingress")
    key = RouteKey("Ingress", m.namespace, m.name)
    routes = []
    counter = 0  # rule indexes run across the Ingress: ties keep the document's order
    for i, rule in enumerate(objects.items(obj, "spec", "rules")):
        host = objects.text(rule, "host").lower()
        built = []
        for j, p in enumerate(objects.items(rule, "http", "paths")):
            where = f"Ingress {m.namespace}/{m.name} rules[{i}].paths[{j}]"
            kind = objects.text(p, "pathType", default="ImplementationSpecific")
            value = objects.text(p, "path") or "/"
            if kind not in _PATH_TYPES:
                problems.append(f"{where}: pathType {kind} is not supported")
                continue
            bad = paths.invalid_path(value)
            if bad:
                problems.append(f"{where}: {bad}")
                continue
            built.append(
                Rule(
                    index=counter,
                    name=f"rules[{i}].paths[{j}]",
                    matches=(
                        RouteMatch(
                            path=PathMatch(_PATH_TYPES[kind], paths.decode_unreserved(value))
                        ),
                    ),
                    backends=(_backend(objects.field(p, "backend"), m.namespace, services),),
                )
            )
            counter += 1
        if built:
            routes.append(
                Route(
                    key=key,
                    created=m.created,
                    hostnames=(host,) if host else (),
                    rules=tuple(built),
                )
            )
    default = objects.field(obj, "spec", "defaultBackend")
    fallback = None
    if default is not None:
        fallback = Rule(
            index=counter,
            name="defaultBackend",
            backends=(_backend(default, m.namespace, services),),
        )
    tls = tuple(
        (
            tuple(str(h).lower() for h in objects.items(entry, "hosts")),
            objects.text(entry, "secretName"),
        )
        for entry in objects.items(obj, "spec", "tls")
    )
    return IngressFacts(meta=m, routes=tuple(routes), fallback=fallback, tls=tls)


def ingress_table(
    ingresses: Sequence[Any],
    *,
    services: Services,
    certificates: Mapping[tuple[str, str], CertificateFacts],
    http_port: int = 80,
    https_port: int = 443,
) -> tuple[RouteTable, list[str]]:
    """One table for every Ingress of ours (empty without any), and the problems found."""
    problems: list[str] = []
    read: list[IngressFacts] = []
    for obj in ingresses:
        try:
            read.append(read_ingress(obj, services, problems))
        except ObjectError as exc:
            problems.append(f"Ingress skipped: {exc}")
    if not read:
        return RouteTable(one_label_wildcards=True), problems
    read.sort(key=lambda r: (r.meta.created or "~", f"{r.meta.namespace}/{r.meta.name}"))
    routes = [route for ing in read for route in ing.routes]
    default = next(
        (
            Entry(
                route=RouteKey("Ingress", ing.meta.namespace, ing.meta.name),
                created=ing.meta.created,
                rule=ing.fallback,
                match_index=0,
                match=ing.fallback.matches[0],
            )
            for ing in read
            if ing.fallback is not None  # the oldest Ingress's
        ),
        None,
    )
    served: list[tuple[Listener, list[Route]]] = [
        (Listener(owner=OWNER, name="http", port=http_port, protocol=Protocol.HTTP), routes)
    ]
    owners: dict[str, str] = {}
    for ing in read:
        m = ing.meta
        for i, (hosts, secret) in enumerate(ing.tls):
            where = f"Ingress {m.namespace}/{m.name} tls[{i}]"
            facts = certificates.get((m.namespace, secret))
            if not secret:
                problems.append(f"{where}: no secretName")
                continue
            if facts is None or not facts.valid:
                why = "not found" if facts is None else (facts.message or "invalid")
                problems.append(f"{where}: Secret {m.namespace}/{secret} {why}")
                continue
            for host in hosts or (ANY,):
                if host in owners:
                    problems.append(f"{where}: host {host} already has TLS from {owners[host]}")
                    continue
                owners[host] = f"Ingress {m.namespace}/{m.name}"
                listener = Listener(
                    owner=OWNER,
                    name=f"https:{host}",
                    port=https_port,
                    protocol=Protocol.HTTPS,
                    hostname=host,
                    certificates=(SecretRef(m.namespace, secret),),
                )
                served.append((listener, routes))
    return table.build(served, one_label=True, default=default), problems


def ingress_status(obj: Any, addresses: Sequence[Address]) -> dict[str, Any]:
    """``status`` of an Ingress of ours: the gateway's addresses as ``loadBalancer.ingress``."""
    entries = [
        {"hostname": a.value} if a.type == "Hostname" else {"ip": a.value} for a in addresses
    ]
    return {"loadBalancer": {"ingress": entries}}
