"""The pod annotations and labels the injector reads or writes, and their value validators.

Owns: the names (Istio's, so Istio's docs describe meshctl's behaviour) and one pure validator per
kind of value (lists through the capture engine's own parsers, so the two agree by construction).
Invariant: a validator returns the value in canonical form or raises ``InvalidAnnotationError``
with the message ``invalid value '<v>' for annotation '<k>'``; an absent annotation is no error.
"""

from __future__ import annotations

import functools
import re
from decimal import Decimal

# The capture engine's own parsers: what an annotation passes here, `meshctl iptables apply`
# accepts in the init container (or the CNI plugin) later.
from meshctl.core.capture import settings as capture
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.structured import InputError, load_json

# --- read: what the user asks for ---------------------------------------------------------------
INJECT = "sidecar.istio.io/inject"  # label (wins) or annotation: "true" | "false"
INTERCEPTION_MODE = "sidecar.istio.io/interceptionMode"
INCLUDE_OUTBOUND_IP_RANGES = "traffic.sidecar.istio.io/includeOutboundIPRanges"
EXCLUDE_OUTBOUND_IP_RANGES = "traffic.sidecar.istio.io/excludeOutboundIPRanges"
INCLUDE_INBOUND_PORTS = "traffic.sidecar.istio.io/includeInboundPorts"
EXCLUDE_INBOUND_PORTS = "traffic.sidecar.istio.io/excludeInboundPorts"
INCLUDE_OUTBOUND_PORTS = "traffic.sidecar.istio.io/includeOutboundPorts"
EXCLUDE_OUTBOUND_PORTS = "traffic.sidecar.istio.io/excludeOutboundPorts"
EXCLUDE_INTERFACES = "traffic.sidecar.istio.io/excludeInterfaces"
KUBEVIRT_INTERFACES = "traffic.sidecar.istio.io/kubevirtInterfaces"
REROUTE_VIRTUAL_INTERFACES = "istio.io/reroute-virtual-interfaces"  # newer spelling, wins
PROXY_CPU = "sidecar.istio.io/proxyCPU"
PROXY_MEMORY = "sidecar.istio.io/proxyMemory"
PROXY_CPU_LIMIT = "sidecar.istio.io/proxyCPULimit"
PROXY_MEMORY_LIMIT = "sidecar.istio.io/proxyMemoryLimit"
PROXY_IMAGE = "sidecar.istio.io/proxyImage"
NATIVE_SIDECAR = "sidecar.istio.io/nativeSidecar"
REWRITE_PROBES = "sidecar.istio.io/rewriteAppHTTPProbers"
USER_VOLUME = "sidecar.istio.io/userVolume"  # JSON: name -> volume source
USER_VOLUME_MOUNT = "sidecar.istio.io/userVolumeMount"  # JSON: volume name -> mount
STATUS_PORT = "status.sidecar.istio.io/port"
TEMPLATES = "inject.istio.io/templates"  # "sidecar" (default) or "gateway"
READINESS_INITIAL_DELAY = "readiness.status.sidecar.istio.io/initialDelaySeconds"
READINESS_PERIOD = "readiness.status.sidecar.istio.io/periodSeconds"
READINESS_FAILURE_THRESHOLD = "readiness.status.sidecar.istio.io/failureThreshold"

# Istio's annotation families: a key under one of these that meshctl does not read is reported
# (a warning), never ignored silently.
ISTIO_PREFIXES = (
    "sidecar.istio.io/",
    "proxy.istio.io/",
    "traffic.sidecar.istio.io/",
    "status.sidecar.istio.io/",
    "readiness.status.sidecar.istio.io/",
    "inject.istio.io/",
    "prometheus.istio.io/",
)

