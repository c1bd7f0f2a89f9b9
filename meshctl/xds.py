"""Istio's workload discovery on the wire: store records <-> protobuf, Delta ADS <-> ``core.delta``.

Owns the translation both ends of discovery share (the control plane encodes, the proxies
decode): ``istio.workload.Address`` (a Workload or a Service) and ``istio.security.Authorization``
to and from ``core.workloads`` records, and ``DeltaDiscoveryRequest``/``Response`` to and from
``core.delta``'s plain values. Invariants: a record survives encode -> decode unchanged; a
resource ztunnel would reject is refused here with ztunnel's reason (``WireError``: no type, an
address that is not 4 or 16 bytes, ``LEGACY_ISTIO_MTLS``, a services key without ``/``), so a
NACK names the resource and why; trust domain ``cluster.local`` travels as "" as Istio sends it.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable, Mapping
from typing import Any, TypedDict

from google.protobuf import any_pb2

from meshctl.core.mesh.records import (
    DEFAULT_TRUST_DOMAIN,
    Action,
    IPAddress,
    IPNetwork,
    Policy,
    Protocol,
    RbacMatch,
    Scope,
    Service,
    StringMatch,
    Workload,
)
from meshctl.core.xds import delta
from meshctl.core.xds.resources import ADDRESS_TYPE, AUTHORIZATION_TYPE
from meshctl.proto import authorization_pb2 as authz_pb
from meshctl.proto import workload_pb2 as wl_pb
from meshctl.proto import xds_pb2

TYPE_PREFIX = "type.googleapis.com/"
_WORKLOAD_TYPES = {
    "deployment": wl_pb.DEPLOYMENT,
    "cronjob": wl_pb.CRONJOB,
    "pod": wl_pb.POD,
    "job": wl_pb.JOB,
}
_WORKLOAD_TYPE_NAMES = {v: k for k, v in _WORKLOAD_TYPES.items()}
_SCOPES = {
    Scope.GLOBAL: authz_pb.GLOBAL,
    Scope.NAMESPACE: authz_pb.NAMESPACE,
    Scope.WORKLOAD_SELECTOR: authz_pb.WORKLOAD_SELECTOR,
}
_SCOPE_NAMES = {v: k for k, v in _SCOPES.items()}


class WireError(ValueError):
    """A resource that cannot become a record; ``str()`` is the reason for a NACK."""


# -- addresses and IPs ---------------------------------------------------------------------------


def _ip(raw: bytes) -> IPAddress:
    if len(raw) not in (4, 16):
        raise WireError(f"invalid address: {len(raw)} bytes (want 4 or 16)")
    return ipaddress.ip_address(raw)


def _network(address: bytes, length: int, *, has_length: bool) -> IPNetwork:
    ip = _ip(address)
    bits = length if has_length else ip.max_prefixlen
    try:
        return ipaddress.ip_network((ip, bits), strict=False)
    except ValueError as exc:
        raise WireError(f"invalid prefix length {bits} for {ip}") from exc


# -- workloads -----------------------------------------------------------------------------------


def workload_to_proto(w: Workload) -> wl_pb.Workload:
    out = wl_pb.Workload(
        uid=w.uid,
        name=w.name,
        namespace=w.namespace,
        addresses=[ip.packed for ip in w.workload_ips],
        network=w.network,
        tunnel_protocol=wl_pb.HBONE if w.protocol is Protocol.HBONE else wl_pb.NONE,
        trust_domain="" if w.trust_domain == DEFAULT_TRUST_DOMAIN else w.trust_domain,
        service_account=w.service_account,
        node=w.node,
        canonical_name=w.canonical_name,
        canonical_revision=w.canonical_revision,
        workload_type=_WORKLOAD_TYPES.get(w.workload_type, wl_pb.POD),
        workload_name=w.workload_name,
        authorization_policies=list(w.authorization_policies),
        status=wl_pb.HEALTHY if w.healthy else wl_pb.UNHEALTHY,
        cluster_id=w.cluster_id,
    )
    for key, ports in w.services.items():
        out.services[key].ports.extend(
            wl_pb.Port(service_port=p, target_port=t) for p, t in ports.items()
        )
    _extra_to_proto(w.extra, out)
    return out


def _extra_to_proto(extra: Mapping[str, Any], out: wl_pb.Workload) -> None:
    if extra.get("hostname"):
        out.hostname = str(extra["hostname"])
    if extra.get("nativeTunnel"):
        out.native_tunnel = True
    if extra.get("networkMode") == "HostNetwork":
        out.network_mode = wl_pb.HOST_NETWORK
    locality = extra.get("locality")
    if isinstance(locality, Mapping):
        out.locality.CopyFrom(
            wl_pb.Locality(
                region=str(locality.get("region", "")),
                zone=str(locality.get("zone", "")),
                subzone=str(locality.get("subzone", "")),
            )
        )
    if isinstance(extra.get("capacity"), int):
        out.capacity.value = extra["capacity"]
    tunnel = extra.get("applicationTunnel")
    if isinstance(tunnel, Mapping):
        out.application_tunnel.port = int(tunnel.get("port", 0))
        if tunnel.get("protocol") == "PROXY":
            out.application_tunnel.protocol = wl_pb.ApplicationTunnel.PROXY
        out.application_tunnel.SetInParent()
    for key, field in (("waypoint", out.waypoint), ("networkGateway", out.network_gateway)):
        gateway = extra.get(key)
        if isinstance(gateway, Mapping):
            field.CopyFrom(_gateway_to_proto(gateway))


def _gateway_to_proto(gateway: Mapping[str, Any]) -> wl_pb.GatewayAddress:
    out = wl_pb.GatewayAddress(hbone_mtls_port=int(gateway.get("hboneMtlsPort", 15008)))
    first, _, last = str(gateway.get("destination", "")).rpartition("/")
    try:
        ip = ipaddress.ip_address(last)
    except ValueError:
        out.hostname.CopyFrom(wl_pb.NamespacedHostname(namespace=first, hostname=last))
    else:
        out.address.CopyFrom(wl_pb.NetworkAddress(network=first, address=ip.packed))
    return out


class GatewayJson(TypedDict):
    """A waypoint or network gateway as the local config (and ``/config_dump``) write it."""

    destination: str  # NETWORK/IP or NAMESPACE/HOSTNAME
    hboneMtlsPort: int


def _gateway_from_proto(gateway: wl_pb.GatewayAddress) -> GatewayJson:
    which = gateway.WhichOneof("destination")
    if which is None:
        raise WireError("gateway address without a destination")
    if which == "address":
        destination = f"{gateway.address.network}/{_ip(gateway.address.address)}"
    else:
        destination = f"{gateway.hostname.namespace}/{gateway.hostname.hostname}"
    return {"destination": destination, "hboneMtlsPort": gateway.hbone_mtls_port}


def workload_from_proto(w: wl_pb.Workload) -> Workload:
    if w.tunnel_protocol == wl_pb.LEGACY_ISTIO_MTLS:
        raise WireError("unsupported tunnel protocol LEGACY_ISTIO_MTLS")
    if not w.uid:
        raise WireError("workload without uid")
    services: dict[str, dict[int, int]] = {}
    for key, ports in w.services.items():
        if "/" not in key:
            raise WireError(f"service key {key!r} must be namespace/hostname")
        services[key] = {p.service_port: p.target_port for p in ports.ports}
    extra: dict[str, object] = {}  # fields kept for /config_dump (local-config names)
    if w.hostname:
        extra["hostname"] = w.hostname
    if w.native_tunnel:
        extra["nativeTunnel"] = True
    if w.network_mode == wl_pb.HOST_NETWORK:
        extra["networkMode"] = "HostNetwork"
    if w.HasField("locality"):
        extra["locality"] = {
            "region": w.locality.region,
            "zone": w.locality.zone,
            "subzone": w.locality.subzone,
        }
    if w.HasField("capacity"):
        extra["capacity"] = w.capacity.value
    if w.HasField("application_tunnel"):
        protocol = "PROXY" if w.application_tunnel.protocol == 1 else "NONE"
        extra["applicationTunnel"] = {"protocol": protocol, "port": w.application_tunnel.port}
    if w.HasField("waypoint"):
        extra["waypoint"] = _gateway_from_proto(w.waypoint)
    if w.HasField("network_gateway"):
        extra["networkGateway"] = _gateway_from_proto(w.network_gateway)
    return Workload(
        uid=w.uid,
        name=w.name,
        namespace=w.namespace,
        service_account=w.service_account or "default",
        workload_ips=tuple(_ip(a) for a in w.addresses),
        protocol=Protocol.HBONE if w.tunnel_protocol == wl_pb.HBONE else Protocol.TCP,
        network=w.network,
        trust_domain=w.trust_domain or DEFAULT_TRUST_DOMAIN,
        node=w.node,
        workload_name=w.workload_name,
        workload_type=_WORKLOAD_TYPE_NAMES.get(w.workload_type, "pod"),
        canonical_name=w.canonical_name,
        canonical_revision=w.canonical_revision,
        cluster_id=w.cluster_id or "Kubernetes",
        authorization_policies=tuple(w.authorization_policies),
        healthy=w.status == wl_pb.HEALTHY,
        services=services,
        extra=extra,
    )


# -- services ------------------------------------------------------------------------------------


def service_to_proto(s: Service) -> wl_pb.Service:
    return wl_pb.Service(
        name=s.name,
        namespace=s.namespace,
        hostname=s.hostname,
        addresses=[wl_pb.NetworkAddress(network=net, address=ip.packed) for net, ip in s.vips],
        ports=[wl_pb.Port(service_port=p, target_port=t) for p, t in s.ports.items()],
        subject_alt_names=list(s.subject_alt_names),
        canonical=bool(s.extra.get("canonical", False)),
    )


def service_from_proto(s: wl_pb.Service) -> Service:
    if not s.namespace or not s.hostname:
        raise WireError("service without namespace and hostname")
    vips = []
    for a in s.addresses:
        if a.HasField("length") and a.length != len(a.address) * 8:
            continue  # a CIDR VIP: nothing here routes by it
        vips.append((a.network, _ip(a.address)))
    extra: dict[str, object] = {"canonical": True} if s.canonical else {}
    return Service(
        name=s.name,
        namespace=s.namespace,
        hostname=s.hostname,
        vips=tuple(vips),
        ports={p.service_port: p.target_port for p in s.ports},
        subject_alt_names=tuple(s.subject_alt_names),
        extra=extra,
    )


def address_to_proto(record: Workload | Service) -> wl_pb.Address:
    if isinstance(record, Workload):
        return wl_pb.Address(workload=workload_to_proto(record))
    return wl_pb.Address(service=service_to_proto(record))


def address_from_proto(address: wl_pb.Address) -> Workload | Service:
    which = address.WhichOneof("type")
    if which == "workload":
        return workload_from_proto(address.workload)
    if which == "service":
        return service_from_proto(address.service)
    raise WireError("address without a workload or a service")


# -- authorization -------------------------------------------------------------------------------


def _string_match_to_proto(m: StringMatch) -> authz_pb.StringMatch:
    out = authz_pb.StringMatch()
    if m.kind == "presence":
        out.presence.SetInParent()
    else:
        setattr(out, m.kind, m.value)
    return out


def _string_match_from_proto(m: authz_pb.StringMatch) -> StringMatch | None:
    kind = m.WhichOneof("match_type")
    if kind is None:
        return None  # ztunnel drops a StringMatch without a type
    return StringMatch(kind=kind, value="" if kind == "presence" else getattr(m, kind))


def _address_to_proto(net: IPNetwork) -> authz_pb.Address:
    return authz_pb.Address(address=net.network_address.packed, length=net.prefixlen)


def _match_to_proto(m: RbacMatch) -> authz_pb.Match:
    return authz_pb.Match(
        namespaces=[_string_match_to_proto(s) for s in m.namespaces],
        not_namespaces=[_string_match_to_proto(s) for s in m.not_namespaces],
        principals=[_string_match_to_proto(s) for s in m.principals],
        not_principals=[_string_match_to_proto(s) for s in m.not_principals],
        source_ips=[_address_to_proto(n) for n in m.source_ips],
        not_source_ips=[_address_to_proto(n) for n in m.not_source_ips],
        destination_ips=[_address_to_proto(n) for n in m.destination_ips],
        not_destination_ips=[_address_to_proto(n) for n in m.not_destination_ips],
        destination_ports=list(m.destination_ports),
        not_destination_ports=list(m.not_destination_ports),
        service_accounts=[
            authz_pb.ServiceAccountMatch(namespace=ns, serviceAccount=sa)
            for ns, sa in m.service_accounts
        ],
        not_service_accounts=[
            authz_pb.ServiceAccountMatch(namespace=ns, serviceAccount=sa)
            for ns, sa in m.not_service_accounts
        ],
    )


def _strings(items: Iterable[authz_pb.StringMatch]) -> tuple[StringMatch, ...]:
    return tuple(s for s in (_string_match_from_proto(i) for i in items) if s is not None)


def _addresses(items: Iterable[authz_pb.Address]) -> tuple[IPNetwork, ...]:
    return tuple(_network(a.address, a.length, has_length=True) for a in items)


def _ports(items: Iterable[int]) -> tuple[int, ...]:
    ports = tuple(items)
    for p in ports:
        if p > 65535:
            raise WireError(f"invalid port {p}")
    return ports


def _match_from_proto(m: authz_pb.Match) -> RbacMatch:
    return RbacMatch(
        namespaces=_strings(m.namespaces),
        not_namespaces=_strings(m.not_namespaces),
        principals=_strings(m.principals),
        not_principals=_strings(m.not_principals),
        source_ips=_addresses(m.source_ips),
        not_source_ips=_addresses(m.not_source_ips),
        destination_ips=_addresses(m.destination_ips),
        not_destination_ips=_addresses(m.not_destination_ips),
        destination_ports=_ports(m.destination_ports),
        not_destination_ports=_ports(m.not_destination_ports),
        service_accounts=tuple((s.namespace, s.serviceAccount) for s in m.service_accounts),
        not_service_accounts=tuple((s.namespace, s.serviceAccount) for s in m.not_service_accounts),
    )


def policy_to_proto(p: Policy) -> authz_pb.Authorization:
    return authz_pb.Authorization(
        name=p.name,
        namespace=p.namespace,
        scope=_SCOPES[p.scope],
        action=authz_pb.DENY if p.action is Action.DENY else authz_pb.ALLOW,
        rules=[
            authz_pb.Rule(
                clauses=[
                    authz_pb.Clause(matches=[_match_to_proto(m) for m in clause]) for clause in rule
                ]
            )
            for rule in p.rules
        ],
        dry_run=p.dry_run,
    )


def policy_from_proto(p: authz_pb.Authorization) -> Policy:
    if p.scope not in _SCOPE_NAMES:
        raise WireError(f"unknown scope {p.scope}")
    if p.action not in (authz_pb.ALLOW, authz_pb.DENY):
        raise WireError(f"unknown action {p.action}")
    return Policy(
        name=p.name,
        namespace=p.namespace,
        scope=_SCOPE_NAMES[p.scope],
        action=Action.DENY if p.action == authz_pb.DENY else Action.ALLOW,
        rules=tuple(
            tuple(tuple(_match_from_proto(m) for m in c.matches) for c in r.clauses)
            for r in p.rules
        ),
        dry_run=p.dry_run,
    )


# -- resources and Delta ADS messages ------------------------------------------------------------


def pack(type_url: str, record: Workload | Service | Policy) -> any_pb2.Any:
    """The ``Any`` body of a resource of ``type_url``."""
    message: Any
    if type_url == ADDRESS_TYPE and not isinstance(record, Policy):
        message = address_to_proto(record)
    elif type_url == AUTHORIZATION_TYPE and isinstance(record, Policy):
        message = policy_to_proto(record)
    else:
        raise WireError(f"a {type(record).__name__} is no {type_url} resource")
    return any_pb2.Any(type_url=type_url, value=message.SerializeToString(deterministic=True))


def unpack(type_url: str, body: any_pb2.Any) -> Workload | Service | Policy:
    """A resource body as a record; decoded as ``type_url`` says (ztunnel ignores the Any's own
    type URL). ``WireError`` says why it is refused."""
    try:
        if type_url == ADDRESS_TYPE:
            return address_from_proto(wl_pb.Address.FromString(body.value))
        if type_url == AUTHORIZATION_TYPE:
            return policy_from_proto(authz_pb.Authorization.FromString(body.value))
    except WireError:
        raise
    except Exception as exc:  # the protobuf runtime's DecodeError and friends
        raise WireError(f"decode: {exc}") from exc
    raise WireError(f"unknown resource type {type_url}")


def request_from_proto(r: xds_pb2.DeltaDiscoveryRequest) -> delta.Request:
    return delta.Request(
        type_url=r.type_url,
        subscribe=tuple(r.resource_names_subscribe),
        unsubscribe=tuple(r.resource_names_unsubscribe),
        initial_versions=dict(r.initial_resource_versions),
        nonce=r.response_nonce,
        error=r.error_detail.message if r.HasField("error_detail") else None,
    )


def response_to_proto(
    response: delta.Response, bodies: Mapping[str, any_pb2.Any], *, system_version: str = ""
) -> xds_pb2.DeltaDiscoveryResponse:
    """``bodies`` maps each resource's key to its packed record."""
    return xds_pb2.DeltaDiscoveryResponse(
        system_version_info=system_version,
        type_url=response.type_url,
        nonce=response.nonce,
        resources=[
            xds_pb2.Resource(name=r.name, version=r.version, resource=bodies[r.key])
            for r in response.resources
        ],
        removed_resources=list(response.removed),
    )
