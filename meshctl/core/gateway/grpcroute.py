"""GRPCRoute rules (``spec.rules[]``, ``gateway.networking.k8s.io/v1``) read into the model's
rules, with what we do not support said per field.

Owns which parts of GRPCRoute the gateway implements: method matches of type Exact (service,
method or both), header matches of type Exact, filters RequestHeaderModifier and
ResponseHeaderModifier, weighted backendRefs. RegularExpression matches are refused for the
reason ``rules`` gives (no backtracking regex on the request path), as are RequestMirror,
ExtensionRef and backendRef filters: ``UnsupportedValue``, the route not accepted. A match
keeps the root path; ``rpc`` carries the method match (``grpc.method_holds``). Invariants:
pure; backendRefs are resolved by the caller's function.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from meshctl.core.k8s.cluster import objects

from .model import NO_FILTERS, Filters, HeaderMatch, HeaderModifier, RouteMatch, RpcMatch, Rule
from .rules import UNSUPPORTED, Problem, Resolver, header_modifier


def read_grpc_rules(
    rules: Sequence[Mapping[str, Any]], resolve: Resolver
) -> tuple[tuple[Rule, ...], tuple[Problem, ...]]:
    """The GRPCRoute's rules, and every problem that keeps it from being accepted."""
    problems: list[Problem] = []
    out = []
    for i, rule in enumerate(rules):
        where = f"rules[{i}]"
        matches = tuple(
            _match(m, f"{where}.matches[{j}]", problems)
            for j, m in enumerate(objects.items(rule, "matches"))
        ) or (RouteMatch(),)
        refs = objects.items(rule, "backendRefs")
        for j, ref in enumerate(refs):
            if objects.items(ref, "filters"):
                problems.append((UNSUPPORTED, f"{where}.backendRefs[{j}].filters: not supported"))
        out.append(
            Rule(
                index=i,
                name=objects.text(rule, "name"),
                matches=matches,
                filters=_filters(objects.items(rule, "filters"), where, problems),
                backends=tuple(resolve(ref) for ref in refs if isinstance(ref, Mapping)),
            )
        )
    return tuple(out), tuple(problems)


def _match(obj: Any, where: str, problems: list[Problem]) -> RouteMatch:
    rpc: RpcMatch | None = None
    if objects.field(obj, "method") is not None:
        kind = objects.text(obj, "method", "type", default="Exact")
        if kind != "Exact":
            problems.append((UNSUPPORTED, f"{where}.method: type {kind} is not supported"))
        service = objects.text(obj, "method", "service")
        method = objects.text(obj, "method", "method")
        if service or method:  # the API requires one of them; neither matches any method
            rpc = RpcMatch(service=service, method=method)
    headers: dict[str, HeaderMatch] = {}
    for h in objects.items(obj, "headers"):
        kind = objects.text(h, "type", default="Exact")
        name = objects.text(h, "name").lower()
        if kind != "Exact":
            problems.append((UNSUPPORTED, f"{where}.headers[{name}]: type {kind} is not supported"))
        headers.setdefault(name, HeaderMatch(name, objects.text(h, "value")))  # first one counts
    return RouteMatch(headers=tuple(headers.values()), rpc=rpc)


def _filters(items: list[Any], where: str, problems: list[Problem]) -> Filters:
    if not items:
        return NO_FILTERS
    request: HeaderModifier | None = None
    response: HeaderModifier | None = None
    for i, f in enumerate(items):
        kind = objects.text(f, "type")
        if kind == "RequestHeaderModifier":
            request = header_modifier(objects.field(f, "requestHeaderModifier"))
        elif kind == "ResponseHeaderModifier":
            response = header_modifier(objects.field(f, "responseHeaderModifier"))
        else:
            what = kind or "(no type)"
            problems.append((UNSUPPORTED, f"{where}.filters[{i}]: filter {what} is not supported"))
    return Filters(request_headers=request, response_headers=response)
