"""Traffic interception as a pod asks for it: annotations -> ``meshctl iptables apply`` arguments.

Owns the one mapping from the ``traffic.sidecar.istio.io/*`` annotations (and
``sidecar.istio.io/interceptionMode``) to capture settings, used by the injected init container
and, in CNI mode, by the CNI plugin reading the same annotations off the pod. Invariants: pure;
the proxy's own ports 15090, 15021 and 15020 are always excluded from inbound capture; the
annotations written for CNI mode map back to the same arguments (a fixed point), so reading them
again never changes the rules.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from meshctl.core.k8s.inject import annotations as ann

# Istio's port numbers (docs/architecture.md "Ports").
OUTBOUND_CAPTURE_PORT = 15001
INBOUND_CAPTURE_PORT = 15006
HBONE_PORT = 15008
STATUS_PORT = 15020  # metrics and the app-probe rewrite target
READINESS_PORT = 15021
PROMETHEUS_PORT = 15090  # Istio's Envoy metrics port; excluded so Istio's scrapers keep working
PROXY_UID = 1337

# Never captured inbound: kubelet and Prometheus must reach the proxy itself (the status port
# is the pod's status.sidecar.istio.io/port when set; 0 means none).
ALWAYS_EXCLUDED_INBOUND_PORTS = (PROMETHEUS_PORT, READINESS_PORT, STATUS_PORT)


def status_port(annotations: Mapping[str, str]) -> int:
    """The proxy's status port (probes, merged metrics): the annotation's, else 15020."""
    value = annotations.get(ann.STATUS_PORT)
    return STATUS_PORT if value is None else ann.parse_port(ann.STATUS_PORT, str(value))


@dataclass(frozen=True, slots=True, kw_only=True)
class Interception:
    """Validated, canonical capture settings of one pod ("" = none, "*" = all)."""

    mode: str = "REDIRECT"
    include_outbound_ip_ranges: str = "*"
    exclude_outbound_ip_ranges: str = ""
    include_inbound_ports: str = "*"
    exclude_inbound_ports: str = ",".join(map(str, ALWAYS_EXCLUDED_INBOUND_PORTS))
    include_outbound_ports: str = ""
    exclude_outbound_ports: str = ""
    exclude_interfaces: str = ""
    kubevirt_interfaces: str = ""
    status_port: int = STATUS_PORT  # 0: none (not excluded)


def interception_of(annotations: Mapping[str, str]) -> Interception:
    """The pod's capture settings from its annotations; Istio's defaults where absent.

    Raises ``InvalidAnnotationError`` for a value that cannot be used.
    """

    def get(key: str) -> str | None:
        value = annotations.get(key)
        return None if value is None else str(value)

    values: dict[str, str] = {}
    if (mode := get(ann.INTERCEPTION_MODE)) is not None:
        values["mode"] = ann.parse_mode(ann.INTERCEPTION_MODE, mode)
    if (v := get(ann.INCLUDE_OUTBOUND_IP_RANGES)) is not None:
        values["include_outbound_ip_ranges"] = ann.parse_cidrs(
            ann.INCLUDE_OUTBOUND_IP_RANGES, v, wildcard=True
        )
    if (v := get(ann.EXCLUDE_OUTBOUND_IP_RANGES)) is not None:
        values["exclude_outbound_ip_ranges"] = ann.parse_cidrs(ann.EXCLUDE_OUTBOUND_IP_RANGES, v)
    if (v := get(ann.INCLUDE_INBOUND_PORTS)) is not None:
        values["include_inbound_ports"] = ann.parse_ports(
            ann.INCLUDE_INBOUND_PORTS, v, wildcard=True
        )
    port = status_port(annotations)
    excluded = [str(PROMETHEUS_PORT), str(READINESS_PORT), *([str(port)] if port else [])]
    if (v := get(ann.EXCLUDE_INBOUND_PORTS)) is not None:
        parsed = ann.parse_ports(ann.EXCLUDE_INBOUND_PORTS, v)
        excluded += [p for p in parsed.split(",") if p and p not in excluded]
    values["exclude_inbound_ports"] = ",".join(excluded)
    if (v := get(ann.INCLUDE_OUTBOUND_PORTS)) is not None:
        values["include_outbound_ports"] = ann.parse_ports(ann.INCLUDE_OUTBOUND_PORTS, v)
    if (v := get(ann.EXCLUDE_OUTBOUND_PORTS)) is not None:
        values["exclude_outbound_ports"] = ann.parse_ports(ann.EXCLUDE_OUTBOUND_PORTS, v)
    if (v := get(ann.EXCLUDE_INTERFACES)) is not None:
        values["exclude_interfaces"] = ann.parse_interfaces(ann.EXCLUDE_INTERFACES, v)
    # The newer annotation wins over the older one when both are set (Istio's rule).
    virt_key = ann.REROUTE_VIRTUAL_INTERFACES
    virt = get(virt_key)
    if virt is None:
        virt_key, virt = ann.KUBEVIRT_INTERFACES, get(ann.KUBEVIRT_INTERFACES)
    if virt is not None:
        values["kubevirt_interfaces"] = ann.parse_interfaces(virt_key, virt)
    return Interception(**values, status_port=port)


def iptables_args(
    interception: Interception, *, proxy_uid: int = PROXY_UID, proxy_gid: int | None = None
) -> list[str]:
    """The flags for ``meshctl iptables apply`` (Istio's short spellings), or [] for mode NONE."""
    if interception.mode == "NONE":
        return []
    args = [
        "-p",
        str(OUTBOUND_CAPTURE_PORT),
        "-z",
        str(INBOUND_CAPTURE_PORT),
        "-u",
        str(proxy_uid),
        "-g",
        str(proxy_uid if proxy_gid is None else proxy_gid),
        "-m",
        interception.mode,
    ]
    # Empty lists are left out rather than passed as "": the capture engine's default for every
    # one of these is "none", so the rules are the same and the command line stays readable.
    optional = (
        ("-i", interception.include_outbound_ip_ranges),
        ("-x", interception.exclude_outbound_ip_ranges),
        ("-b", interception.include_inbound_ports),
        ("-d", interception.exclude_inbound_ports),
        ("-q", interception.include_outbound_ports),
        ("-o", interception.exclude_outbound_ports),
        ("-k", interception.kubevirt_interfaces),
        ("-c", interception.exclude_interfaces),
    )
    for flag, value in optional:
        if value:
            args += [flag, value]
    return args


def capture_args(
    annotations: Mapping[str, str], *, proxy_uid: int = PROXY_UID, proxy_gid: int | None = None
) -> list[str]:
    """``meshctl iptables apply`` flags for a pod with these annotations ([] = no capture).

    The public entry for the init container and the CNI plugin: validates, then maps.
    """
    return iptables_args(interception_of(annotations), proxy_uid=proxy_uid, proxy_gid=proxy_gid)


def cni_annotations(interception: Interception) -> dict[str, str]:
    """The annotations a CNI-mode pod carries so the CNI plugin applies the same rules.

    ``interception_of`` of the result is ``interception`` again (with the pod's status port
    annotation, which stays on the pod). The two settings whose default is "*" are always
    written (an empty value means "capture none" there); the rest only when set.
    """
    # As Istio writes it: the user's ports, then the status port; the other ports of the proxy
    # are excluded by the plugin whatever the annotation says (interception_of adds them back).
    own = {str(PROMETHEUS_PORT), str(READINESS_PORT), str(interception.status_port)}
    excluded = [p for p in interception.exclude_inbound_ports.split(",") if p and p not in own]
    if interception.status_port:
        excluded.append(str(interception.status_port))
    pairs = (
        (ann.INTERCEPTION_MODE, interception.mode, True),
        (ann.INCLUDE_INBOUND_PORTS, interception.include_inbound_ports, True),
        (ann.EXCLUDE_INBOUND_PORTS, ",".join(excluded), True),
        (ann.INCLUDE_OUTBOUND_IP_RANGES, interception.include_outbound_ip_ranges, True),
        (ann.EXCLUDE_OUTBOUND_IP_RANGES, interception.exclude_outbound_ip_ranges, False),
        (ann.INCLUDE_OUTBOUND_PORTS, interception.include_outbound_ports, False),
        (ann.EXCLUDE_OUTBOUND_PORTS, interception.exclude_outbound_ports, False),
        (ann.EXCLUDE_INTERFACES, interception.exclude_interfaces, False),
        (ann.KUBEVIRT_INTERFACES, interception.kubevirt_interfaces, False),
    )
    return {key: value for key, value, always in pairs if value or always}
