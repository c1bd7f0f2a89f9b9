"""An ``AuthorizationPolicy`` (``security.istio.io/v1``) as the store's L4 ``Policy``, the way
Istio's control plane converts it for ztunnel (pilot ``ambient/authorization.go``).

Owns: scope (GLOBAL in the root namespace without a selector, NAMESPACE without a selector,
WORKLOAD_SELECTOR with one), action (ALLOW/DENY; AUDIT and CUSTOM are not ztunnel's), rules: each
rule becomes a list of clauses AND'ed (``to`` operations OR'ed, ``from`` sources OR'ed, one per
``when`` condition), with ports, principals, namespaces, service accounts, IP blocks and their
``not`` forms. Invariants: pure; a policy aimed at a waypoint (``targetRef(s)``) is none; what L4
cannot enforce makes the policy stricter, never looser: an ALLOW rule with HTTP attributes or an
invalid value is dropped (it matches nothing), a DENY rule keeps its L4 part without them (it
matches more); each such case is reported in ``warnings``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from meshctl.core.mesh.records import (
    Action,
    IPNetwork,
    Policy,
    RbacMatch,
    Scope,
    StringMatch,
    glob_match,
)

from . import objects

GROUP = "security.istio.io"
KIND = "AuthorizationPolicy"
DRY_RUN_ANNOTATION = "istio.io/dry-run"
_HTTP_OPERATION = ("hosts", "notHosts", "methods", "notMethods", "paths", "notPaths")
_HTTP_SOURCE = ("requestPrincipals", "notRequestPrincipals", "remoteIpBlocks", "notRemoteIpBlocks")
_L4_CONDITIONS = (
    "source.ip",
    "source.namespace",
    "source.principal",
    "destination.ip",
    "destination.port",
)


@dataclass(frozen=True, slots=True, kw_only=True)
class PolicyFacts:
    """A converted policy; ``policy`` is None when it is not one ztunnel enforces."""

    namespace: str
    name: str
    selector: Mapping[str, str] | None = None  # None: no selector (namespace or global scope)
    policy: Policy | None = None
    warnings: tuple[str, ...] = field(default=())

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


class _Rule:
    """One rule being converted: problems found, clauses built.

    ``clause`` keeps a clause unless a match in it lost every field to a problem: such a match
    stands for "unknown, maybe", so for a DENY the clause is left out (it then always holds).
    """

    def __init__(self, index: int) -> None:
        self.index = index
        self.http: list[str] = []
        self.invalid: list[str] = []
        self.clauses: list[tuple[RbacMatch, ...]] = []

    def problems(self) -> int:
        return len(self.http) + len(self.invalid)

    def clause(self, matches: list[tuple[RbacMatch, bool]]) -> None:
        if matches and not any(m.is_empty and lossy for m, lossy in matches):
            self.clauses.append(tuple(m for m, _ in matches))

    def ports(self, values: Any, where: str) -> tuple[int, ...]:
        out = []
        for value in _strings(values, where):
            if value.isdigit() and 0 <= int(value) <= 65535:
                out.append(int(value))
            else:
                self.invalid.append(f"{where} {value!r} is not a port number")
        return tuple(out)

    def networks(self, values: Any, where: str) -> tuple[IPNetwork, ...]:
        out = []
        for value in _strings(values, where):
            try:
                out.append(ipaddress.ip_network(value, strict=False))
            except ValueError:
                self.invalid.append(f"{where} {value!r} is not an IP address or CIDR")
        return tuple(out)


def _strings(values: Any, where: str) -> list[str]:
    if values is None:
        return []
    if not isinstance(values, list) or not all(isinstance(v, str) for v in values):
        raise objects.ObjectError(f"{where} must be a list of strings")
    return values


def _globs(values: Any, where: str) -> tuple[StringMatch, ...]:
    return tuple(glob_match(v) for v in _strings(values, where))


def _accounts(values: Any, where: str, namespace: str) -> tuple[tuple[str, str], ...]:
    out = []
    for value in _strings(values, where):
        ns, slash, sa = value.partition("/")
        out.append((ns, sa) if slash else (namespace, value))
    return tuple(out)


def read_policy(obj: Mapping[str, object], *, root_namespace: str) -> PolicyFacts:
    """The policy's L4 form; ``objects.ObjectError`` when the object is malformed."""
    namespace, name = objects.identify(obj, KIND)
    spec = objects.field(obj, "spec") or {}
    if not isinstance(spec, Mapping):
        raise objects.ObjectError(f"{KIND} {namespace}/{name}: spec is not an object")
    selector: dict[str, str] | None = None
    if objects.field(spec, "selector") is not None:
        selector = objects.string_map(spec, "selector", "matchLabels")
    if objects.field(spec, "targetRef") or objects.field(spec, "targetRefs"):
        return PolicyFacts(namespace=namespace, name=name, selector=selector)  # for waypoints
    action_name = objects.text(spec, "action") or "ALLOW"
    if action_name not in ("ALLOW", "DENY"):
        warning = f"action {action_name} is not enforced by the node proxy; policy ignored"
        return PolicyFacts(namespace=namespace, name=name, selector=selector, warnings=(warning,))
    action = Action.ALLOW if action_name == "ALLOW" else Action.DENY
    if selector is not None:
        scope = Scope.WORKLOAD_SELECTOR
    elif namespace == root_namespace:
        scope = Scope.GLOBAL
    else:
        scope = Scope.NAMESPACE
    rules: list[tuple[tuple[RbacMatch, ...], ...]] = []
    warnings: list[str] = []
    for i, rule in enumerate(objects.items(spec, "rules")):
        converted, state = _rule(rule, i, namespace)
        lost = [*state.http, *state.invalid]
        if lost and action is Action.ALLOW:
            warnings.append(f"rules[{i}] dropped (matches nothing): {'; '.join(lost)}")
            continue
        if lost:
            warnings.append(f"rules[{i}] enforced without: {'; '.join(lost)}")
        rules.append(converted)
    annotations = objects.string_map(obj, "metadata", "annotations")
    policy = Policy(
        name=name,
        namespace=namespace,
        scope=scope,
        action=action,
        rules=tuple(rules),
        dry_run=annotations.get(DRY_RUN_ANNOTATION, "").lower() == "true",
    )
    return PolicyFacts(
        namespace=namespace,
        name=name,
        selector=selector,
        policy=policy,
        warnings=tuple(warnings),
    )


