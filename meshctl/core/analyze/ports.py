"""Service ports the mesh cannot classify (MSH0501, MSH0502), by Istio's protocol selection:
``appProtocol`` when set (it wins), else the port's name as ``<protocol>`` or
``<protocol>-<suffix>``, the protocol one of grpc, grpc-web, http, http2, https, mongo, mysql,
redis, tcp, tls, udp (any case); ``appProtocol`` also takes Kubernetes' ``kubernetes.io/h2c``,
``kubernetes.io/ws`` and ``kubernetes.io/wss``. UDP ports (``protocol: UDP``) are not proxied
and not checked; neither are the system namespaces, ExternalName Services (no ports proxied),
nor the mesh's own Services (labelled ``app.kubernetes.io/part-of=meshctl``: their ports are
Istio's, such as the gateway's ``status-port``, and the user cannot rename them).
"""

from __future__ import annotations

from collections.abc import Iterator

from meshctl.core.k8s.inject.pipeline import IGNORED_NAMESPACES

from . import codes
from .findings import Finding
from .installation import MESHCTL, PART_OF_LABEL
from .snapshot import Snapshot, field, mapping, sequence

PROTOCOLS = frozenset(
    {"grpc", "grpc-web", "http", "http2", "https", "mongo", "mysql", "redis", "tcp", "tls", "udp"}
)
APP_PROTOCOLS = PROTOCOLS | {"kubernetes.io/h2c", "kubernetes.io/ws", "kubernetes.io/wss"}


def protocol_of_name(name: str) -> str | None:
    """The protocol a port name declares, or None. ``grpc-web`` before ``grpc-<suffix>``."""
    lower = name.lower()
    if lower in PROTOCOLS:
        return lower
    if lower.startswith("grpc-web-"):
        return "grpc-web"
    prefix = lower.split("-", 1)[0]
    return prefix if prefix in PROTOCOLS and "-" in lower else None


def check(snapshot: Snapshot) -> Iterator[Finding]:
    for service in snapshot.of_kind("Service"):
        if service.namespace in IGNORED_NAMESPACES:
            continue
        if field(service.obj, "spec", "type") == "ExternalName":
            continue
        if service.labels.get(PART_OF_LABEL) == MESHCTL:
            continue
        for entry in sequence(field(service.obj, "spec", "ports")):
            port = mapping(entry)
            if str(port.get("protocol") or "TCP").upper() != "TCP":
                continue
            number = port.get("port", "?")
            name = str(port.get("name") or "")
            app = str(port.get("appProtocol") or "")
            label = f"{name} ({number})" if name else str(number)
            if app:
                if app.lower() in APP_PROTOCOLS:
                    continue
                yield Finding(
                    codes.SERVICE_PORT_UNKNOWN_PROTOCOL,
                    service.subject,
                    f"Port {label} has appProtocol {app!r}, which names no protocol the mesh "
                    "knows: its traffic is treated as opaque TCP",
                    f"set appProtocol to one of {', '.join(sorted(PROTOCOLS))}",
                    (service.namespace,),
                )
            elif not name:
                yield Finding(
                    codes.SERVICE_PORT_UNNAMED,
                    service.subject,
                    f"Port {number} has no name and no appProtocol: its traffic is treated as "
                    "opaque TCP (no HTTP routing, retries or request metrics)",
                    f"name it <protocol>[-<suffix>] (e.g. http-web) or set appProtocol "
                    f"(kubectl edit service {service.name} -n {service.namespace})",
                    (service.namespace,),
                )
            elif protocol_of_name(name) is None:
                yield Finding(
                    codes.SERVICE_PORT_UNKNOWN_PROTOCOL,
                    service.subject,
                    f"Port {label}: the name does not start with a protocol the mesh knows, so "
                    "its traffic is treated as opaque TCP",
                    f"rename it <protocol>[-<suffix>] (e.g. http-{name}) or set appProtocol; "
                    f"protocols: {', '.join(sorted(PROTOCOLS))}",
                    (service.namespace,),
                )
