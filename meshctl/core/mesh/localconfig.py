"""Istio ztunnel's local-config document read into store records.

Owns the reader (``parse_local_config``, ``parse_record``): a field that is unknown or mistyped
is refused with its path (``workloads[1].workloadIps[0]``); a field ztunnel's own reader
requires is required here too, and one it defaults differently is named by
``local_config_warnings``.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from typing import Any, TypedDict

from meshctl.core.mesh.records import (
    DEFAULT_TRUST_DOMAIN,
    Action,
    IPAddress,
    IPNetwork,
    Kind,
    LocalConfigError,
    Policy,
    Protocol,
    RbacMatch,
    Record,
    Scope,
    Service,
    StringMatch,
    Workload,
    glob_match,
)
from meshctl.core.mesh.store import Store
from meshctl.core.pki.identity import IdentityError


class LocalConfig(TypedDict, total=False):
    """A document ``parse_local_config`` accepted (each record as ``render`` writes it)."""

    workloads: list[dict[str, object]]
    services: list[dict[str, object]]
    policies: list[dict[str, object]]


def parse_local_config(doc: Any) -> Store:
    """Build a ``Store`` from a parsed local-config document (a mapping, or None for empty)."""
    if doc is None:
        return Store.build()
    top = _Mapping(doc, "")
    workloads = [_workload(_Mapping(w, p)) for p, w in top.list_of("workloads")]
    services = [_service(_Mapping(s, p)) for p, s in top.list_of("services")]
    policies = [_policy(_Mapping(x, p)) for p, x in top.list_of("policies")]
    top.done()
    return Store.build(workloads, services, policies)


def parse_record(kind: Kind, doc: Any, path: str = "") -> Record:
    """One record in its local-config form (as ``records.render`` writes it)."""
    m = _Mapping(doc, path)
    if kind is Kind.WORKLOAD:
        return _workload(m)
    return _service(m) if kind is Kind.SERVICE else _policy(m)


# Fields ztunnel's local config accepts that this data plane records but does not act on yet
# (waypoints, gateways, locality...): accepted so a ztunnel config loads, shown in /config_dump.
_WORKLOAD_PASSIVE = (
    "networkMode", "hostname", "waypoint", "networkGateway", "nativeTunnel", "applicationTunnel",
    "locality", "capacity",
)  # fmt: skip


_SERVICE_PASSIVE = (
    "cidrVips", "endpoints", "waypoint", "loadBalancer", "ipFamilies", "canonical", "visibility",
)  # fmt: skip


def _workload(m: _Mapping) -> Workload:
    status = m.choice("status", ("Healthy", "Unhealthy"), "Healthy")
    # ztunnel's LocalWorkload has no default for these two (serde): it refuses the file.
    m.require("workloadIps", "write workloadIps: [] for a workload without addresses")
    m.require("services", "write services: {} for a workload that backs no service")
    services: dict[str, dict[int, int]] = {}
    for key, value, path in m.mapping_items("services"):
        if "/" not in key:
            raise LocalConfigError(path, "service key must be '<namespace>/<hostname>'")
        services[key] = _port_map(value, path)
    w = Workload(
        uid=m.text("uid", required=True),
        name=m.text("name", required=True),
        namespace=m.text("namespace", required=True),
        service_account=m.text("serviceAccount", "default"),
        workload_ips=tuple(_ip(v, p) for p, v in m.list_of("workloadIps")),
        protocol=Protocol(m.choice("protocol", ("HBONE", "TCP"), "TCP")),
        network=m.text("network", ""),
        trust_domain=m.text("trustDomain", DEFAULT_TRUST_DOMAIN),
        node=m.text("node", ""),
        workload_name=m.text("workloadName", ""),
        workload_type=m.text("workloadType", "deployment"),
        canonical_name=m.text("canonicalName", ""),
        canonical_revision=m.text("canonicalRevision", ""),
        cluster_id=m.text("clusterId", "Kubernetes"),
        authorization_policies=tuple(_str(v, p) for p, v in m.list_of("authorizationPolicies")),
        healthy=status == "Healthy",
        services=services,
        extra=m.passive(_WORKLOAD_PASSIVE),
    )
    m.done()
    try:
        _ = w.identity
    except IdentityError as exc:
        raise LocalConfigError(m.path, str(exc)) from exc
    return w


def _service(m: _Mapping) -> Service:
    m.require("vips", "write vips: [] for a service without virtual IPs")
    m.require("ports", "write ports: {} for a service without ports")
    vips = []
    for p, v in m.list_of("vips"):
        text = _str(v, p)
        network, sep, ip = text.partition("/")  # ztunnel's NetworkAddress: "<network>/<ip>"
        if not sep:
            raise LocalConfigError(p, f"{text!r}: want '<network>/<ip>' ('/{text}' for none)")
        vips.append((network, _ip(ip, p)))
    s = Service(
        name=m.text("name", required=True),
        namespace=m.text("namespace", required=True),
        hostname=m.text("hostname", required=True),
        vips=tuple(vips),
        ports=_port_map(m.get("ports", {}), m.sub("ports")),
        subject_alt_names=tuple(_str(v, p) for p, v in m.list_of("subjectAltNames")),
        extra=m.passive(_SERVICE_PASSIVE),
    )
    m.done()
    return s


def _policy(m: _Mapping) -> Policy:
    rules = []
    for rp, rule in m.list_of("rules"):
        clauses = []
        for cp, clause in _list(rule, rp):
            clauses.append(tuple(_match(_Mapping(x, xp)) for xp, x in _list(clause, cp)))
        rules.append(tuple(clauses))
    p = Policy(
        name=m.text("name", required=True),
        namespace=m.text("namespace", ""),
        scope=Scope(m.choice("scope", tuple(s.value for s in Scope), "Namespace")),
        action=Action(m.choice("action", ("Allow", "Deny"), "Allow")),
        rules=tuple(rules),
        dry_run=m.flag("dryRun", default=False),
    )
    m.done()
    return p


def _match(m: _Mapping) -> RbacMatch:
    r = RbacMatch(
        namespaces=tuple(_string_match(v, p) for p, v in m.list_of("namespaces")),
        not_namespaces=tuple(_string_match(v, p) for p, v in m.list_of("notNamespaces")),
        service_accounts=tuple(_sa(v, p) for p, v in m.list_of("serviceAccounts")),
        not_service_accounts=tuple(_sa(v, p) for p, v in m.list_of("notServiceAccounts")),
        principals=tuple(_string_match(v, p) for p, v in m.list_of("principals")),
        not_principals=tuple(_string_match(v, p) for p, v in m.list_of("notPrincipals")),
        source_ips=tuple(_net(v, p) for p, v in m.list_of("sourceIps")),
        not_source_ips=tuple(_net(v, p) for p, v in m.list_of("notSourceIps")),
        destination_ips=tuple(_net(v, p) for p, v in m.list_of("destinationIps")),
        not_destination_ips=tuple(_net(v, p) for p, v in m.list_of("notDestinationIps")),
        destination_ports=tuple(_port(v, p) for p, v in m.list_of("destinationPorts")),
        not_destination_ports=tuple(_port(v, p) for p, v in m.list_of("notDestinationPorts")),
    )
    m.done()
    return r


class _Mapping:
    """A mapping being read: remembers which keys were consumed so leftovers are refused."""

    def __init__(self, value: Any, path: str) -> None:
        if not isinstance(value, Mapping):
            raise LocalConfigError(path, f"expected a mapping, got {_kind(value)}")
        self.value = value
        self.path = path
        self.seen: set[str] = set()

    def sub(self, key: str) -> str:
        return f"{self.path}.{key}" if self.path else key

    def require(self, key: str, hint: str) -> None:
        """``key`` must be present (any value, even empty), as ztunnel's reader demands."""
        if key not in self.value:
            raise LocalConfigError(self.sub(key), f"required field is missing ({hint})")

    def get(self, key: str, default: Any = None) -> Any:
        self.seen.add(key)
        value = self.value.get(key, default)
        return default if value is None else value

    def text(self, key: str, default: str = "", *, required: bool = False) -> str:
        if required and self.value.get(key) in (None, ""):
            raise LocalConfigError(self.sub(key), "required field is missing")
        return _str(self.get(key, default), self.sub(key))

    def flag(self, key: str, *, default: bool) -> bool:
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise LocalConfigError(self.sub(key), f"expected true or false, got {_kind(value)}")
        return value

    def choice(self, key: str, allowed: tuple[str, ...], default: str) -> str:
        value = self.text(key, default)
        if value not in allowed:
            raise LocalConfigError(self.sub(key), f"{value!r} is not one of {', '.join(allowed)}")
        return value

    def list_of(self, key: str) -> list[tuple[str, Any]]:
        return _list(self.get(key, []), self.sub(key))

    def mapping_items(self, key: str) -> list[tuple[str, Any, str]]:
        value = self.get(key, {})
        if not isinstance(value, Mapping):
            raise LocalConfigError(self.sub(key), f"expected a mapping, got {_kind(value)}")
        return [(str(k), v, f"{self.sub(key)}[{k!r}]") for k, v in value.items()]

    def passive(self, keys: tuple[str, ...]) -> dict[str, object]:
        return {k: self.get(k) for k in keys if self.value.get(k) is not None}

    def done(self) -> None:
        unknown = [k for k in self.value if k not in self.seen]
        if unknown:
            raise LocalConfigError(self.sub(str(unknown[0])), "unknown field")


