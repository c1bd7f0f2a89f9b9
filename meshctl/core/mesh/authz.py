"""L4 authorization with Istio's semantics, over policies from the workload store.

Owns the verdict for one connection. Rules (Istio AuthorizationPolicy, as ztunnel applies it at
L4): any matching DENY refuses; with no ALLOW policy the connection is allowed; otherwise at least
one ALLOW must match. A policy matches when any rule matches; a rule when all its clauses match;
a clause when any of its matches does; a match when every field holds, a field holding when any
positive value matches (or there are none) and no negative value does. A policy with no rules
never matches; a rule with no clauses, or a clause with no matches, always holds; a match with no
field set never holds (ztunnel's ``rbac.rs`` reads them so: Istio's ``rules: [{}]`` allows all).
Dry-run policies are evaluated and reported but never enforced. Invariant: pure.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TypeVar

from meshctl.core.mesh.addresses import ip as parse_ip
from meshctl.core.mesh.records import Action, IPAddress, Policy, RbacMatch
from meshctl.core.pki.identity import SpiffeId

_W = TypeVar("_W")
_G = TypeVar("_G")


@dataclass(frozen=True, slots=True, kw_only=True)
class ConnectionFacts:
    """What L4 authorization sees of a connection; ``source`` is None without mTLS (port 15006)."""

    source: SpiffeId | None
    source_ip: IPAddress
    destination_ip: IPAddress
    destination_port: int

    @classmethod
    def of(
        cls, source: SpiffeId | None, source_ip: str, destination_ip: str, destination_port: int
    ) -> ConnectionFacts:
        return cls(
            source=source,
            source_ip=parse_ip(source_ip),
            destination_ip=parse_ip(destination_ip),
            destination_port=destination_port,
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class Decision:
    allowed: bool
    reason: str  # "no policies", "allowed by ns/name", "denied by ns/name", "no ALLOW matched"
    dry_run_denials: tuple[str, ...] = ()  # dry-run policies that would have refused


def evaluate(policies: Iterable[Policy], conn: ConnectionFacts) -> Decision:
    """Decide ``conn`` against ``policies`` (already selected for the destination workload)."""
    enforced = [p for p in policies if not p.dry_run]
    dry = [p for p in policies if p.dry_run]
    would_deny = tuple(p.key for p in _dry_run_refusals(dry, conn))
    for p in enforced:
        if p.action is Action.DENY and policy_matches(p, conn):
            return Decision(allowed=False, reason=f"denied by {p.key}", dry_run_denials=would_deny)
    allows = [p for p in enforced if p.action is Action.ALLOW]
    if not allows:
        reason = "no ALLOW policy" if enforced else "no policies"
        return Decision(allowed=True, reason=reason, dry_run_denials=would_deny)
    for p in allows:
        if policy_matches(p, conn):
            return Decision(allowed=True, reason=f"allowed by {p.key}", dry_run_denials=would_deny)
    return Decision(allowed=False, reason="no ALLOW policy matched", dry_run_denials=would_deny)


def _dry_run_refusals(dry: list[Policy], conn: ConnectionFacts) -> list[Policy]:
    denies = [p for p in dry if p.action is Action.DENY and policy_matches(p, conn)]
    allows = [p for p in dry if p.action is Action.ALLOW]
    if allows and not any(policy_matches(p, conn) for p in allows):
        denies.extend(allows)
    return denies


def policy_matches(policy: Policy, conn: ConnectionFacts) -> bool:
    """As ztunnel decides it: no rules never matches; a rule without clauses and a clause without
    matches always hold; a match with no field set never holds (it is skipped)."""
    return any(
        all(
            not clause or any(not m.is_empty and match_holds(m, conn) for m in clause)
            for clause in rule
        )
        for rule in policy.rules
    )


def match_holds(m: RbacMatch, conn: ConnectionFacts) -> bool:
    """All fields of one match hold for ``conn``."""
    src = conn.source
    namespace = src.namespace if src else None
    sa = (src.namespace, src.service_account) if src else None
    principal = src.principal if src else None
    return (
        _field(namespace, m.namespaces, m.not_namespaces, lambda want, got: want.matches(got))
        and _field(sa, m.service_accounts, m.not_service_accounts, lambda want, got: want == got)
        and _field(principal, m.principals, m.not_principals, lambda want, got: want.matches(got))
        and _field(conn.source_ip, m.source_ips, m.not_source_ips, lambda net, ip: ip in net)
        and _field(
            conn.destination_ip, m.destination_ips, m.not_destination_ips, lambda n, ip: ip in n
        )
        and _field(
            conn.destination_port,
            m.destination_ports,
            m.not_destination_ports,
            lambda want, got: want == got,
        )
    )


def _field(
    value: _G | None,
    positive: tuple[_W, ...],
    negative: tuple[_W, ...],
    test: Callable[[_W, _G], bool],
) -> bool:
    """Any positive holds (or none given) and no negative holds. A missing value (no peer
    identity) satisfies no positive and trips no negative."""
    if value is None:
        return not positive
    if positive and not any(test(w, value) for w in positive):
        return False
    return not any(test(w, value) for w in negative)
