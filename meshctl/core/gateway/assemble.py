"""What the controller hands each gateway proxy, beyond its route table: the certificates its
listeners name and the ready endpoints of its backends; and the facts translate needs back
(each TLS Secret's usability, each proxy's readiness and addresses).

Owns reading ``kubernetes.io/tls`` Secrets (PEM chain and key, parsed and matched to each other
so a bad one is a status condition and never reaches a proxy), EndpointSlices into endpoints
(ready only: ``conditions.ready`` absent counts as ready, as the API says; the Service port's
name picks the slice's port), a workload's mesh membership (the caller's lookup by IP: an
HBONE workload, sidecar or ambient, is reached through HBONE and checked against its identity),
and a provisioned proxy's runtime (ready with one ready replica; addresses from the Service's
``status.loadBalancer.ingress``, else its ClusterIPs: no LoadBalancer implementation answers in
many clusters). Invariants: pure; malformed objects are skipped; output is sorted, so equal
inputs give equal configs (and equal versions).
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization

from meshctl.core.k8s.cluster import objects
from meshctl.core.k8s.cluster.objects import ObjectError
from meshctl.core.k8s.cluster.services import SliceFacts, read_endpoint_slice, read_service

from . import eastwest
from .config import BackendKey, Endpoint, GatewayConfig, KeyPair
from .gateways import Address, CertificateFacts, GatewayRuntime
from .model import Entry, RouteTable, SecretRef

TLS_TYPE = "kubernetes.io/tls"


@dataclass(frozen=True, slots=True)
class MeshMember:
    """A workload in the mesh (HBONE), as the workload store knows it."""

    identity: str  # spiffe://...
    workload: str  # "<namespace>/<name>"


MeshLookup = Callable[[str], MeshMember | None]  # by IP; None: not in the mesh


# -- certificates --------------------------------------------------------------------------------


def read_tls_secret(secret: Any) -> KeyPair | str:
    """The Secret's certificate chain and key, or why it cannot serve."""
    try:
        return _read_tls_secret(secret)
    except _UnusableError as exc:
        return str(exc)


class _UnusableError(Exception):
    """Why a Secret cannot serve."""