def _list(value: Any, path: str) -> list[tuple[str, Any]]:
    if not isinstance(value, list):
        raise LocalConfigError(path, f"expected a list, got {_kind(value)}")
    return [(f"{path}[{i}]", v) for i, v in enumerate(value)]


def _str(value: Any, path: str) -> str:
    if not isinstance(value, str):
        raise LocalConfigError(path, f"expected a string, got {_kind(value)}")
    return value


def _ip(value: Any, path: str) -> IPAddress:
    try:
        return ipaddress.ip_address(_str(value, path))
    except ValueError as exc:
        raise LocalConfigError(path, f"{value!r} is not an IP address") from exc


def _net(value: Any, path: str) -> IPNetwork:
    try:
        return ipaddress.ip_network(_str(value, path), strict=False)
    except ValueError as exc:
        raise LocalConfigError(path, f"{value!r} is not an IP address or CIDR") from exc


def _port(value: Any, path: str) -> int:
    if isinstance(value, str) and value.isdigit():
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= 65535:
        raise LocalConfigError(path, f"{value!r} is not a port number")
    return int(value)


def _port_map(value: Any, path: str) -> dict[int, int]:
    if not isinstance(value, Mapping):
        raise LocalConfigError(path, f"expected a mapping of port: targetPort, got {_kind(value)}")
    return {_port(k, f"{path}[{k!r}]"): _port(v, f"{path}[{k!r}]") for k, v in value.items()}


