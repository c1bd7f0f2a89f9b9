"""ztunnel's ``/config_dump`` shapes, built from meshctl's records and certificate facts.

Owns the translation of the sections both proxies dump (``workloads``, ``services``,
``stagedServices``, ``policies``, ``certificates``, the entries of ``workloadState``) into the
JSON ztunnel's admin port writes (its serde derives in ``src/state/workload.rs``,
``src/state/service.rs``, ``src/rbac.rs``, ``src/admin.rs``, ``src/inpod/admin.rs``), so Istio's
tooling (``istioctl ztunnel-config``) reads a meshctl proxy's dump. Invariants: pure; a field
ztunnel leaves out when it holds its default is left out here too; meshctl's own facts ride
only under keys ztunnel does not use (``uriSans`` per certificate, ``source`` per identity).
"""

from __future__ import annotations

import base64
from collections.abc import Iterable, Mapping, Sequence
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from meshctl.core.mesh.records import Policy, Protocol, Service, Workload
from meshctl.core.mesh.render import render

if TYPE_CHECKING:
    from meshctl.core.wire.dump import (
        CertDump,
        CertificateFacts,
        CertificateSummary,
        Endpoint,
        FlowFacts,
        InboundConnection,
        OutboundConnection,
        PodConnections,
        StateSections,
    )

_PEM_END = "-----END CERTIFICATE-----"
_LOCALITY = ("region", "zone", "subzone")


def workload(w: Workload) -> dict[str, Any]:
    """One workload as ztunnel's ``Workload`` serializes (camelCase, defaults left out)."""
    extra = w.extra
    out: dict[str, Any] = {"workloadIps": [str(ip) for ip in w.workload_ips]}
    for key in ("waypoint", "networkGateway"):
        if extra.get(key):
            out[key] = extra[key]
    out["protocol"] = "HBONE" if w.protocol is Protocol.HBONE else "TCP"
    out["networkMode"] = str(extra.get("networkMode") or "Standard")
    if w.uid:
        out["uid"] = w.uid
    out["name"] = w.name
    out["namespace"] = w.namespace
    for key, value in (
        ("trustDomain", w.trust_domain),
        ("serviceAccount", w.service_account),
        ("network", w.network),
        ("workloadName", w.workload_name),
        ("workloadType", w.workload_type),
        ("canonicalName", w.canonical_name),
        ("canonicalRevision", w.canonical_revision),
        ("hostname", str(extra.get("hostname") or "")),
        ("node", w.node),
    ):
        if value:
            out[key] = value
    if extra.get("nativeTunnel"):
        out["nativeTunnel"] = True
    if extra.get("applicationTunnel"):
        out["applicationTunnel"] = extra["applicationTunnel"]
    if w.authorization_policies:
        out["authorizationPolicies"] = list(w.authorization_policies)
    out["status"] = "Healthy" if w.healthy else "Unhealthy"
    out["clusterId"] = w.cluster_id
    locality = extra.get("locality")
    if isinstance(locality, Mapping) and any(locality.get(k) for k in _LOCALITY):
        out["locality"] = {k: str(locality.get(k) or "") for k in _LOCALITY}
    if w.services:
        out["services"] = sorted(w.services)  # ztunnel: NamespacedHostname, "ns/hostname"
    capacity = extra.get("capacity")
    out["capacity"] = capacity if isinstance(capacity, int) else 1
    return out


def endpoint(w: Workload, ports: Mapping[int, int]) -> Endpoint:
    """``w`` as an endpoint of one of its services (ztunnel's ``Endpoint``)."""
    return {
        "workloadUid": w.uid,
        "port": {str(p): t for p, t in ports.items()},
        "status": "Healthy" if w.healthy else "Unhealthy",
    }


def endpoints_by_service(workloads: Iterable[Workload]) -> dict[str, dict[str, Endpoint]]:
    """``"<namespace>/<hostname>"`` -> workload uid -> endpoint: a service's endpoints are the
    workloads that name it (the ports live there in meshctl's records, on the service in
    ztunnel's)."""
    out: dict[str, dict[str, Endpoint]] = {}
    for w in workloads:
        for key, ports in w.services.items():
            out.setdefault(key, {})[w.uid] = endpoint(w, ports)
    return out


def service(s: Service, endpoints: Mapping[str, Endpoint]) -> dict[str, Any]:
    """One service as ztunnel's ``Service`` serializes, with ``endpoints`` keyed by uid."""
    extra = s.extra
    out: dict[str, Any] = {
        "name": s.name,
        "namespace": s.namespace,
        "hostname": s.hostname,
        "vips": [f"{network}/{ip}" for network, ip in s.vips],
    }
    if extra.get("cidrVips"):
        out["cidrVips"] = extra["cidrVips"]
    out["ports"] = {str(p): t for p, t in s.ports.items()}
    given = extra.get("endpoints")
    merged: dict[str, Any] = dict(given) if isinstance(given, Mapping) else {}
    merged.update(endpoints)
    out["endpoints"] = merged
    out["subjectAltNames"] = list(s.subject_alt_names)
    for key in ("waypoint", "weightedWaypoints", "loadBalancer"):
        if extra.get(key):
            out[key] = extra[key]
    if extra.get("ipFamilies"):
        out["ipFamilies"] = extra["ipFamilies"]
    out["canonical"] = bool(extra.get("canonical", False))
    out["visibility"] = str(extra.get("visibility") or "Public")
    return out


