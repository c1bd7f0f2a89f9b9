"""Gateways of our classes: which listeners are valid, what they serve, and the status of the
GatewayClass and the Gateway (per-listener conditions and ``attachedRoutes`` included).

Owns listener validity. A listener is accepted when its protocol is HTTP, HTTPS (TLS mode
Terminate) or TLS (mode Passthrough) and no other listener on its port conflicts: another
protocol on the port conflicts all of them (``ProtocolConflict``), the same hostname on the same
port both (``HostnameConflict``); the API forbids picking a winner. References resolve when the
certificateRefs are core Secrets, allowed (same namespace or a ReferenceGrant:
``RefNotPermitted``) and present and valid by the caller's certificate facts
(``InvalidCertificateRef``), and the allowed route kinds are the protocol's (HTTPRoute and
GRPCRoute for HTTP and HTTPS, TLSRoute for TLS, TCPRoute for TCP; else ``InvalidRouteKinds``).
A TCP listener's hostname is ignored (the API's rule: nothing on the wire names one), so two
TCP listeners on a port conflict whatever their hostnames. A listener serves when accepted and,
for HTTPS, at least one certificate is usable. Invariant: pure; status is recomputed whole.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from . import conditions
from .conditions import Condition
from .gatewayapi import (
    GROUP,
    GRPCROUTE,
    HTTPROUTE,
    TCPROUTE,
    TLSROUTE,
    GatewayClassFacts,
    GatewayFacts,
    GrantFacts,
    ListenerSpec,
    conditions_of,
    permits,
)
from .hostnames import ANY
from .model import Listener, Protocol, SecretRef

SUPPORTED_PROTOCOLS = {p.value for p in Protocol}
# The route kinds each protocol's listeners take (the API's kinds per protocol), in the order
# supportedKinds lists them.
ROUTE_KINDS: dict[Protocol, tuple[tuple[str, str], ...]] = {
    Protocol.HTTP: (HTTPROUTE, GRPCROUTE),
    Protocol.HTTPS: (HTTPROUTE, GRPCROUTE),
    Protocol.TLS: (TLSROUTE,),
    Protocol.TCP: (TCPROUTE,),
}
# The TLS mode a protocol's listener must have (absent: the API's default, Terminate).
TLS_MODE = {Protocol.HTTPS: "Terminate", Protocol.TLS: "Passthrough"}


@dataclass(frozen=True, slots=True, kw_only=True)
class CertificateFacts:
    """What the caller found of a referenced Secret (the core parses no certificates): a
    ``kubernetes.io/tls`` Secret with a usable certificate and key, or why not."""

    valid: bool = True
    message: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Address:
    value: str
    type: str = "IPAddress"  # or Hostname


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayRuntime:
    """The Gateway's proxy as the controller sees it: ready, and the addresses it answers on."""

    ready: bool = False
    addresses: tuple[Address, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class ListenerState:
    spec: ListenerSpec
    listener: Listener  # certificates: the usable ones
    supported_kinds: tuple[tuple[str, str], ...]
    accepted: Condition
    conflicted: Condition
    resolved: Condition

    @property
    def serves(self) -> bool:
        return self.accepted.status and (
            self.listener.protocol is not Protocol.HTTPS or bool(self.listener.certificates)
        )


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayState:
    facts: GatewayFacts
    listeners: tuple[ListenerState, ...]
    accepted: Condition

    @property
    def key(self) -> tuple[str, str]:
        return self.facts.meta.key


def class_accepted(cls: GatewayClassFacts) -> Condition:
    if cls.parameters:
        return Condition("Accepted", False, "InvalidParameters", "meshctl takes no parametersRef")
    return Condition("Accepted", True, "Accepted", "handled by meshctl")


def class_status(cls: GatewayClassFacts, *, now: str) -> dict[str, Any]:
    return {
        "conditions": conditions.merge(
            [class_accepted(cls)],
            conditions_of(cls.status, "conditions"),
            generation=cls.meta.generation,
            now=now,
        )
    }


def _conflicts(specs: Sequence[ListenerSpec]) -> dict[str, str]:
    """listener name -> HostnameConflict | ProtocolConflict, among supported listeners."""
    supported = [s for s in specs if s.protocol in SUPPORTED_PROTOCOLS]
    protocols: dict[int, set[str]] = {}
    for s in supported:
        protocols.setdefault(s.port, set()).add(s.protocol)
    same_host = Counter((s.port, _hostname(s)) for s in supported)
    out = {}
    for s in supported:
        if len(protocols[s.port]) > 1:
            out[s.name] = "ProtocolConflict"
        elif same_host[(s.port, _hostname(s))] > 1:
            out[s.name] = "HostnameConflict"
    return out


def _hostname(spec: ListenerSpec) -> str:
    """The hostname a listener serves: ANY on TCP, where none is ever seen."""
    return ANY if spec.protocol == Protocol.TCP else spec.hostname


def _certificates(
    spec: ListenerSpec,
    namespace: str,
    certificates: Mapping[tuple[str, str], CertificateFacts],
    grants: list[GrantFacts],
) -> tuple[tuple[SecretRef, ...], list[tuple[str, str]]]:
    usable: list[SecretRef] = []
    problems: list[tuple[str, str]] = []
    if not spec.certificate_refs:
        problems.append(("InvalidCertificateRef", "HTTPS needs tls.certificateRefs"))
    for ref in spec.certificate_refs:
        where = f"{ref.kind} {ref.namespace}/{ref.name}"
        if (ref.group, ref.kind) != ("", "Secret"):
            problems.append(("InvalidCertificateRef", f"{where}: only core Secrets are supported"))
        elif not permits(grants, (GROUP, "Gateway", namespace), ("", "Secret", *_at(ref))):
            problems.append(
                ("RefNotPermitted", f"{where}: no ReferenceGrant in {ref.namespace} allows it")
            )
        elif (facts := certificates.get(_at(ref))) is None:
            problems.append(("InvalidCertificateRef", f"{where} not found"))
        elif not facts.valid:
            problems.append(("InvalidCertificateRef", f"{where}: {facts.message or 'invalid'}"))
        else:
            usable.append(SecretRef(ref.namespace, ref.name))
    return tuple(usable), problems


def _at(ref: Any) -> tuple[str, str]:
    return (ref.namespace, ref.name)


def listener_states(
    gw: GatewayFacts,
    certificates: Mapping[tuple[str, str], CertificateFacts],
    grants: list[GrantFacts],
) -> tuple[ListenerState, ...]:
    conflicts = _conflicts(gw.listeners)
    owner = f"{gw.meta.namespace}/{gw.meta.name}"
    out = []
    for spec in gw.listeners:
        supported = spec.protocol in SUPPORTED_PROTOCOLS
        problems: list[tuple[str, str]] = []
        usable: tuple[SecretRef, ...] = ()
        if supported and spec.protocol == Protocol.HTTPS and spec.tls_mode == "Terminate":
            usable, problems = _certificates(spec, gw.meta.namespace, certificates, grants)
        mode = TLS_MODE.get(Protocol(spec.protocol)) if supported else None
        if not supported or (mode is not None and spec.tls_mode != mode):
            # A listener we refuse takes no kind (the conformance suite's
            # TLSRouteListenerTerminateNotSupported wants supportedKinds empty).
            kinds: tuple[tuple[str, str], ...] = ()
        elif spec.kinds_given:
            served = ROUTE_KINDS[Protocol(spec.protocol)]
            kinds = tuple(dict.fromkeys(k for k in spec.allowed.kinds if k in served))
            wrong = [f"{g}/{k}" for g, k in spec.allowed.kinds if (g, k) not in served]
            if wrong:
                problems.append(("InvalidRouteKinds", f"not served: {', '.join(wrong)}"))
        else:
            kinds = ROUTE_KINDS[Protocol(spec.protocol)]
        if not supported:
            accepted = Condition(
                "Accepted", False, "UnsupportedProtocol", f"protocol {spec.protocol} is not served"
            )
        elif mode is not None and spec.tls_mode != mode:
            accepted = Condition(
                "Accepted",
                False,
                "UnsupportedValue",
                f"tls.mode {spec.tls_mode} is not served (protocol {spec.protocol} takes {mode})",
            )
        elif spec.name in conflicts:
            accepted = Condition(
                "Accepted", False, conflicts[spec.name], "conflicts with another listener"
            )
        else:
            accepted = Condition("Accepted", True, "Accepted", "listener accepted")
        conflicted = (
            Condition("Conflicted", True, conflicts[spec.name], _conflict_message(spec, conflicts))
            if spec.name in conflicts
            else Condition("Conflicted", False, "NoConflicts", "no conflicts")
        )
        resolved = (
            Condition("ResolvedRefs", False, problems[0][0], "; ".join(m for _, m in problems))
            if problems
            else Condition("ResolvedRefs", True, "ResolvedRefs", "references resolved")
        )
        out.append(
            ListenerState(
                spec=spec,
                listener=Listener(
                    owner=owner,
                    name=spec.name,
                    port=spec.port,
                    protocol=Protocol(spec.protocol) if supported else Protocol.HTTP,
                    hostname=_hostname(spec),
                    certificates=usable,
                    allowed=spec.allowed,
                    auto_passthrough=spec.auto_passthrough
                    and spec.protocol == Protocol.TLS
                    and spec.tls_mode == "Passthrough",
                ),
                supported_kinds=kinds,
                accepted=accepted,
                conflicted=conflicted,
                resolved=resolved,
            )
        )
    return tuple(out)


def _conflict_message(spec: ListenerSpec, conflicts: Mapping[str, str]) -> str:
    if conflicts[spec.name] == "ProtocolConflict":
        return f"listeners on port {spec.port} use different protocols"
    if spec.protocol == Protocol.TCP:
        return f"another TCP listener on port {spec.port}"
    return f"another listener on port {spec.port} has hostname {spec.hostname}"


def gateway_state(
    gw: GatewayFacts,
    *,
    class_ok: bool,
    certificates: Mapping[tuple[str, str], CertificateFacts],
    grants: list[GrantFacts],
) -> GatewayState:
    states = listener_states(gw, certificates, grants)
    bad = [s.spec.name for s in states if not s.accepted.status]
    if not class_ok:
        accepted = Condition(
            "Accepted", False, "Invalid", f"GatewayClass {gw.class_name} is not accepted"
        )
    elif gw.requested_addresses:
        accepted = Condition(
            "Accepted", False, "UnsupportedAddress", "spec.addresses: meshctl assigns addresses"
        )
    elif gw.infrastructure_parameters:
        accepted = Condition(
            "Accepted", False, "InvalidParameters", "meshctl takes no infrastructure.parametersRef"
        )
    elif bad:
        good = len(bad) < len(states)
        accepted = Condition(
            "Accepted", good, "ListenersNotValid", f"listeners not accepted: {', '.join(bad)}"
        )
    else:
        accepted = Condition("Accepted", True, "Accepted", "gateway accepted")
    return GatewayState(facts=gw, listeners=states, accepted=accepted)


def gateway_status(
    state: GatewayState,
    *,
    attached: Mapping[str, int],
    runtime: GatewayRuntime,
    now: str,
) -> dict[str, Any]:
    """status of the Gateway: conditions, addresses, and per listener its conditions,
    supportedKinds and attachedRoutes."""
    gw = state.facts
    generation = gw.meta.generation
    if not state.accepted.status:
        programmed = Condition("Programmed", False, "Invalid", "gateway not accepted")
    elif not runtime.addresses:
        programmed = Condition("Programmed", False, "AddressNotAssigned", "no address yet")
    elif not runtime.ready:
        programmed = Condition("Programmed", False, "Pending", "the gateway's proxy is not ready")
    else:
        programmed = Condition("Programmed", True, "Programmed", "the gateway's proxy is ready")
    previous = {
        str(entry.get("name")): entry
        for entry in gw.status.get("listeners") or ()
        if isinstance(entry, Mapping)
    }
    listeners = []
    for ls in state.listeners:
        if not state.accepted.status:
            ready = Condition("Programmed", False, "Invalid", "gateway not accepted")
        elif not ls.serves:
            ready = Condition("Programmed", False, "Invalid", "listener serves nothing")
        elif programmed.status:
            ready = Condition("Programmed", True, "Programmed", "listener programmed")
        else:
            ready = Condition("Programmed", False, "Pending", programmed.message)
        listeners.append(
            {
                "name": ls.spec.name,
                "supportedKinds": [{"group": g, "kind": k} for g, k in ls.supported_kinds],
                "attachedRoutes": attached.get(ls.spec.name, 0),
                "conditions": conditions.merge(
                    [ls.accepted, ls.conflicted, ls.resolved, ready],
                    conditions_of(previous.get(ls.spec.name), "conditions"),
                    generation=generation,
                    now=now,
                ),
            }
        )
    return {
        "addresses": [{"type": a.type, "value": a.value} for a in runtime.addresses],
        "conditions": conditions.merge(
            [state.accepted, programmed],
            conditions_of(gw.status, "conditions"),
            generation=generation,
            now=now,
        ),
        "listeners": listeners,
    }