def _rule(rule: Any, index: int, namespace: str) -> tuple[tuple[tuple[RbacMatch, ...], ...], _Rule]:
    state = _Rule(index)
    here = f"rules[{index}]"
    to = []
    for j, entry in enumerate(objects.items(rule, "to")):
        op = objects.field(entry, "operation") or {}
        at = f"{here}.to[{j}].operation"
        before = state.problems()
        state.http += [f"{at}.{k}" for k in _HTTP_OPERATION if objects.field(op, k)]
        match = RbacMatch(
            destination_ports=state.ports(objects.field(op, "ports"), f"{at}.ports"),
            not_destination_ports=state.ports(objects.field(op, "notPorts"), f"{at}.notPorts"),
        )
        to.append((match, state.problems() > before))
    state.clause(to)
    sources = []
    for j, entry in enumerate(objects.items(rule, "from")):
        src = objects.field(entry, "source") or {}
        at = f"{here}.from[{j}].source"
        before = state.problems()
        state.http += [f"{at}.{k}" for k in _HTTP_SOURCE if objects.field(src, k)]
        sources.append((_source(src, at, namespace, state), state.problems() > before))
    state.clause(sources)
    for j, when in enumerate(objects.items(rule, "when")):
        before = state.problems()
        condition = _condition(when, f"{here}.when[{j}]", state)
        state.clause([(condition, state.problems() > before)])
    return tuple(state.clauses), state


def _source(src: Any, at: str, namespace: str, state: _Rule) -> RbacMatch:
    def get(key: str) -> Any:
        return objects.field(src, key)

    return RbacMatch(
        principals=_globs(get("principals"), f"{at}.principals"),
        not_principals=_globs(get("notPrincipals"), f"{at}.notPrincipals"),
        namespaces=_globs(get("namespaces"), f"{at}.namespaces"),
        not_namespaces=_globs(get("notNamespaces"), f"{at}.notNamespaces"),
        service_accounts=_accounts(get("serviceAccounts"), f"{at}.serviceAccounts", namespace),
        not_service_accounts=_accounts(
            get("notServiceAccounts"), f"{at}.notServiceAccounts", namespace
        ),
        source_ips=state.networks(get("ipBlocks"), f"{at}.ipBlocks"),
        not_source_ips=state.networks(get("notIpBlocks"), f"{at}.notIpBlocks"),
    )


def _condition(when: Any, at: str, state: _Rule) -> RbacMatch:
    key = objects.text(when, "key")
    if key not in _L4_CONDITIONS:
        state.http.append(f"{at}.key {key!r}")
        return RbacMatch()
    values, negated = objects.field(when, "values"), objects.field(when, "notValues")
    if key == "destination.port":
        return RbacMatch(
            destination_ports=state.ports(values, f"{at}.values"),
            not_destination_ports=state.ports(negated, f"{at}.notValues"),
        )
    if key in ("source.ip", "destination.ip"):
        pos, neg = (
            state.networks(values, f"{at}.values"),
            state.networks(negated, f"{at}.notValues"),
        )
        if key == "source.ip":
            return RbacMatch(source_ips=pos, not_source_ips=neg)
        return RbacMatch(destination_ips=pos, not_destination_ips=neg)
    pos_s, neg_s = _globs(values, f"{at}.values"), _globs(negated, f"{at}.notValues")
    if key == "source.namespace":
        return RbacMatch(namespaces=pos_s, not_namespaces=neg_s)
    return RbacMatch(principals=pos_s, not_principals=neg_s)
