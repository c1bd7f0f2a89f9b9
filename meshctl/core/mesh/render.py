"""Store records written as ztunnel's local-config document: the inverse of the reader in
``workloads`` (which the data plane uses to take records from the supervisor).

Owns ``render`` (a record -> its camelCase mapping, JSON-safe) and the ``Update`` <-> plain-dict
form the supervisor sends incremental changes in. Invariant: ``parse_record(kind,
render(record)) == record`` for every record, also after a JSON round trip (ports as strings).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, TypedDict

from meshctl.core.mesh.localconfig import parse_record
from meshctl.core.mesh.records import (
    Kind,
    Policy,
    Protocol,
    RbacMatch,
    Record,
    Service,
    StringMatch,
    Workload,
)
from meshctl.core.mesh.store import Update

_STRING_MATCH_KINDS = {"exact": "Exact", "prefix": "Prefix", "suffix": "Suffix"}


class PlainUpdate(TypedDict):
    """An ``Update`` as JSON-safe data."""

    kind: str  # a Kind's value
    key: str
    version: str
    record: dict[str, object] | None  # as ``render`` writes it; None: deleted


# A record's mapping is open: the fields ztunnel's reader accepts and meshctl keeps without
# acting on (``extra``) ride along, so it is a JSON object rather than a closed TypedDict.


def render(record: Record) -> dict[str, object]:
    """The record as the local config writes it."""
    if isinstance(record, Workload):
        return _workload(record)
    if isinstance(record, Service):
        return _service(record)
    return _policy(record)


def _ports(ports: Mapping[int, int]) -> dict[str, int]:
    return {str(p): t for p, t in ports.items()}


def _workload(w: Workload) -> dict[str, object]:
    return {
        "uid": w.uid,
        "name": w.name,
        "namespace": w.namespace,
        "serviceAccount": w.service_account,
        "workloadIps": [str(ip) for ip in w.workload_ips],
        "protocol": "HBONE" if w.protocol is Protocol.HBONE else "TCP",
        "network": w.network,
        "trustDomain": w.trust_domain,
        "node": w.node,
        "workloadName": w.workload_name,
        "workloadType": w.workload_type,
        "canonicalName": w.canonical_name,
        "canonicalRevision": w.canonical_revision,
        "clusterId": w.cluster_id,
        "authorizationPolicies": list(w.authorization_policies),
        "status": "Healthy" if w.healthy else "Unhealthy",
        "services": {key: _ports(ports) for key, ports in w.services.items()},
        **w.extra,
    }


def _service(s: Service) -> dict[str, object]:
    return {
        "name": s.name,
        "namespace": s.namespace,
        "hostname": s.hostname,
        "vips": [f"{network}/{ip}" for network, ip in s.vips],
        "ports": _ports(s.ports),
        "subjectAltNames": list(s.subject_alt_names),
        **s.extra,
    }


def _string_match(m: StringMatch) -> dict[str, object]:
    if m.kind == "presence":
        return {"Presence": []}
    return {_STRING_MATCH_KINDS[m.kind]: m.value}


def _match(m: RbacMatch) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, values in (
        ("namespaces", m.namespaces),
        ("notNamespaces", m.not_namespaces),
        ("principals", m.principals),
        ("notPrincipals", m.not_principals),
    ):
        if values:
            out[key] = [_string_match(v) for v in values]
    for key, accounts in (
        ("serviceAccounts", m.service_accounts),
        ("notServiceAccounts", m.not_service_accounts),
    ):
        if accounts:
            out[key] = [{"namespace": ns, "serviceAccount": sa} for ns, sa in accounts]
    for key, nets in (
        ("sourceIps", m.source_ips),
        ("notSourceIps", m.not_source_ips),
        ("destinationIps", m.destination_ips),
        ("notDestinationIps", m.not_destination_ips),
    ):
        if nets:
            out[key] = [str(n) for n in nets]
    for key, ports in (
        ("destinationPorts", m.destination_ports),
        ("notDestinationPorts", m.not_destination_ports),
    ):
        if ports:
            out[key] = list(ports)
    return out


def _policy(p: Policy) -> dict[str, object]:
    return {
        "name": p.name,
        "namespace": p.namespace,
        "scope": p.scope.value,
        "action": p.action.value,
        "rules": [[[_match(m) for m in clause] for clause in rule] for rule in p.rules],
        "dryRun": p.dry_run,
    }


def update_to_plain(update: Update) -> PlainUpdate:
    """An update as JSON-safe data (the supervisor -> data plane channel carries these)."""
    return {
        "kind": update.kind.value,
        "key": update.key,
        "version": update.version,
        "record": None if update.record is None else render(update.record),
    }


def update_from_plain(data: Mapping[str, Any]) -> Update:
    """The inverse of ``update_to_plain``; ``LocalConfigError`` or ``ValueError`` if malformed."""
    kind = Kind(data["kind"])
    record = data.get("record")
    return Update(
        kind=kind,
        key=str(data["key"]),
        record=None
        if record is None
        else parse_record(kind, record, f"{kind.value} {data['key']}"),
        version=str(data.get("version", "")),
    )