def policy(p: Policy) -> dict[str, Any]:
    """One policy as ztunnel's ``Authorization`` (the local config writes the same shape)."""
    return render(p)


def state_sections(
    workloads: Iterable[Workload], services: Iterable[Service], policies: Iterable[Policy]
) -> StateSections:
    """ztunnel's ``ProxyState`` sections: ``workloads`` (by uid), ``services`` (by hostname),
    ``policies`` (by namespace/name) and ``stagedServices`` (endpoints of services not known
    yet, by namespace/hostname then uid)."""
    wls = sorted(workloads, key=lambda w: w.uid)
    svcs = sorted(services, key=lambda s: (s.hostname, s.namespace))
    by_service = endpoints_by_service(wls)
    known = {s.key for s in svcs}
    return {
        "workloads": [workload(w) for w in wls],
        "services": [service(s, by_service.get(s.key, {})) for s in svcs],
        "policies": [policy(p) for p in sorted(policies, key=lambda p: p.key)],
        "stagedServices": {k: v for k, v in sorted(by_service.items()) if k not in known},
    }


def pem_blocks(bundle: str) -> list[str]:
    """The certificates of a PEM bundle, each as its own PEM text (``...-----\\n``)."""
    out = []
    for part in bundle.split(_PEM_END)[:-1]:
        begin = part.find("-----BEGIN CERTIFICATE-----")
        if begin >= 0:
            out.append(part[begin:] + _PEM_END + "\n")
    return out


def rfc3339(iso: str) -> str:
    """An ISO 8601 time as ztunnel writes it: UTC, whole seconds, ``Z``."""
    at = datetime.fromisoformat(iso)
    if at.tzinfo is None:
        at = at.replace(tzinfo=UTC)
    return at.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def decimal_serial(hex_serial: str) -> str:
    """A serial number as ztunnel writes it (decimal) from meshctl's hexadecimal."""
    return str(int(hex_serial, 16))


def hex_serial(decimal: str) -> str:
    """A dump's (decimal) serial number as hexadecimal, as ``istioctl`` and the CA show it."""
    return format(int(decimal), "x")


def cert(facts: CertificateFacts, pem: str) -> CertDump:
    """One certificate as ztunnel's ``CertDump`` (the PEM base64-encoded, as ztunnel does),
    with its URI SANs under ``uriSans``."""
    return {
        "pem": base64.b64encode(pem.encode()).decode() if pem else "",
        "serialNumber": decimal_serial(facts["serialNumber"]),
        "validFrom": rfc3339(facts["validFrom"]),
        "expirationTime": rfc3339(facts["expirationTime"]),
        "uriSans": list(facts["uriSans"]),
    }


def certs(facts: Sequence[CertificateFacts], bundle: str) -> list[CertDump]:
    """Each certificate of ``bundle`` (described, in order, by ``facts``)."""
    pems = pem_blocks(bundle)
    return [cert(f, pems[i] if i < len(pems) else "") for i, f in enumerate(facts)]


def identity_certs(
    identity: str,
    state: str,
    chain: Sequence[CertificateFacts] = (),
    chain_pem: str = "",
    roots: Sequence[CertificateFacts] = (),
    roots_pem: str = "",
) -> CertificateSummary:
    """One identity's entry of ``certificates`` (ztunnel's ``CertsDump``)."""
    return {
        "identity": identity,
        "state": state,
        "certChain": certs(chain, chain_pem),
        "rootCerts": certs(roots, roots_pem),
    }


def pod_connections(flows: Iterable[FlowFacts], namespace: str, name: str) -> PodConnections:
    """The open connections of one enrolled pod as ztunnel's ``workloadState`` lists them.

    A flow's ``dst`` is where the connection went (a tunnel's :15008) and ``hboneAddr`` the
    destination inside the tunnel, as in the access log; ztunnel's ``inbound`` entries name the
    destination the connection was for (``actualDst``: inside the tunnel) and the service the
    client asked for (``originalDst``), its ``outbound`` ones where the pod sent it
    (``originalDst``) and where the proxy connected (``actualDst``: the tunnel's address)."""
    who = f"{namespace}/{name}"
    inbound: list[InboundConnection] = []
    outbound: list[OutboundConnection] = []
    for f in flows:
        tunnel = f["hboneAddr"]
        if f["direction"] == "inbound" and f["dst"]["workload"] == who:
            inbound.append(
                {
                    "src": f["src"]["addr"],
                    "originalDst": f["service"],
                    "actualDst": tunnel or f["dst"]["addr"],
                    "protocol": "HBONE" if f["mutualTls"] else "TCP",
                }
            )
        elif f["direction"] == "outbound" and f["src"]["workload"] == who:
            outbound.append(
                {
                    "src": f["src"]["addr"],
                    "originalDst": tunnel or f["dst"]["addr"],
                    "actualDst": f["dst"]["addr"],
                    "protocol": "HBONE" if tunnel else "TCP",
                }
            )
    inbound.sort(key=lambda c: (c["src"], c["actualDst"]))
    outbound.sort(key=lambda c: (c["src"], c["actualDst"]))
    return {"inbound": inbound, "outbound": outbound}
