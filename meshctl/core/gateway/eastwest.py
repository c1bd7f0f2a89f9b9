"""Istio's east-west gateway (``AUTO_PASSTHROUGH``, port 15443): which listeners are one, and
where a connection's ``outbound_.<port>_.<subset>_.<host>`` server name sends it.

Owns two rules. A Gateway API listener is auto-passthrough, as Istio's ``IsAutoPassthrough``
decides it (pilot/pkg/serviceregistry/kube, Istio 1.2x): it has a ``tls`` block and either its
``tls.options`` say ``gateway.istio.io/listener-protocol: auto-passthrough``, or its Gateway
carries ``topology.istio.io/network`` and the listener's port is 15443 (or the Gateway's
``networking.istio.io/gatewayPort`` label). Such a listener (protocol TLS, mode Passthrough)
takes no routes: the SNI names the destination itself, a Service of this cluster
(``<name>.<namespace>.svc.<domain>``) and one of its ports; the connection goes to that port's
ready endpoints, still encrypted. Invariants: pure; every refusal carries a one-line reason for
the access log; only the canonical name form routes (``meshctl.core.tls.sni``).
"""

from __future__ import annotations

import enum
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from meshctl.core.tls.sni import AutoPassthroughName, ServerNameError, parse_auto_passthrough

from .config import BackendKey, Endpoint, GatewayConfig
from .model import RouteTable

LISTENER_OPTION = "gateway.istio.io/listener-protocol"  # a listener's tls.options key
AUTO_PASSTHROUGH = "auto-passthrough"  # ... and its value
NETWORK_LABEL = "topology.istio.io/network"  # the Gateway is a multi-network gateway
PORT_LABEL = "networking.istio.io/gatewayPort"  # ... whose east-west port is not 15443
DEFAULT_PORT = 15443


def is_auto_passthrough(
    gateway_labels: Mapping[str, str],
    port: int,
    *,
    has_tls: bool,
    tls_options: Mapping[str, str],
) -> bool:
    """Whether a listener on ``port`` of a Gateway with ``gateway_labels`` is an east-west
    (``AUTO_PASSTHROUGH``) listener; the listener's mode is checked by the caller."""
    if not has_tls:
        return False
    if tls_options.get(LISTENER_OPTION) == AUTO_PASSTHROUGH:
        return True
    if NETWORK_LABEL not in gateway_labels:
        return False
    return gateway_labels.get(PORT_LABEL, str(DEFAULT_PORT)) == str(port)


def has_auto_passthrough(table: RouteTable) -> bool:
    """Whether some port of ``table`` is an east-west port (its proxy then needs the endpoints
    of every Service port, not only of its routes' backends)."""
    return any(auto_passthrough_port(table, p.port) for p in table.ports)


def auto_passthrough_port(table: RouteTable, port_number: int) -> bool:
    """Whether ``port_number`` is served as an east-west port: a listener on it is."""
    port = table.port(port_number)
    return port is not None and any(lr.listener.auto_passthrough for lr in port.listeners)


def service_ports(services: Iterable[tuple[str, str, Iterable[int]]]) -> set[BackendKey]:
    """Every (namespace, name, port) of ``services`` given as (namespace, name, ports)."""
    return {BackendKey(ns, name, port) for ns, name, ports in services for port in ports}


class Outcome(enum.StrEnum):
    FORWARD = "forward"
    BAD_NAME = "bad-sni"  # not outbound_.<port>_.<subset>_.<host>
    UNKNOWN_SERVICE = "unknown-service"  # no Service of this cluster has that host
    UNKNOWN_PORT = "unknown-port"  # the Service has no such port
    UNKNOWN_SUBSET = "unknown-subset"  # a subset: no DestinationRule subsets here
    NO_ENDPOINT = "no-endpoint"  # the port has no ready endpoint


@dataclass(frozen=True, slots=True, kw_only=True)
class Destination:
    outcome: Outcome
    reason: str  # "outbound_.8080_._.web.b.svc.cluster.local -> b/web:8080" or why not
    name: AutoPassthroughName | None = None
    service: BackendKey | None = None
    endpoints: tuple[Endpoint, ...] = ()


def _refuse(outcome: Outcome, detail: str, **found: object) -> Destination:
    return Destination(outcome=outcome, reason=f"{outcome} ({detail})", **found)  # type: ignore[arg-type]


def service_of(host: str, domain: str) -> tuple[str, str] | None:
    """(namespace, name) of a cluster Service host ``<name>.<namespace>.svc.<domain>``."""
    suffix = f".svc.{domain.lower().rstrip('.')}"
    if not host.endswith(suffix):
        return None
    parts = host[: -len(suffix)].split(".")
    if len(parts) != 2 or not all(parts):
        return None
    name, namespace = parts
    return namespace, name


def destination(config: GatewayConfig, server_name: str, domain: str) -> Destination:
    """Where a connection with ``server_name`` goes through an east-west port of ``config``."""
    try:
        name = parse_auto_passthrough(server_name)
    except ServerNameError as exc:
        return _refuse(Outcome.BAD_NAME, str(exc) if server_name else "no SNI")
    key = _service_port(config, name, domain)
    if isinstance(key, Destination):
        return key
    if name.subset:
        return _refuse(
            Outcome.UNKNOWN_SUBSET,
            f"subset {name.subset} of {key}: no DestinationRule subsets are served",
            name=name,
            service=key,
        )
    endpoints = config.endpoints[key]
    if not endpoints:
        return _refuse(Outcome.NO_ENDPOINT, f"{key} has no ready endpoint", name=name, service=key)
    return Destination(
        outcome=Outcome.FORWARD,
        reason=f"auto-passthrough {key}",
        name=name,
        service=key,
        endpoints=endpoints,
    )


def _service_port(
    config: GatewayConfig, name: AutoPassthroughName, domain: str
) -> BackendKey | Destination:
    """The Service port ``name`` names, or the refusal saying why none."""
    found = service_of(name.host, domain)
    if found is None:
        return _refuse(
            Outcome.UNKNOWN_SERVICE, f"{name.host} is no <name>.<namespace>.svc.{domain}", name=name
        )
    namespace, service = found
    ports = sorted(k.port for k in config.endpoints if (k.namespace, k.name) == found)
    if not ports:
        return _refuse(Outcome.UNKNOWN_SERVICE, f"no Service {namespace}/{service}", name=name)
    if name.port not in ports:
        shown = ", ".join(str(p) for p in ports)
        return _refuse(
            Outcome.UNKNOWN_PORT,
            f"Service {namespace}/{service} has no port {name.port} (ports: {shown})",
            name=name,
        )
    return BackendKey(namespace, service, name.port)


def destination_data(found: Destination) -> dict[str, Any]:
    """``found`` as ``meshctl gateway explain`` prints it."""
    out: dict[str, Any] = {"outcome": str(found.outcome), "reason": found.reason}
    if found.service is not None:
        out["service"] = str(found.service)
    if found.endpoints:
        out["endpoints"] = [
            f"{e.address}:{e.port}" + (f" (HBONE, {e.identity})" if e.hbone else "")
            for e in found.endpoints
        ]
    return out
