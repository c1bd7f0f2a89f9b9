"""Gateway API objects (``gateway.networking.k8s.io/v1``, as the API serves them) read into the
facts translation needs: GatewayClasses, Gateways and their listeners, HTTPRoutes, GRPCRoutes,
TLSRoutes and TCPRoutes and their parentRefs, ReferenceGrants; and the label selectors of
``allowedRoutes``.

Owns the API's defaults (parentRef group/kind/namespace, listener ``allowedRoutes`` ``Same``,
TLS mode ``Terminate``, certificateRef group ``""``/kind ``Secret``). Invariants: pure; a
malformed object raises ``ObjectError`` naming the field (the caller skips that object), any
other shape of input is read, never trusted to be valid.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshctl.core.k8s.cluster import objects
from meshctl.core.k8s.cluster.objects import ObjectError
from meshctl.core.k8s.labelselector import Requirement

from . import eastwest
from .hostnames import ANY
from .model import ALLOW_SAME, AllowedRoutes

GROUP = "gateway.networking.k8s.io"
CONTROLLER = "meshctl.io/gateway-controller"
HTTPROUTE = (GROUP, "HTTPRoute")
GRPCROUTE = (GROUP, "GRPCRoute")
TLSROUTE = (GROUP, "TLSRoute")
TCPROUTE = (GROUP, "TCPRoute")


@dataclass(frozen=True, slots=True, kw_only=True)
class Meta:
    namespace: str
    name: str
    generation: int = 0
    created: str = ""

    @property
    def key(self) -> tuple[str, str]:
        return (self.namespace, self.name)


def meta(obj: Any, kind: str, *, namespaced: bool = True) -> Meta:
    if namespaced:
        namespace, name = objects.identify(obj, kind)
    else:
        namespace, name = "", objects.text(obj, "metadata", "name")
        if not name:
            raise ObjectError(f"{kind} without metadata.name")
    return Meta(
        namespace=namespace,
        name=name,
        generation=number(obj, "metadata", "generation"),
        created=objects.text(obj, "metadata", "creationTimestamp"),
    )


def number(obj: Any, *path: str, default: int = 0) -> int:
    value = objects.field(obj, *path)
    if value is None:
        return default
    if not isinstance(value, int) or isinstance(value, bool):
        raise ObjectError(f"{'.'.join(path)} is {type(value).__name__}, not a number")
    return value


def conditions_of(obj: Any, *path: str) -> list[dict[str, Any]]:
    """Earlier conditions (to keep their transition times); malformed entries are dropped."""
    value = objects.field(obj, *path)
    if not isinstance(value, list):
        return []
    return [c for c in value if isinstance(c, dict) and isinstance(c.get("type"), str)]


@dataclass(frozen=True, slots=True, kw_only=True)
class ObjectRef:
    group: str
    kind: str
    namespace: str
    name: str


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenerSpec:
    name: str
    port: int
    protocol: str
    hostname: str = ANY
    tls_mode: str = "Terminate"
    certificate_refs: tuple[ObjectRef, ...] = ()
    allowed: AllowedRoutes = ALLOW_SAME
    kinds_given: bool = False  # allowedRoutes.kinds set (else: by protocol)
    auto_passthrough: bool = False  # Istio's east-west listener (``eastwest``)


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayClassFacts:
    meta: Meta
    controller: str
    parameters: bool  # spec.parametersRef set (we take none)
    status: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayFacts:
    meta: Meta
    class_name: str
    listeners: tuple[ListenerSpec, ...] = ()
    requested_addresses: int = 0  # spec.addresses (we assign our own)
    infrastructure_parameters: bool = False
    status: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class ParentRef:
    group: str
    kind: str
    namespace: str
    name: str
    section: str = ""
    port: int = 0
    spec: Mapping[str, Any] = field(default_factory=dict)  # as written: status echoes it

    @property
    def gateway(self) -> tuple[str, str] | None:
        return (
            (self.namespace, self.name) if (self.group, self.kind) == (GROUP, "Gateway") else None
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class RouteFacts:
    meta: Meta
    hostnames: tuple[str, ...] = ()
    parents: tuple[ParentRef, ...] = ()
    rules: tuple[Mapping[str, Any], ...] = ()
    status: Mapping[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class GrantFacts:
    namespace: str
    sources: tuple[tuple[str, str, str], ...] = ()  # (group, kind, namespace)
    targets: tuple[tuple[str, str, str], ...] = ()  # (group, kind, name or "" for all)


def _status(obj: Any) -> Mapping[str, Any]:
    value = objects.field(obj, "status")
    return value if isinstance(value, Mapping) else {}


def read_gateway_class(obj: Any) -> GatewayClassFacts:
    return GatewayClassFacts(
        meta=meta(obj, "GatewayClass", namespaced=False),
        controller=objects.text(obj, "spec", "controllerName"),
        parameters=objects.field(obj, "spec", "parametersRef") is not None,
        status=_status(obj),
    )


def read_selector(obj: Any, *path: str) -> tuple[Requirement, ...]:
    """A metav1.LabelSelector as requirements; an operator the API does not know holds never."""
    reqs: list[Requirement] = [
        (k, "In", (v,)) for k, v in sorted(objects.string_map(obj, *path, "matchLabels").items())
    ]
    for expr in objects.items(obj, *path, "matchExpressions"):
        values = tuple(str(v) for v in objects.items(expr, "values"))
        reqs.append((objects.text(expr, "key"), objects.text(expr, "operator"), values))
    return tuple(reqs)


def _listener(obj: Any, namespace: str, labels: Mapping[str, str]) -> ListenerSpec:
    name = objects.text(obj, "name")
    if not name:
        raise ObjectError("spec.listeners[] without a name")
    refs = []
    for ref in objects.items(obj, "tls", "certificateRefs"):
        refs.append(
            ObjectRef(
                group=objects.text(ref, "group"),
                kind=objects.text(ref, "kind", default="Secret"),
                namespace=objects.text(ref, "namespace", default=namespace),
                name=objects.text(ref, "name"),
            )
        )
    kinds = tuple(
        (objects.text(k, "group", default=GROUP), objects.text(k, "kind"))
        for k in objects.items(obj, "allowedRoutes", "kinds")
    )
    selector: tuple[Requirement, ...] = ()
    namespaces = objects.text(obj, "allowedRoutes", "namespaces", "from", default="Same")
    if namespaces == "Selector":
        selector = read_selector(obj, "allowedRoutes", "namespaces", "selector")
    port = number(obj, "port")
    auto = eastwest.is_auto_passthrough(
        labels,
        port,
        has_tls=isinstance(objects.field(obj, "tls"), Mapping),
        tls_options=objects.string_map(obj, "tls", "options"),
    )
    return ListenerSpec(
        name=name,
        port=port,
        protocol=objects.text(obj, "protocol"),
        hostname=objects.text(obj, "hostname", default=ANY).lower() or ANY,
        tls_mode=objects.text(obj, "tls", "mode", default="Terminate"),
        certificate_refs=tuple(refs),
        allowed=AllowedRoutes(namespaces=namespaces, selector=selector, kinds=kinds),
        kinds_given=bool(kinds),
        auto_passthrough=auto,
    )


def read_gateway(obj: Any) -> GatewayFacts:
    m = meta(obj, "Gateway")
    labels = objects.string_map(obj, "metadata", "labels")
    return GatewayFacts(
        meta=m,
        class_name=objects.text(obj, "spec", "gatewayClassName"),
        listeners=tuple(
            _listener(x, m.namespace, labels) for x in objects.items(obj, "spec", "listeners")
        ),
        requested_addresses=len(objects.items(obj, "spec", "addresses")),
        infrastructure_parameters=(
            objects.field(obj, "spec", "infrastructure", "parametersRef") is not None
        ),
        status=_status(obj),
    )


def read_parent(obj: Any, namespace: str) -> ParentRef:
    if not isinstance(obj, Mapping):
        raise ObjectError("spec.parentRefs[] is not an object")
    return ParentRef(
        group=objects.text(obj, "group", default=GROUP),
        kind=objects.text(obj, "kind", default="Gateway"),
        namespace=objects.text(obj, "namespace", default=namespace) or namespace,
        name=objects.text(obj, "name"),
        section=objects.text(obj, "sectionName"),
        port=number(obj, "port"),
        spec=dict(obj),
    )


def read_route(obj: Any, kind: str = "HTTPRoute") -> RouteFacts:
    """An HTTPRoute, GRPCRoute, TLSRoute or TCPRoute (``kind``): the parts they share (TLSRoute and
    TCPRoute rules carry only backendRefs, TCPRoute has no hostnames; the caller reads rules by
    kind)."""
    m = meta(obj, kind)
    hosts = []
    for h in objects.items(obj, "spec", "hostnames"):
        if not isinstance(h, str):
            raise ObjectError("spec.hostnames[] is not a string")
        hosts.append(h.lower())
    rules = objects.items(obj, "spec", "rules")
    if not all(isinstance(r, Mapping) for r in rules):
        raise ObjectError("spec.rules[] is not an object")
    return RouteFacts(
        meta=m,
        hostnames=tuple(hosts),
        parents=tuple(
            read_parent(p, m.namespace) for p in objects.items(obj, "spec", "parentRefs")
        ),
        rules=tuple(rules),
        status=_status(obj),
    )


def read_grant(obj: Any) -> GrantFacts:
    namespace, _ = objects.identify(obj, "ReferenceGrant")
    return GrantFacts(
        namespace=namespace,
        sources=tuple(
            (objects.text(f, "group"), objects.text(f, "kind"), objects.text(f, "namespace"))
            for f in objects.items(obj, "spec", "from")
        ),
        targets=tuple(
            (objects.text(t, "group"), objects.text(t, "kind"), objects.text(t, "name"))
            for t in objects.items(obj, "spec", "to")
        ),
    )


def permits(
    grants: list[GrantFacts], source: tuple[str, str, str], target: tuple[str, str, str, str]
) -> bool:
    """A reference from ``source`` (group, kind, namespace) to ``target`` (group, kind,
    namespace, name) is allowed: same namespace, or a ReferenceGrant in the target's namespace
    lists the source and the target (by name, or all of its kind)."""
    group, kind, namespace, name = target
    if source[2] == namespace:
        return True
    return any(
        grant.namespace == namespace
        and source in grant.sources
        and any(t[:2] == (group, kind) and t[2] in ("", name) for t in grant.targets)
        for grant in grants
    )