# --- written: what injection leaves on the pod ----------------------------------------------------
STATUS = "sidecar.istio.io/status"  # Istio's JSON shape; marks a pod as injected
UNDO = "inject.meshctl.io/undo"  # meshctl's own: what to restore on uninject (see undo.py)
DEFAULT_CONTAINER = "kubectl.kubernetes.io/default-container"
DEFAULT_LOGS_CONTAINER = "kubectl.kubernetes.io/default-logs-container"
TLS_MODE_LABEL = "security.istio.io/tlsMode"
CANONICAL_NAME_LABEL = "service.istio.io/canonical-name"
CANONICAL_REVISION_LABEL = "service.istio.io/canonical-revision"
REVISION_LABEL = "istio.io/rev"
NETWORK_LABEL = "topology.istio.io/network"
WORKLOAD_NAME_LABEL = "service.istio.io/workload-name"

INTERCEPTION_MODES = ("REDIRECT", "TPROXY", "NONE")

READ = frozenset(
    {
        INJECT,
        INTERCEPTION_MODE,
        INCLUDE_OUTBOUND_IP_RANGES,
        EXCLUDE_OUTBOUND_IP_RANGES,
        INCLUDE_INBOUND_PORTS,
        EXCLUDE_INBOUND_PORTS,
        INCLUDE_OUTBOUND_PORTS,
        EXCLUDE_OUTBOUND_PORTS,
        EXCLUDE_INTERFACES,
        KUBEVIRT_INTERFACES,
        PROXY_CPU,
        PROXY_MEMORY,
        PROXY_CPU_LIMIT,
        PROXY_MEMORY_LIMIT,
        PROXY_IMAGE,
        NATIVE_SIDECAR,
        REWRITE_PROBES,
        READINESS_INITIAL_DELAY,
        READINESS_PERIOD,
        READINESS_FAILURE_THRESHOLD,
        "prometheus.istio.io/merge-metrics",
        USER_VOLUME,
        USER_VOLUME_MOUNT,
        STATUS_PORT,
        "proxy.istio.io/config",
        TEMPLATES,
    }
)
WRITTEN = frozenset({"sidecar.istio.io/status", "proxy.istio.io/overrides"})


def unsupported(annotations: dict[str, str]) -> list[str]:
    """One warning per Istio annotation on the pod that meshctl does not act on."""
    return [
        f"annotation {key!r} is not supported by meshctl and has no effect"
        for key in annotations
        if key.startswith(ISTIO_PREFIXES) and key not in READ and key not in WRITTEN
    ]


_TRUE = frozenset({"true", "yes", "y", "on", "1"})
_FALSE = frozenset({"false", "no", "n", "off", "0"})
# A Kubernetes resource quantity (k8s.io/apimachinery resource.Quantity's grammar, no spaces).
_QUANTITY = re.compile(r"^[+]?(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[numkMGTPE]|[KMGTPE]i)?$")
_IMAGE = re.compile(r"^\S+$")
_SUFFIX = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
    "Ki": Decimal(2**10),
    "Mi": Decimal(2**20),
    "Gi": Decimal(2**30),
    "Ti": Decimal(2**40),
    "Pi": Decimal(2**50),
    "Ei": Decimal(2**60),
}
_LONGEST_SUFFIX_FIRST = tuple(sorted(_SUFFIX, key=len, reverse=True))  # "Mi" before "M"


def parse_bool(key: str, value: str) -> bool:
    """``true``/``false`` (and yes/no, on/off, 1/0, any case)."""
    text = value.strip().lower()
    if text in _TRUE:
        return True
    if text in _FALSE:
        return False
    raise InvalidAnnotationError(key, value, expected='"true" or "false"')


def parse_ports(key: str, value: str, *, wildcard: bool = False) -> str:
    """A comma-separated list of ports 1-65535 (or ``*`` when ``wildcard``), canonical form."""
    expected = "a comma-separated list of ports 1-65535" + (" or '*'" if wildcard else "")
    try:
        ports = (capture.parse_port_selection if wildcard else capture.parse_ports)(value)
    except ValueError:
        raise InvalidAnnotationError(key, value, expected=expected) from None
    return ports if isinstance(ports, str) else ",".join(map(str, ports))


