"""HTTPRoute rules (``spec.rules[]``) read into the model's rules, with what we do not support
said per field.

Owns which parts of the API the gateway implements: path matches Exact and PathPrefix; header
and query-param matches Exact; methods of the API's enum; filters RequestHeaderModifier,
ResponseHeaderModifier, RequestRedirect (301/302/303/307/308) and URLRewrite; ``timeouts``.
RegularExpression matches are refused: Python's regex engine backtracks, and a route's author
must not be able to make a request's path cost the proxy exponential time. A refusal is a
``(reason, message)`` problem (``UnsupportedValue`` or ``IncompatibleFilters``) that rejects the
route (Accepted=False). Invariants: pure; backendRefs are resolved by the caller's function.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from meshctl.core.k8s.cluster import objects

from . import paths
from .gatewayapi import number
from .model import (
    NO_FILTERS,
    Backend,
    Filters,
    HeaderMatch,
    HeaderModifier,
    PathMatch,
    PathModifier,
    PathModifierType,
    PathType,
    QueryMatch,
    Redirect,
    Rewrite,
    RouteMatch,
    Rule,
    Timeouts,
)

Problem = tuple[str, str]  # (route condition reason, message)
Resolver = Callable[[Mapping[str, Any]], Backend]

UNSUPPORTED = "UnsupportedValue"
INCOMPATIBLE = "IncompatibleFilters"
METHODS = frozenset(
    {"GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"}
)
REDIRECT_CODES = frozenset({301, 302, 303, 307, 308})
_DURATION = re.compile(r"(?:[0-9]{1,5}(?:h|ms|m|s)){1,4}")  # GEP-2257
_DURATION_PART = re.compile(r"([0-9]{1,5})(h|ms|m|s)")
_UNIT_MS = {"h": 3_600_000, "m": 60_000, "s": 1000, "ms": 1}


def duration_ms(text: str) -> int | None:
    """A Gateway API duration (``1h``, ``10s``, ``1m30s``, ``500ms``) in milliseconds, or None."""
    if not _DURATION.fullmatch(text):
        return None
    return sum(int(n) * _UNIT_MS[unit] for n, unit in _DURATION_PART.findall(text))


def read_rules(
    rules: Sequence[Mapping[str, Any]], resolve: Resolver
) -> tuple[tuple[Rule, ...], tuple[Problem, ...]]:
    """The route's rules, and every problem that keeps it from being accepted."""
    problems: list[Problem] = []
    out = []
    for i, rule in enumerate(rules):
        where = f"rules[{i}]"
        matches = tuple(
            _match(m, f"{where}.matches[{j}]", problems)
            for j, m in enumerate(objects.items(rule, "matches"))
        ) or (RouteMatch(),)
        filters = _filters(objects.items(rule, "filters"), where, matches, problems)
        refs = objects.items(rule, "backendRefs")
        for j, ref in enumerate(refs):
            if objects.items(ref, "filters"):
                problems.append((UNSUPPORTED, f"{where}.backendRefs[{j}].filters: not supported"))
        out.append(
            Rule(
                index=i,
                name=objects.text(rule, "name"),
                matches=matches,
                filters=filters,
                backends=tuple(resolve(ref) for ref in refs if isinstance(ref, Mapping)),
                timeouts=_timeouts(rule, where, problems),
            )
        )
    return tuple(out), tuple(problems)


def read_backend_rules(
    rules: Sequence[Mapping[str, Any]], resolve: Resolver, kind: str
) -> tuple[tuple[Rule, ...], tuple[Problem, ...]]:
    """A TLSRoute's or TCPRoute's rules: backendRefs and a name, nothing to match on. The API
    (v1) allows exactly one rule: with no matches a second could never take a connection, so
    more than one (v1alpha2 allowed 16) is refused rather than silently ignored."""
    problems: list[Problem] = []
    if len(rules) > 1:
        problems.append((UNSUPPORTED, f"rules: a {kind} takes one rule, not {len(rules)}"))
    out = []
    for i, rule in enumerate(rules):
        refs = objects.items(rule, "backendRefs")
        for j, ref in enumerate(refs):
            if objects.items(ref, "filters"):
                problems.append(
                    (UNSUPPORTED, f"rules[{i}].backendRefs[{j}].filters: not supported")
                )
        out.append(
            Rule(
                index=i,
                name=objects.text(rule, "name"),
                backends=tuple(resolve(ref) for ref in refs if isinstance(ref, Mapping)),
            )
        )
    return tuple(out), tuple(problems)