def _sa(value: Any, path: str) -> tuple[str, str]:
    m = _Mapping(value, path)
    result = (m.text("namespace", required=True), m.text("serviceAccount", required=True))
    m.done()
    return result


def _string_match(value: Any, path: str) -> StringMatch:
    """A principal or namespace: ztunnel's ``{Exact|Prefix|Suffix|Presence: ...}`` or Istio's
    glob string (``*``, ``prefix*``, ``*suffix``, exact)."""
    if isinstance(value, str):
        return glob_match(value)
    if isinstance(value, Mapping) and len(value) == 1:
        kind, text = next(iter(value.items()))
        kinds = {"Exact": "exact", "Prefix": "prefix", "Suffix": "suffix", "Presence": "presence"}
        if kind in kinds:
            text = "" if kinds[kind] == "presence" else _str(text, f"{path}.{kind}")
            return StringMatch(kind=kinds[kind], value=text)
    raise LocalConfigError(path, "expected a string or one of {Exact|Prefix|Suffix|Presence: ...}")


def _kind(value: Any) -> str:
    return "nothing" if value is None else type(value).__name__


# Workload fields ztunnel's local-config reader defaults to "" when absent (serde defaults),
# while this store fills in what its xDS path would: (field, our default, the consequence).
_ZTUNNEL_EMPTY_DEFAULTS = (
    ("trustDomain", DEFAULT_TRUST_DOMAIN, "identity"),
    ("serviceAccount", "default", "identity"),
    ("clusterId", "Kubernetes", "metrics labels"),
)


def local_config_warnings(doc: Any) -> list[str]:
    """What ztunnel would read differently in a document ``parse_local_config`` accepts.

    One line per field, naming it by path, what each reader makes of it, and the fix: ztunnel
    reads a missing ``trustDomain`` or ``serviceAccount`` as empty (an identity no certificate
    carries), this store as ``cluster.local``/``default``.
    """
    out: list[str] = []
    workloads = doc.get("workloads") if isinstance(doc, Mapping) else None
    for i, w in enumerate(workloads if isinstance(workloads, list) else ()):
        if not isinstance(w, Mapping):
            continue
        for key, ours, what in _ZTUNNEL_EMPTY_DEFAULTS:
            if w.get(key) is None:
                out.append(
                    f"workloads[{i}].{key}: not set; ztunnel reads that as empty, meshctl as "
                    f"{ours!r} (it changes the workload's {what}): write {key}: {ours}"
                )
    return out
