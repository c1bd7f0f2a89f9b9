"""What ``meshctl verify`` says of the gateways: read from the status the controller wrote.

Owns the findings over GatewayClass, Gateway and HTTPRoute objects as the API server returns
them: which Gateways of meshctl's classes are not Programmed (and why, in the controller's own
words), and which HTTPRoute parent references to those Gateways are not Accepted or have
unresolved references. A status written for an older generation is stale and reported as such
(the controller has not caught up), never read as current. Invariant: pure; objects of other
controllers' classes are not ours to judge and are left out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from .gatewayapi import CONTROLLER

GROUP = "gateway.networking.k8s.io"


def _map(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _list(value: object) -> list[Any]:
    return list(value) if isinstance(value, list) else []


def _name(obj: Mapping[str, Any]) -> str:
    meta = _map(obj.get("metadata"))
    return f"{meta.get('namespace', '')}/{meta.get('name', '')}"


def _condition(conditions: object, kind: str) -> Mapping[str, Any] | None:
    return next((c for c in map(_map, _list(conditions)) if c.get("type") == kind), None)


def _verdict(conditions: object, kind: str, generation: object) -> str:
    """ "" when ``kind`` is True for ``generation``; else why not, one phrase."""
    cond = _condition(conditions, kind)
    if cond is None:
        return f"no {kind} condition yet"
    observed = cond.get("observedGeneration")
    if isinstance(generation, int) and isinstance(observed, int) and observed < generation:
        return f"{kind} is for generation {observed}, the object is at {generation}"
    if cond.get("status") != "True":
        reason = cond.get("reason") or "?"
        message = cond.get("message") or ""
        return f"{kind}={cond.get('status')} {reason}" + (f": {message}" if message else "")
    return ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Findings:
    gateways: tuple[str, ...]  # "<ns>/<name>" of every Gateway of ours
    unprogrammed: tuple[str, ...]  # "<ns>/<name>: <why>"
    routes: int  # HTTPRoutes with a parent reference to a Gateway of ours
    unattached: tuple[str, ...]  # "HTTPRoute <ns>/<name> -> <ns>/<gateway>: <why>"


def ours(classes: Sequence[Mapping[str, Any]], controller: str = CONTROLLER) -> set[str]:
    """The names of the GatewayClasses whose controllerName is ``controller``."""
    return {
        str(_map(c.get("metadata")).get("name"))
        for c in classes
        if _map(c.get("spec")).get("controllerName") == controller
    }


def findings(
    classes: Sequence[Mapping[str, Any]],
    gateways: Sequence[Mapping[str, Any]],
    routes: Sequence[Mapping[str, Any]],
    *,
    controller: str = CONTROLLER,
) -> Findings:
    names = ours(classes, controller)
    mine: dict[str, Mapping[str, Any]] = {}
    unprogrammed = []
    for gw in gateways:
        if _map(gw.get("spec")).get("gatewayClassName") not in names:
            continue
        key = _name(gw)
        mine[key] = gw
        generation = _map(gw.get("metadata")).get("generation")
        conditions = _map(gw.get("status")).get("conditions")
        why = _verdict(conditions, "Accepted", generation) or _verdict(
            conditions, "Programmed", generation
        )
        if why:
            unprogrammed.append(f"{key}: {why}")
    counted, unattached = 0, []
    for route in routes:
        meta = _map(route.get("metadata"))
        namespace = str(meta.get("namespace", ""))
        parents = _list(_map(route.get("status")).get("parents"))
        refs = [_map(r) for r in _list(_map(route.get("spec")).get("parentRefs"))]
        targets = [
            (ref, f"{ref.get('namespace') or namespace}/{ref.get('name', '')}")
            for ref in refs
            if ref.get("group", GROUP) == GROUP and ref.get("kind", "Gateway") == "Gateway"
        ]
        targets = [(ref, key) for ref, key in targets if key in mine]
        if not targets:
            continue
        counted += 1
        for ref, key in targets:
            status = next(
                (
                    p
                    for p in map(_map, parents)
                    if p.get("controllerName") == controller
                    and _same_parent(_map(p.get("parentRef")), ref, namespace)
                ),
                None,
            )
            if status is None:
                why = "no status from the controller for this parent yet"
            else:
                conditions = status.get("conditions")
                why = _verdict(conditions, "Accepted", meta.get("generation")) or _verdict(
                    conditions, "ResolvedRefs", meta.get("generation")
                )
            if why:
                unattached.append(f"HTTPRoute {_name(route)} -> {key}: {why}")
    return Findings(
        gateways=tuple(sorted(mine)),
        unprogrammed=tuple(sorted(unprogrammed)),
        routes=counted,
        unattached=tuple(sorted(unattached)),
    )


def _same_parent(written: Mapping[str, Any], ref: Mapping[str, Any], namespace: str) -> bool:
    """The status entry is for ``ref`` (same name, namespace, section and port)."""
    return (
        written.get("name") == ref.get("name")
        and (written.get("namespace") or namespace) == (ref.get("namespace") or namespace)
        and written.get("sectionName") == ref.get("sectionName")
        and written.get("port") == ref.get("port")
    )
