"""Kubernetes objects (as a file or the API holds them) -> the ``GatewayConfig`` one proxy
serves: the standalone gateway's whole configuration step, without a control plane.

Owns: sorting objects by kind into translate's ``Cluster``; the certificates of
``kubernetes.io/tls`` Secrets (the caller's ``check`` says whether a key pair is usable: the core
parses no PEM); the ready endpoints of each backend the table names, from EndpointSlices (a
Service port found by name in the slice's ports, else its numeric targetPort; an endpoint whose
``conditions.ready`` is false is left out, an absent one counts as ready, as the API says); an
endpoint whose Pod (in the objects) is injected or ambient (its label, or its namespace's) is
reached through HBONE with the pod's service account as its identity, any other in plaintext.
Invariants: pure; a malformed object is a problem line, never an exception.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshctl.core.k8s.cluster import objects
from meshctl.core.k8s.cluster.objects import ObjectError
from meshctl.core.k8s.cluster.services import (
    ServiceFacts,
    read_endpoint_slice,
    read_service,
)

from . import eastwest
from .config import BackendKey, Endpoint, GatewayConfig, KeyPair
from .gateways import CertificateFacts
from .model import RouteTable, SecretRef
from .translate import Cluster, Translation, translate

INGRESS = "ingress"  # the --gateway name of the Ingress classes' proxy
TLS_SECRET = "kubernetes.io/tls"  # noqa: S105 (a Secret type, not a password)
# The translate input's field for each kind of object it reads (``translate.Cluster``).
CLUSTER_FIELDS = {
    "GatewayClass": "gateway_classes",
    "Gateway": "gateways",
    "HTTPRoute": "http_routes",
    "GRPCRoute": "grpc_routes",
    "TLSRoute": "tls_routes",
    "TCPRoute": "tcp_routes",
    "ReferenceGrant": "reference_grants",
    "Service": "services",
    "Namespace": "namespaces",
    "IngressClass": "ingress_classes",
    "Ingress": "ingresses",
}
KINDS = (*CLUSTER_FIELDS, "Secret", "EndpointSlice", "Pod")
DATAPLANE_MODE = "istio.io/dataplane-mode"  # ambient: the pod's traffic goes through HBONE
SIDECAR_STATUS = "sidecar.istio.io/status"  # injected: its sidecar takes HBONE on 15008

# A key pair -> "" when usable, else why not (the caller loads it into its TLS library).
Check = Callable[[KeyPair], str]


class ConfigProblemError(ValueError):
    """The objects do not make a configuration for the gateway asked for."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Local:
    config: GatewayConfig
    problems: tuple[str, ...]  # objects or parts skipped, one line each
    ignored: tuple[str, ...]  # kinds present that a gateway does not read


def secret_key_pair(obj: Mapping[str, Any]) -> KeyPair:
    """The key pair of a ``kubernetes.io/tls`` Secret (``data`` base64, or ``stringData``)."""
    namespace, name = objects.identify(obj, "Secret")
    if objects.text(obj, "type") != TLS_SECRET:
        raise ObjectError(f"Secret {namespace}/{name} is not of type {TLS_SECRET}")
    found: dict[str, bytes] = {}
    for key in ("tls.crt", "tls.key"):
        plain = objects.field(obj, "stringData", key)
        encoded = objects.field(obj, "data", key)
        if isinstance(plain, str):
            found[key] = plain.encode()
        elif isinstance(encoded, str):
            try:
                found[key] = base64.b64decode(encoded, validate=True)
            except (binascii.Error, ValueError) as exc:
                raise ObjectError(f"Secret {namespace}/{name}: data.{key} is not base64") from exc
        else:
            raise ObjectError(f"Secret {namespace}/{name} has no {key}")
    return KeyPair(chain_pem=found["tls.crt"], key_pem=found["tls.key"])


@dataclass(frozen=True, slots=True, kw_only=True)
class Mesh:
    """What makes an endpoint meshed: its pod (ambient, or injected) and its identity."""

    trust_domain: str = "cluster.local"
    pods: Mapping[tuple[str, str], Mapping[str, Any]] = field(default_factory=dict)
    ambient_namespaces: frozenset[str] = frozenset()

    def endpoint(self, address: str, port: int, workload: str) -> Endpoint:
        namespace, _, name = workload.partition("/")
        pod = self.pods.get((namespace, name))
        if pod is None:
            return Endpoint(address=address, port=port, workload=workload)
        labels = objects.string_map(pod, "metadata", "labels")
        annotations = objects.string_map(pod, "metadata", "annotations")
        mode = labels.get(DATAPLANE_MODE, "")
        meshed = (
            SIDECAR_STATUS in annotations
            or mode == "ambient"
            or (namespace in self.ambient_namespaces and mode != "none")
        )
        if not meshed:
            return Endpoint(address=address, port=port, workload=workload)
        account = objects.text(pod, "spec", "serviceAccountName") or "default"
        identity = f"spiffe://{self.trust_domain}/ns/{namespace}/sa/{account}"
        return Endpoint(
            address=address, port=port, hbone=True, identity=identity, workload=workload
        )