def _match(obj: Any, where: str, problems: list[Problem]) -> RouteMatch:
    kind = objects.text(obj, "path", "type", default="PathPrefix")
    value = objects.text(obj, "path", "value", default="/")
    path = PathMatch(PathType.PREFIX, "/")
    if kind in ("Exact", "PathPrefix"):
        bad = paths.invalid_path(value)
        if bad:
            problems.append((UNSUPPORTED, f"{where}.path: {bad}"))
        else:
            path = PathMatch(PathType(kind), paths.decode_unreserved(value))  # as requests are
    else:
        problems.append((UNSUPPORTED, f"{where}.path: type {kind} is not supported"))
    method = objects.text(obj, "method")
    if method and method not in METHODS:
        problems.append((UNSUPPORTED, f"{where}.method: {method} is not supported"))
    headers: dict[str, HeaderMatch] = {}
    for h in objects.items(obj, "headers"):
        kind = objects.text(h, "type", default="Exact")
        name = objects.text(h, "name").lower()
        if kind != "Exact":
            problems.append((UNSUPPORTED, f"{where}.headers[{name}]: type {kind} is not supported"))
        headers.setdefault(name, HeaderMatch(name, objects.text(h, "value")))  # first one counts
    query: dict[str, QueryMatch] = {}
    for q in objects.items(obj, "queryParams"):
        kind = objects.text(q, "type", default="Exact")
        name = objects.text(q, "name")
        if kind != "Exact":
            problems.append(
                (UNSUPPORTED, f"{where}.queryParams[{name}]: type {kind} is not supported")
            )
        query.setdefault(name, QueryMatch(name, objects.text(q, "value")))
    return RouteMatch(
        path=path, method=method, headers=tuple(headers.values()), query=tuple(query.values())
    )


def header_modifier(obj: Any) -> HeaderModifier:
    return HeaderModifier(
        set=tuple(
            (objects.text(h, "name"), objects.text(h, "value")) for h in objects.items(obj, "set")
        ),
        add=tuple(
            (objects.text(h, "name"), objects.text(h, "value")) for h in objects.items(obj, "add")
        ),
        remove=tuple(str(n) for n in objects.items(obj, "remove")),
    )


def _path_modifier(
    obj: Any, where: str, matches: tuple[RouteMatch, ...], problems: list[Problem]
) -> PathModifier | None:
    if objects.field(obj, "path") is None:
        return None
    kind = objects.text(obj, "path", "type")
    if kind == PathModifierType.FULL:
        return PathModifier(PathModifierType.FULL, objects.text(obj, "path", "replaceFullPath"))
    if kind == PathModifierType.PREFIX:
        if len(matches) != 1 or matches[0].path.type is not PathType.PREFIX:
            problems.append(
                (
                    UNSUPPORTED,
                    f"{where}.path: ReplacePrefixMatch needs exactly one PathPrefix match",
                )
            )
        return PathModifier(
            PathModifierType.PREFIX, objects.text(obj, "path", "replacePrefixMatch")
        )
    problems.append((UNSUPPORTED, f"{where}.path: type {kind or '(none)'} is not supported"))
    return None


def _filters(
    items: list[Any], where: str, matches: tuple[RouteMatch, ...], problems: list[Problem]
) -> Filters:
    if not items:
        return NO_FILTERS
    request = response = None
    redirect: Redirect | None = None
    rewrite: Rewrite | None = None
    for i, f in enumerate(items):
        kind = objects.text(f, "type")
        at = f"{where}.filters[{i}]"
        if kind == "RequestHeaderModifier":
            request = header_modifier(objects.field(f, "requestHeaderModifier"))
        elif kind == "ResponseHeaderModifier":
            response = header_modifier(objects.field(f, "responseHeaderModifier"))
        elif kind == "RequestRedirect":
            spec = objects.field(f, "requestRedirect")
            scheme = objects.text(spec, "scheme")
            status = number(spec, "statusCode", default=302)
            if scheme not in ("", "http", "https"):
                problems.append((UNSUPPORTED, f"{at}: scheme {scheme} is not supported"))
            if status not in REDIRECT_CODES:
                problems.append((UNSUPPORTED, f"{at}: statusCode {status} is not supported"))
            redirect = Redirect(
                scheme=scheme,
                hostname=objects.text(spec, "hostname"),
                path=_path_modifier(spec, at, matches, problems),
                port=number(spec, "port"),
                status=status,
            )
        elif kind == "URLRewrite":
            spec = objects.field(f, "urlRewrite")
            rewrite = Rewrite(
                hostname=objects.text(spec, "hostname"),
                path=_path_modifier(spec, at, matches, problems),
            )
        else:
            problems.append((UNSUPPORTED, f"{at}: filter {kind or '(no type)'} is not supported"))
    if redirect is not None and rewrite is not None:
        problems.append((INCOMPATIBLE, f"{where}.filters: RequestRedirect with URLRewrite"))
    return Filters(
        request_headers=request, response_headers=response, redirect=redirect, rewrite=rewrite
    )


def _timeouts(rule: Any, where: str, problems: list[Problem]) -> Timeouts:
    values: dict[str, int | None] = {}
    for key, attr in (("request", "request_ms"), ("backendRequest", "backend_request_ms")):
        text = objects.text(rule, "timeouts", key)
        if not text:
            values[attr] = None
            continue
        ms = duration_ms(text)
        if ms is None:
            problems.append((UNSUPPORTED, f"{where}.timeouts.{key}: {text!r} is no duration"))
        values[attr] = ms
    return Timeouts(**values)