def parse_cidrs(key: str, value: str, *, wildcard: bool = False) -> str:
    """A comma-separated list of CIDRs (or ``*`` when ``wildcard``), canonical form.

    A bare address means that one host (/32 or /128), as the capture engine reads it.
    """
    expected = "a comma-separated list of CIDRs such as 10.0.0.0/8" + (
        " or '*'" if wildcard else ""
    )
    try:
        cidrs = (capture.parse_cidr_selection if wildcard else capture.parse_cidrs)(value)
    except ValueError:
        raise InvalidAnnotationError(key, value, expected=expected) from None
    return cidrs if isinstance(cidrs, str) else ",".join(map(str, cidrs))


def parse_interfaces(key: str, value: str) -> str:
    """A comma-separated list of network interface names."""
    try:
        names = capture.parse_interfaces(value)
    except ValueError:
        raise InvalidAnnotationError(
            key, value, expected="a comma-separated list of interface names (1-15 characters)"
        ) from None
    return ",".join(names)


def parse_mode(key: str, value: str) -> str:
    """The interception mode: REDIRECT, TPROXY or NONE."""
    if value not in INTERCEPTION_MODES:
        raise InvalidAnnotationError(key, value, expected="one of " + ", ".join(INTERCEPTION_MODES))
    return value


def parse_quantity(key: str, value: str) -> str:
    """A Kubernetes resource quantity such as ``100m``, ``0.5`` or ``128Mi``."""
    if not _QUANTITY.match(value):
        raise InvalidAnnotationError(
            key, value, expected="a Kubernetes quantity such as 100m, 0.5, 128Mi or 1G"
        )
    return value


def parse_port(key: str, value: str) -> int:
    """A port number 1-65535, or 0 (the feature behind it turned off)."""
    text = value.strip()
    if not text.isdigit() or int(text) > 65535:
        raise InvalidAnnotationError(key, value, expected="a port number 1-65535, or 0 for none")
    return int(text)


def parse_seconds(key: str, value: str, *, minimum: int) -> int:
    """A whole number of seconds (or a count) no smaller than ``minimum``."""
    text = value.strip()
    if not text.isdigit() or int(text) < minimum or int(text) > 2**31 - 1:
        raise InvalidAnnotationError(key, value, expected=f"a whole number >= {minimum}")
    return int(text)


def parse_image(key: str, value: str) -> str:
    """A container image reference (no whitespace)."""
    if not _IMAGE.match(value):
        raise InvalidAnnotationError(key, value, expected="a container image reference")
    return value


def parse_json_objects(key: str, value: str, *, what: str) -> dict[str, dict[str, object]]:
    """A JSON object of name -> object (``userVolume``, ``userVolumeMount``)."""
    try:
        data = load_json(value, key)
    except InputError:
        data = None
    if not isinstance(data, dict) or not all(
        isinstance(k, str) and k and isinstance(v, dict) for k, v in data.items()
    ):
        raise InvalidAnnotationError(key, value, expected=f"a JSON object of name -> {what}")
    return data


def json_object(text: str) -> dict[str, object] | None:
    """An annotation's value read as a JSON object (what injection wrote), or None."""
    try:
        data = load_json(text, "annotation")
    except InputError:
        return None
    return data if isinstance(data, dict) else None


@functools.lru_cache(maxsize=256)  # a few quantities, read for every pod of a long manifest
def quantity(text: str) -> Decimal:
    """A Kubernetes quantity as a number (``100m`` -> 0.1, ``1Ki`` -> 1024)."""
    for suffix in _LONGEST_SUFFIX_FIRST:
        if text.endswith(suffix):
            return Decimal(text[: -len(suffix)]) * _SUFFIX[suffix]
    return Decimal(text)