def _read_tls_secret(secret: Any) -> KeyPair:
    kind = objects.text(secret, "type")
    if kind != TLS_TYPE:
        raise _UnusableError(f"Secret is of type {kind or '(none)'}, not {TLS_TYPE}")
    pems = {key: _data(secret, key) for key in ("tls.crt", "tls.key")}
    try:
        chain = x509.load_pem_x509_certificates(pems["tls.crt"])
    except ValueError:
        raise _UnusableError("tls.crt holds no PEM certificate") from None
    try:
        key = serialization.load_pem_private_key(pems["tls.key"], password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise _UnusableError("tls.key holds no usable unencrypted PEM private key") from None
    spki = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    if chain[0].public_key().public_bytes(*spki) != key.public_key().public_bytes(*spki):
        raise _UnusableError("tls.key does not match the first certificate of tls.crt")
    return KeyPair(chain_pem=pems["tls.crt"], key_pem=pems["tls.key"])


def _data(secret: Any, key: str) -> bytes:
    value = objects.field(secret, "data", key)
    if not isinstance(value, str) or not value:
        raise _UnusableError(f"Secret has no {key}")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise _UnusableError(f"Secret's {key} is not base64") from None


def certificate_facts(
    pairs: Mapping[tuple[str, str], KeyPair | str],
) -> dict[tuple[str, str], CertificateFacts]:
    """Translate's view of the read Secrets (absent ones are translate's to report)."""
    return {
        key: CertificateFacts()
        if isinstance(pair, KeyPair)
        else CertificateFacts(valid=False, message=pair)
        for key, pair in pairs.items()
    }


# -- the config ----------------------------------------------------------------------------------


def _entries(table: RouteTable) -> Iterator[Entry]:
    for port in table.ports:
        for lr in port.listeners:
            for vh in lr.hosts:
                yield from vh.entries
        if port.default is not None:
            yield port.default


def backends(table: RouteTable) -> set[BackendKey]:
    """Every resolved backend the table sends to."""
    out: set[BackendKey] = set()
    for entry in _entries(table):
        out.update(BackendKey.of(b) for b in entry.rule.backends if b.resolved)
    return out


def secrets(table: RouteTable) -> set[SecretRef]:
    """Every certificate the table's listeners serve."""
    return {
        ref for port in table.ports for lr in port.listeners for ref in lr.listener.certificates
    }


def endpoints(
    wanted: set[BackendKey],
    services: Sequence[Any],
    slices: Sequence[Any],
    mesh: MeshLookup,
) -> dict[BackendKey, tuple[Endpoint, ...]]:
    """The ready endpoints of each wanted Service port (a port with none is left out)."""
    by_service: dict[tuple[str, str], list[tuple[SliceFacts, Any]]] = {}
    for s in slices:
        try:
            facts = read_endpoint_slice(s)
        except ObjectError:
            continue
        if facts.service:
            by_service.setdefault((facts.namespace, facts.service), []).append((facts, s))
    port_names: dict[tuple[str, str, int], str] = {}
    for obj in services:
        try:
            svc = read_service(obj)
        except ObjectError:
            continue
        for p in svc.ports:
            port_names[(svc.namespace, svc.name, p.port)] = p.name
    out: dict[BackendKey, tuple[Endpoint, ...]] = {}
    for key in sorted(wanted, key=lambda k: (k.namespace, k.name, k.port)):
        name = port_names.get((key.namespace, key.name, key.port))
        if name is None:
            continue
        found: dict[tuple[str, int], Endpoint] = {}
        for facts, s in by_service.get((key.namespace, key.name), ()):
            target = facts.ports.get(name)
            if target is not None:
                for address in _ready_addresses(s):
                    found[(address, target)] = _endpoint(address, target, mesh)
        if found:
            out[key] = tuple(found[k] for k in sorted(found))
    return out


def _ready_addresses(s: Any) -> Iterator[str]:
    for e in objects.items(s, "endpoints"):
        if objects.field(e, "conditions", "ready") is False:
            continue
        yield from (a for a in objects.items(e, "addresses") if isinstance(a, str) and a)


def _endpoint(address: str, port: int, mesh: MeshLookup) -> Endpoint:
    member = mesh(address)
    if member is None:
        return Endpoint(address=address, port=port)
    return Endpoint(
        address=address,
        port=port,
        hbone=True,
        identity=member.identity,
        workload=member.workload,
    )


def gateway_config(
    name: str,
    table: RouteTable,
    pairs: Mapping[tuple[str, str], KeyPair | str],
    services: Sequence[Any],
    slices: Sequence[Any],
    mesh: MeshLookup,
) -> GatewayConfig:
    """One proxy's whole config (its version is the publisher's to stamp)."""
    certificates = {}
    for ref in sorted(secrets(table), key=lambda r: (r.namespace, r.name)):
        pair = pairs.get((ref.namespace, ref.name))
        if isinstance(pair, KeyPair):
            certificates[ref] = pair
    wanted = backends(table)
    found = endpoints(wanted, services, slices, mesh)
    if eastwest.has_auto_passthrough(table):
        # An east-west port reaches every Service port by SNI: each is listed, ready
        # endpoints or none (an empty entry says the Service and port exist).
        every = eastwest.service_ports(_service_ports(services)) - wanted
        found.update(endpoints(every, services, slices, mesh))
        for key in every - found.keys():
            found[key] = ()
    return GatewayConfig(
        name=name,
        table=table,
        certificates=certificates,
        endpoints={k: found[k] for k in sorted(found, key=lambda k: (k.namespace, k.name, k.port))},
    )


def _service_ports(services: Sequence[Any]) -> Iterator[tuple[str, str, list[int]]]:
    for obj in services:
        try:
            svc = read_service(obj)
        except ObjectError:
            continue
        if not svc.external_name:
            yield svc.namespace, svc.name, [p.port for p in svc.ports]


# -- the proxy's runtime -------------------------------------------------------------------------


def runtime(deployment: Any, service: Any) -> GatewayRuntime:
    """A provisioned proxy as translate needs it (None objects: not there yet)."""
    ready = objects.field(deployment, "status", "readyReplicas")
    addresses: list[Address] = []
    for ingress in objects.items(service, "status", "loadBalancer", "ingress"):
        if objects.text(ingress, "ip"):
            addresses.append(Address(value=ingress["ip"]))
        elif objects.text(ingress, "hostname"):
            addresses.append(Address(value=ingress["hostname"], type="Hostname"))
    if not addresses:
        ips = objects.items(service, "spec", "clusterIPs") or [
            objects.text(service, "spec", "clusterIP")
        ]
        addresses = [
            Address(value=ip) for ip in ips if isinstance(ip, str) and ip not in ("", "None")
        ]
    return GatewayRuntime(
        ready=isinstance(ready, int) and not isinstance(ready, bool) and ready > 0,
        addresses=tuple(addresses),
    )