NO_MESH = Mesh()


def ready_endpoints(
    service: ServiceFacts, port: int, slices: Iterable[Mapping[str, Any]], mesh: Mesh = NO_MESH
) -> tuple[Endpoint, ...]:
    """The ready endpoints serving ``service``'s ``port`` in its EndpointSlices (a slice is the
    Service's when it carries the ``kubernetes.io/service-name`` label with its name); an
    endpoint whose pod is meshed (``mesh``) is reached through HBONE."""
    spec = next((p for p in service.ports if p.port == port), None)
    if spec is None:
        return ()
    out: list[Endpoint] = []
    for obj in slices:
        try:
            facts = read_endpoint_slice(obj)
        except ObjectError:
            continue  # a slice without a name or namespace is no Service's
        if (facts.namespace, facts.service) != (service.namespace, service.name):
            continue
        target = facts.ports.get(spec.name) or spec.target
        if not target:
            continue  # a named targetPort the slice does not carry: no port to reach
        for endpoint in objects.items(obj, "endpoints"):
            if objects.field(endpoint, "conditions", "ready") is False:
                continue
            ref = objects.field(endpoint, "targetRef")
            workload = ""
            if isinstance(objects.field(ref, "name"), str):
                workload = f"{objects.field(ref, 'namespace') or service.namespace}/{ref['name']}"
            for address in objects.items(endpoint, "addresses"):
                if isinstance(address, str):
                    out.append(mesh.endpoint(address, target, workload))
    return tuple(dict.fromkeys(out))


def gateway_config(
    items: Sequence[Mapping[str, Any]],
    *,
    gateway: str,
    check: Check,
    now: str,
    version: str = "",
    trust_domain: str = "cluster.local",
) -> Local:
    """The configuration of ``gateway`` ("NAMESPACE/NAME", "ingress", or "" for the only Gateway
    of ours in ``items``, else the Ingress proxy) from every object in ``items``."""
    by_kind: dict[str, list[Any]] = {field: [] for field in CLUSTER_FIELDS.values()}
    secrets: list[Mapping[str, Any]] = []
    slices: list[Mapping[str, Any]] = []
    pods: dict[tuple[str, str], Mapping[str, Any]] = {}
    ignored: set[str] = set()
    problems: list[str] = []
    for obj in items:
        kind = objects.field(obj, "kind")
        if kind in CLUSTER_FIELDS:
            by_kind[CLUSTER_FIELDS[kind]].append(obj)
        elif kind == "Secret":
            secrets.append(obj)
        elif kind == "EndpointSlice":
            slices.append(obj)
        elif kind == "Pod":
            try:
                pods[objects.identify(obj, "Pod")] = obj
            except ObjectError as exc:
                problems.append(f"Pod skipped: {exc}")
        else:
            ignored.add(str(kind))
    pairs: dict[SecretRef, KeyPair] = {}
    facts: dict[tuple[str, str], CertificateFacts] = {}
    for obj in secrets:
        try:
            namespace, name = objects.identify(obj, "Secret")
            pair = secret_key_pair(obj)
        except ObjectError as exc:
            problems.append(f"Secret skipped: {exc}")
            if isinstance(objects.field(obj, "metadata", "name"), str):
                key = (str(objects.field(obj, "metadata", "namespace")), obj["metadata"]["name"])
                facts[key] = CertificateFacts(valid=False, message=str(exc))
            continue
        why = check(pair)
        facts[(namespace, name)] = CertificateFacts(valid=not why, message=why)
        if why:
            problems.append(f"Secret {namespace}/{name}: {why}")
        else:
            pairs[SecretRef(namespace, name)] = pair
    cluster = Cluster(
        gateway_classes=by_kind["gateway_classes"],
        gateways=by_kind["gateways"],
        http_routes=by_kind["http_routes"],
        grpc_routes=by_kind["grpc_routes"],
        tls_routes=by_kind["tls_routes"],
        tcp_routes=by_kind["tcp_routes"],
        reference_grants=by_kind["reference_grants"],
        services=by_kind["services"],
        namespaces=by_kind["namespaces"],
        ingress_classes=by_kind["ingress_classes"],
        ingresses=by_kind["ingresses"],
        certificates=facts,
    )
    translation = translate(cluster, now=now)
    problems.extend(translation.problems)
    name, table = _table_of(translation, gateway)
    services = _services(by_kind["services"], problems)
    config = GatewayConfig(
        name=name,
        version=version or _digest(items),
        table=table,
        certificates={
            ref: pairs[ref]
            for port in table.ports
            for lr in port.listeners
            for ref in lr.listener.certificates
            if ref in pairs
        },
        endpoints=_endpoints(
            table, services, slices, _mesh(trust_domain, pods, by_kind["namespaces"]), problems
        ),
    )

    return Local(config=config, problems=tuple(problems), ignored=tuple(sorted(ignored)))


