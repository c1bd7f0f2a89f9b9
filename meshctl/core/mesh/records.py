"""The mesh's records: workloads, services and L4 policies, as ztunnel's model names them.

Owns the frozen record types every consumer reads, their kinds and store keys, and the content
version of a record. Invariant: records are immutable values, built deterministically (equal
content has an equal ``repr``, so every replica computes the same version).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from meshctl.core.pki.identity import SpiffeId

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network


DEFAULT_TRUST_DOMAIN = "cluster.local"


class LocalConfigError(ValueError):
    """The local config document is invalid; ``path`` names the offending field."""

    def __init__(self, path: str, problem: str) -> None:
        super().__init__(f"{path}: {problem}" if path else problem)
        self.path = path
        self.problem = problem


class Protocol(StrEnum):
    """How a workload receives mesh traffic: HBONE tunnels to :15008, or plain TCP."""

    HBONE = "HBONE"
    TCP = "TCP"


class Action(StrEnum):
    ALLOW = "Allow"
    DENY = "Deny"


class Scope(StrEnum):
    GLOBAL = "Global"
    NAMESPACE = "Namespace"
    WORKLOAD_SELECTOR = "WorkloadSelector"


@dataclass(frozen=True, slots=True, kw_only=True)
class Workload:
    uid: str
    name: str
    namespace: str
    service_account: str = "default"
    workload_ips: tuple[IPAddress, ...] = ()
    protocol: Protocol = Protocol.TCP
    network: str = ""
    trust_domain: str = DEFAULT_TRUST_DOMAIN
    node: str = ""
    workload_name: str = ""
    workload_type: str = "deployment"
    canonical_name: str = ""
    canonical_revision: str = ""
    cluster_id: str = "Kubernetes"
    authorization_policies: tuple[str, ...] = ()
    healthy: bool = True
    # "<ns>/<hostname>" -> {service port: target port}: makes this workload an endpoint.
    services: Mapping[str, Mapping[int, int]] = field(default_factory=dict)
    extra: Mapping[str, Any] = field(default_factory=dict)  # accepted, kept for /config_dump

    @property
    def identity(self) -> SpiffeId:
        return SpiffeId(self.trust_domain, self.namespace, self.service_account)


@dataclass(frozen=True, slots=True, kw_only=True)
class Service:
    name: str
    namespace: str
    hostname: str
    vips: tuple[tuple[str, IPAddress], ...] = ()  # (network, ip)
    ports: Mapping[int, int] = field(default_factory=dict)  # service port -> target port
    subject_alt_names: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.hostname}"


@dataclass(frozen=True, slots=True, kw_only=True)
class StringMatch:
    """Istio's principal matcher: exact, prefix, suffix, or presence (any value)."""

    kind: str  # "exact" | "prefix" | "suffix" | "presence"
    value: str = ""

    def matches(self, text: str | None) -> bool:
        if text is None:
            return False
        if self.kind == "exact":
            return text == self.value
        if self.kind == "prefix":
            return text.startswith(self.value)
        if self.kind == "suffix":
            return text.endswith(self.value)
        return text != ""  # presence: any non-empty value


def glob_match(text: str) -> StringMatch:
    """Istio's policy string form: ``*`` (present), ``prefix*``, ``*suffix`` or exact."""
    if text == "*":
        return StringMatch(kind="presence")
    if text.startswith("*"):
        return StringMatch(kind="suffix", value=text[1:])
    if text.endswith("*"):
        return StringMatch(kind="prefix", value=text[:-1])
    return StringMatch(kind="exact", value=text)


@dataclass(frozen=True, slots=True, kw_only=True)
class RbacMatch:
    """One match: every non-empty field must hold (AND); within a field any positive (OR) and
    no negative."""

    namespaces: tuple[StringMatch, ...] = ()
    not_namespaces: tuple[StringMatch, ...] = ()
    service_accounts: tuple[tuple[str, str], ...] = ()  # (namespace, serviceAccount)
    not_service_accounts: tuple[tuple[str, str], ...] = ()
    principals: tuple[StringMatch, ...] = ()
    not_principals: tuple[StringMatch, ...] = ()
    source_ips: tuple[IPNetwork, ...] = ()
    not_source_ips: tuple[IPNetwork, ...] = ()
    destination_ips: tuple[IPNetwork, ...] = ()
    not_destination_ips: tuple[IPNetwork, ...] = ()
    destination_ports: tuple[int, ...] = ()
    not_destination_ports: tuple[int, ...] = ()

    @property
    def is_empty(self) -> bool:
        """No field set: ztunnel skips such a match (it never satisfies its clause)."""
        return self == _EMPTY_MATCH


_EMPTY_MATCH = RbacMatch()


@dataclass(frozen=True, slots=True, kw_only=True)
class Policy:
    name: str
    namespace: str
    scope: Scope
    action: Action
    # rules OR; a rule is clauses AND; a clause is matches OR (ztunnel's three nested lists).
    rules: tuple[tuple[tuple[RbacMatch, ...], ...], ...]
    dry_run: bool = False

    @property
    def key(self) -> str:
        return f"{self.namespace}/{self.name}"


HBONE_PORT = 15008


class Kind(StrEnum):
    """The three record kinds the store holds, each keyed by its own name."""

    WORKLOAD = "workload"  # key: uid
    SERVICE = "service"  # key: "<namespace>/<hostname>"
    POLICY = "policy"  # key: "<namespace>/<name>"


Record = Workload | Service | Policy


def record_key(record: Record) -> str:
    """The store key of a record (a workload's uid, a service's or policy's namespace/name)."""
    return record.uid if isinstance(record, Workload) else record.key


def content_version(record: Record) -> str:
    """A version that changes exactly when the record's content does (same on every replica:
    records are built deterministically, so equal content has an equal ``repr``)."""
    return hashlib.blake2b(repr(record).encode(), digest_size=8).hexdigest()
