"""App probes the proxy runs for the kubelet: the ``ISTIO_KUBE_APP_PROBERS`` contract, as data.

Owns reading the JSON the injector writes into the proxy's env (Istio's name and shape:
``{"/app-health/<container>/<kind>": {"httpGet"|"tcpSocket"|"grpc": {...}, "timeoutSeconds": n}}``)
into validated, frozen probers, and the rule that turns an outcome into the answer the kubelet
gets. Invariants: pure; every prober has exactly one action with a numeric port 1-65535 (the
injector resolves named ports) and a path of Istio's form; a bad document is one ``ValueError``
naming the path and the field, so the proxy refuses to start rather than fail every probe.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from meshctl.structured import InputError, load_json

PROBERS_ENV = "ISTIO_KUBE_APP_PROBERS"
# Istio's agent accepts exactly these paths (pilot-agent's status server, appProberPattern).
PATH = re.compile(
    r"^/(app-health|app-lifecycle)/[^/]+/(livez|readyz|startupz|prestopz|poststartz)$"
)
PREFIXES = ("/app-health/", "/app-lifecycle/")
DEFAULT_TIMEOUT_SECONDS = 1  # Kubernetes' default timeoutSeconds for a probe
HEALTHY, UNHEALTHY, NOT_FOUND = 200, 503, 404
GRPC_HEALTH_PATH = "/grpc.health.v1.Health/Check"


@dataclass(frozen=True, slots=True, kw_only=True)
class HttpGet:
    """An HTTP GET as the kubelet sends it (Kubernetes ``HTTPGetAction``)."""

    port: int
    path: str = "/"
    scheme: str = "HTTP"  # or HTTPS (certificate not verified, as the kubelet does)
    host: str = ""  # "" = the pod's own address
    headers: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class TcpSocket:
    """A TCP connect (Kubernetes ``TCPSocketAction``)."""

    port: int
    host: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Grpc:
    """A ``grpc.health.v1.Health/Check`` call (Kubernetes ``GRPCAction``)."""

    port: int
    service: str = ""


Action = HttpGet | TcpSocket | Grpc


class ProberError(ValueError):
    """A prober document the proxy cannot run (the message names the path and the field)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class Prober:
    """One probe the kubelet asks for at ``path``, with its own timeout."""

    path: str
    action: Action
    timeout: float = DEFAULT_TIMEOUT_SECONDS


def parse_probers(text: str) -> dict[str, Prober]:
    """The probers in ``text`` (the env var's value; "" = none), by path.

    Raises ``ProberError`` (a ``ValueError``) with a one-line reason for anything the proxy
    could not run.
    """
    if not text.strip():
        return {}
    try:
        data = load_json(text, PROBERS_ENV)
    except InputError as exc:
        raise ProberError(f"{PROBERS_ENV} is not JSON: {exc.problem}") from None
    if not isinstance(data, dict):
        raise ProberError(f"{PROBERS_ENV} must be a JSON object of path -> prober")
    return {path: _prober(path, value) for path, value in data.items()}


def _prober(path: str, value: Any) -> Prober:
    where = f"{PROBERS_ENV} {path!r}"
    if not PATH.match(path):
        raise ProberError(f"{where}: the path must be /app-health|app-lifecycle/<container>/<kind>")
    if not isinstance(value, dict):
        raise ProberError(f"{where}: a prober is a JSON object")
    kinds = [k for k in ("httpGet", "tcpSocket", "grpc") if value.get(k) is not None]
    if len(kinds) != 1:
        raise ProberError(f"{where}: needs exactly one of httpGet, tcpSocket or grpc")
    # 0 or absent: the default (the injector omits a zero, as Istio's omitempty does).
    timeout = value.get("timeoutSeconds") or DEFAULT_TIMEOUT_SECONDS
    if not isinstance(timeout, int) or isinstance(timeout, bool) or timeout < 1:
        raise ProberError(f"{where}: timeoutSeconds must be a whole number >= 1")
    raw = value[kinds[0]]
    if not isinstance(raw, dict):
        raise ProberError(f"{where}: {kinds[0]} is not an object")
    port = _port(where, kinds[0], raw.get("port"))
    action: Action
    if kinds[0] == "httpGet":
        action = HttpGet(
            port=port,
            path=_text(where, "path", raw.get("path", "/")) or "/",
            scheme=_scheme(where, raw.get("scheme", "HTTP")),
            host=_text(where, "host", raw.get("host", "")),
            headers=_headers(where, raw.get("httpHeaders")),
        )
    elif kinds[0] == "tcpSocket":
        action = TcpSocket(port=port, host=_text(where, "host", raw.get("host", "")))
    else:
        action = Grpc(port=port, service=_text(where, "service", raw.get("service", "")))
    return Prober(path=path, action=action, timeout=float(timeout))


def _port(where: str, kind: str, value: Any) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or not 0 < value < 65536:
        raise ProberError(
            f"{where}: {kind}.port must be a port number 1-65535, not {value!r} "
            "(the injector resolves named ports)"
        )
    return int(value)


def _text(where: str, name: str, value: Any) -> str:
    if value is None:
        return ""
    if not isinstance(value, str):
        raise ProberError(f"{where}: {name} must be a string")
    return value


def _scheme(where: str, value: Any) -> str:
    scheme = _text(where, "scheme", value).upper() or "HTTP"
    if scheme not in ("HTTP", "HTTPS"):
        raise ProberError(f"{where}: scheme must be HTTP or HTTPS, not {value!r}")
    return scheme


def _headers(where: str, value: Any) -> tuple[tuple[str, str], ...]:
    if value is None:
        return ()
    if not isinstance(value, list):
        raise ProberError(f"{where}: httpHeaders must be a list of {{name, value}}")
    out = []
    for item in value:
        if not isinstance(item, dict) or not isinstance(item.get("name"), str) or not item["name"]:
            raise ProberError(f"{where}: every httpHeaders entry needs a name")
        header = _text(where, "httpHeaders value", item.get("value", ""))
        if any(c in item["name"] + header for c in "\r\n\0"):
            raise ProberError(f"{where}: header {item['name']!r} holds a line break")
        out.append((item["name"], header))
    return tuple(out)


def parse_scrape(text: str) -> tuple[int, str] | None:
    """The app's metrics endpoint the proxy merges into its ``/stats/prometheus``: (port, path)
    from ``ISTIO_PROMETHEUS_ANNOTATIONS`` (the injector's move of the pod's ``prometheus.io/*``
    annotations), or None when the app has none to merge."""
    if not text.strip():
        return None
    try:
        config = load_json(text, "ISTIO_PROMETHEUS_ANNOTATIONS")
    except InputError:
        config = None
    if not isinstance(config, dict) or not all(isinstance(v, str) for v in config.values()):
        raise ProberError("ISTIO_PROMETHEUS_ANNOTATIONS must be a JSON object of strings")
    port, path = config.get("port", ""), config.get("path", "") or "/metrics"
    if config.get("scrape", "").lower() == "false" or not port:
        return None
    if not port.isdigit() or not 0 < int(port) < 65536:
        raise ProberError(f"ISTIO_PROMETHEUS_ANNOTATIONS: port {port!r} is not a port number")
    return int(port), path if path.startswith("/") else "/" + path


def http_healthy(status: int) -> bool:
    """The kubelet's rule: any status from 200 to 399 is a success."""
    return 200 <= status < 400


def is_probe_path(path: str) -> bool:
    """Whether ``path`` belongs to the app-probe endpoint (else another route's)."""
    return path.startswith(PREFIXES)