def _table_of(translation: Translation, gateway: str) -> tuple[str, RouteTable]:
    if gateway == INGRESS:
        return INGRESS, translation.ingress
    if gateway:
        namespace, _, name = gateway.partition("/")
        table = translation.gateways.get((namespace, name))
        if table is None:
            known = ", ".join(f"{ns}/{n}" for ns, n in sorted(translation.gateways)) or "none"
            raise ConfigProblemError(
                f"no accepted Gateway {gateway} of class meshctl's controller (accepted: {known})"
            )
        return gateway, table
    if len(translation.gateways) == 1:
        ((namespace, name), table), *_ = translation.gateways.items()
        return f"{namespace}/{name}", table
    if translation.gateways:
        known = ", ".join(f"{ns}/{n}" for ns, n in sorted(translation.gateways))
        raise ConfigProblemError(f"several Gateways to serve ({known}): say which one")
    return INGRESS, translation.ingress


def _services(items: Iterable[Any], problems: list[str]) -> dict[tuple[str, str], ServiceFacts]:
    out = {}
    for obj in items:
        try:
            facts = read_service(obj)
        except ObjectError:
            continue  # translate said so
        out[facts.key] = facts
    return out


def _endpoints(
    table: RouteTable,
    services: Mapping[tuple[str, str], ServiceFacts],
    slices: Sequence[Mapping[str, Any]],
    mesh: Mesh,
    problems: list[str],
) -> dict[BackendKey, tuple[Endpoint, ...]]:
    out: dict[BackendKey, tuple[Endpoint, ...]] = {}
    entries = [
        entry
        for port in table.ports
        for lr in port.listeners
        for vh in lr.hosts
        for entry in vh.entries
    ]
    entries.extend(port.default for port in table.ports if port.default is not None)
    for entry in entries:
        for backend in entry.rule.backends:
            key = BackendKey.of(backend)
            service = services.get((backend.namespace, backend.name))
            if key in out or not backend.resolved or service is None:
                continue
            try:
                found = ready_endpoints(service, backend.port, slices, mesh)
            except ObjectError as exc:
                problems.append(f"EndpointSlice of {key} skipped: {exc}")
                continue
            if found:
                out[key] = found
    if eastwest.has_auto_passthrough(table):
        return _every_service_port(out, services, slices, mesh, problems)
    return out


def _every_service_port(
    found: Mapping[BackendKey, tuple[Endpoint, ...]],
    services: Mapping[tuple[str, str], ServiceFacts],
    slices: Sequence[Mapping[str, Any]],
    mesh: Mesh,
    problems: list[str],
) -> dict[BackendKey, tuple[Endpoint, ...]]:
    """An east-west port's view: every Service port, with its ready endpoints or none (an empty
    entry: the Service and port exist, nothing is ready), beside the routes' backends."""
    out = dict(found)
    for service in services.values():
        if service.external_name:
            continue  # no endpoints of its own to pass through to
        for port in service.ports:
            key = BackendKey(service.namespace, service.name, port.port)
            if key in out:
                continue
            try:
                out[key] = ready_endpoints(service, port.port, slices, mesh)
            except ObjectError as exc:
                problems.append(f"EndpointSlice of {key} skipped: {exc}")
                out[key] = ()
    return out


def _mesh(
    trust_domain: str, pods: Mapping[tuple[str, str], Mapping[str, Any]], namespaces: list[Any]
) -> Mesh:
    ambient = set()
    for obj in namespaces:
        try:
            labels = objects.string_map(obj, "metadata", "labels")
        except ObjectError:
            continue
        if labels.get(DATAPLANE_MODE) == "ambient":
            ambient.add(str(objects.field(obj, "metadata", "name")))
    return Mesh(trust_domain=trust_domain, pods=pods, ambient_namespaces=frozenset(ambient))


def _digest(items: Sequence[Mapping[str, Any]]) -> str:
    text = json.dumps(list(items), sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()[:12]
