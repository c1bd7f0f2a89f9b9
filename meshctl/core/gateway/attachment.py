"""Routes (HTTPRoute, TLSRoute) attached to our Gateways' listeners, and each route's
``status.parents``.

Owns attachment by the API's rules, per parentRef to a Gateway of ours: the listeners it names
(``sectionName`` and ``port``, when set; none: ``NoMatchingParent``), of them those whose
``allowedRoutes`` take the route's kind from its namespace (none: ``NotAllowedByListeners``),
of them those sharing a hostname with the route (none: ``NoMatchingListenerHostname``); a route
with an unsupported value attaches nowhere (``UnsupportedValue``). ``ResolvedRefs`` sums the
route's backendRefs. Invariants: pure; parentRefs to Gateways that are not ours get no entry;
entries other controllers wrote are kept; ours are rewritten whole (stale ones dropped).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl.core.k8s import labelselector
from meshctl.core.k8s.cluster.objects import ObjectError

from . import conditions
from .conditions import Condition
from .gatewayapi import (
    HTTPROUTE,
    ParentRef,
    RouteFacts,
    conditions_of,
    read_parent,
)
from .gateways import GatewayState, ListenerState
from .model import Rule
from .rules import Problem
from .table import effective_hostnames


@dataclass(frozen=True, slots=True, kw_only=True)
class ParentResult:
    ref: ParentRef
    accepted: Condition
    listeners: tuple[str, ...] = ()  # the listeners the route attached to (when accepted)


def _allows(
    ls: ListenerState,
    gateway_namespace: str,
    route_namespace: str,
    labels: Mapping[str, str],
    kind: tuple[str, str],
) -> bool:
    if kind not in ls.supported_kinds:
        return False
    allowed = ls.spec.allowed
    if allowed.namespaces == "All":
        return True
    if allowed.namespaces == "Selector":
        return labelselector.holds(allowed.selector, labels)
    if allowed.namespaces == "Same":
        return route_namespace == gateway_namespace
    return False  # None, or a value the API does not define


def attach(
    route: RouteFacts,
    gateways: Mapping[tuple[str, str], GatewayState],
    namespace_labels: Mapping[str, Mapping[str, str]],
    problems: Sequence[Problem],
    kind: tuple[str, str] = HTTPROUTE,
) -> tuple[ParentResult, ...]:
    """One result per parentRef to a Gateway of ours, in the spec's order (``kind``: the
    route's group and kind, which a listener must take)."""
    out = []
    labels = namespace_labels.get(route.meta.namespace, {})
    for ref in route.parents:
        gateway = gateways.get(ref.gateway) if ref.gateway is not None else None
        if gateway is None:
            continue
        named = [
            ls
            for ls in gateway.listeners
            if (not ref.section or ls.spec.name == ref.section)
            and (not ref.port or ls.spec.port == ref.port)
        ]
        allowed = [
            ls
            for ls in named
            if _allows(ls, gateway.facts.meta.namespace, route.meta.namespace, labels, kind)
        ]
        hosted = [
            ls for ls in allowed if effective_hostnames(ls.listener.hostname, route.hostnames)
        ]
        if not named:
            accepted = Condition("Accepted", False, "NoMatchingParent", _no_listener(ref))
        elif not allowed:
            taking = any(kind in ls.supported_kinds for ls in named)
            why = f"from namespace {route.meta.namespace}" if taking else "at all"
            accepted = Condition(
                "Accepted",
                False,
                "NotAllowedByListeners",
                f"no listener of {ref.namespace}/{ref.name} takes {kind[1]}s {why}",
            )
        elif not hosted:
            accepted = Condition(
                "Accepted",
                False,
                "NoMatchingListenerHostname",
                f"no listener hostname intersects {', '.join(route.hostnames)}",
            )
        elif problems:
            accepted = Condition(
                "Accepted", False, problems[0][0], "; ".join(m for _, m in problems)
            )
        else:
            names = ", ".join(ls.spec.name for ls in hosted)
            out.append(
                ParentResult(
                    ref=ref,
                    accepted=Condition("Accepted", True, "Accepted", f"attached to {names}"),
                    listeners=tuple(ls.spec.name for ls in hosted),
                )
            )
            continue
        out.append(ParentResult(ref=ref, accepted=accepted))
    return tuple(out)


def _no_listener(ref: ParentRef) -> str:
    wanted = []
    if ref.section:
        wanted.append(f"named {ref.section}")
    if ref.port:
        wanted.append(f"on port {ref.port}")
    return f"{ref.namespace}/{ref.name} has no listener {' '.join(wanted)}"


def resolved_refs(rules: Sequence[Rule]) -> Condition:
    """The route's ResolvedRefs: True when every backendRef resolves, else the first problem's
    reason with every problem in the message."""
    bad = [b for rule in rules for b in rule.backends if not b.resolved]
    if not bad:
        return Condition("ResolvedRefs", True, "ResolvedRefs", "references resolved")
    messages = dict.fromkeys(b.detail or b.problem for b in bad)  # each problem once, in order
    return Condition("ResolvedRefs", False, bad[0].problem, "; ".join(messages))


def _same_parent(entry: Any, ref: ParentRef, namespace: str) -> bool:
    try:
        other = read_parent(entry.get("parentRef"), namespace)
    except ObjectError:
        return False
    return (other.group, other.kind, other.namespace, other.name, other.section, other.port) == (
        ref.group,
        ref.kind,
        ref.namespace,
        ref.name,
        ref.section,
        ref.port,
    )


def route_status(
    route: RouteFacts,
    results: Sequence[ParentResult],
    resolved: Condition,
    *,
    controller: str,
    now: str,
) -> dict[str, Any]:
    """``status`` of the route: other controllers' parents as they were, then ours."""
    before = [p for p in route.status.get("parents") or () if isinstance(p, Mapping)]
    theirs = [dict(p) for p in before if p.get("controllerName") != controller]
    ours = [p for p in before if p.get("controllerName") == controller]
    parents = list(theirs)
    for result in results:
        previous = next(
            (p for p in ours if _same_parent(p, result.ref, route.meta.namespace)), None
        )
        parents.append(
            {
                "parentRef": dict(result.ref.spec),
                "controllerName": controller,
                "conditions": conditions.merge(
                    [result.accepted, resolved],
                    conditions_of(previous, "conditions"),
                    generation=route.meta.generation,
                    now=now,
                ),
            }
        )
    return {"parents": parents}
