"""``meshctl verify``'s gateway checks: every Gateway of meshctl's classes Programmed, every
HTTPRoute attached to it, and a live request answered on each listener.

The first two read the status the controller wrote (``meshctl.core.gateway.health``); the third
talks to one ready proxy pod of each Programmed Gateway through the API server's port
forwarding (so it works from a laptop as well as from the node), one request per listener: a
plain ``HEAD /`` for HTTP, a TLS handshake with the listener's hostname as SNI and then the same
request for HTTPS. Any HTTP answer counts (a 404 for a host no route names is the gateway
answering); a refused connection, a failed handshake or silence is the failure. Invariant:
read-only. When the Gateway API is not installed (no CRDs) every check is skipped, saying so.
"""

from __future__ import annotations

import socket
import ssl
import time
from collections.abc import Mapping
from typing import Any

from meshctl.core.gateway import health
from meshctl.core.k8s.install.checks import Check, Result
from meshctl.errors import KubeError
from meshctl.kube.resources import Resource

CATEGORY = "meshctl-gateway"
GATEWAY_CLASSES: Resource[dict[str, object]] = Resource(
    health.GROUP, "v1", "gatewayclasses", "GatewayClass", namespaced=False
)
GATEWAYS: Resource[dict[str, object]] = Resource(health.GROUP, "v1", "gateways", "Gateway")
HTTP_ROUTES: Resource[dict[str, object]] = Resource(health.GROUP, "v1", "httproutes", "HTTPRoute")
# The label Istio and Envoy Gateway put on a Gateway's provisioned pods (and meshctl too).
GATEWAY_NAME_LABEL = "gateway.networking.k8s.io/gateway-name"
LIVE_TIMEOUT = 5.0


def _objects(ctx: Any) -> tuple[list[Any], list[Any], list[Any]] | None:
    """GatewayClasses, Gateways and HTTPRoutes (read once per run); None without the CRDs."""
    from meshctl.kube import objects
    from meshctl.kube.rest import ApiStatusError

    if "gateway-objects" not in ctx.memo:
        try:
            found = tuple(
                objects.list_objects(ctx.kube, kind)[0]
                for kind in (GATEWAY_CLASSES, GATEWAYS, HTTP_ROUTES)
            )
        except ApiStatusError as exc:
            if exc.status != 404:
                raise
            found = None
        ctx.memo["gateway-objects"] = found
    value: tuple[list[Any], list[Any], list[Any]] | None = ctx.memo["gateway-objects"]
    return value


def _findings(ctx: Any) -> health.Findings | None:
    listed = _objects(ctx)
    return None if listed is None else health.findings(*listed)


_NO_API = "the Gateway API is not installed (no gateway.networking.k8s.io CRDs)"


def _programmed(ctx: Any) -> Result:
    found = _findings(ctx)
    if found is None:
        return Result.skip(_NO_API)
    if not found.gateways:
        return Result.skip("no Gateway of meshctl's classes")
    if found.unprogrammed:
        return Result.fail(
            f"{len(found.unprogrammed)} of {len(found.gateways)} Gateway(s) not Programmed",
            hint="kubectl describe gateway NAME -n NS shows the controller's conditions; "
            "'meshctl gateway routes' shows what the proxy serves",
            details=found.unprogrammed,
        )
    return Result.ok(f"{len(found.gateways)} Gateway(s) Accepted and Programmed")


def _attached(ctx: Any) -> Result:
    found = _findings(ctx)
    if found is None:
        return Result.skip(_NO_API)
    if not found.routes:
        return Result.skip("no HTTPRoute names a Gateway of meshctl's classes")
    if found.unattached:
        return Result.fail(
            f"{len(found.unattached)} HTTPRoute parent reference(s) not attached",
            hint="the reason is the route's status.parents[] condition: fix the parentRef, the "
            "listener's allowedRoutes or hostname, or the backendRef (a ReferenceGrant for "
            "another namespace)",
            details=found.unattached,
        )
    return Result.ok(f"{found.routes} HTTPRoute(s) attached to their Gateways")


def _listeners(gateway: Mapping[str, Any]) -> list[tuple[str, int, str, str]]:
    """(name, port, protocol, hostname) of each HTTP/HTTPS listener."""
    spec = gateway.get("spec")
    out: list[tuple[str, int, str, str]] = []
    if not isinstance(spec, Mapping):
        return out
    for item in spec.get("listeners") or ():
        if not isinstance(item, Mapping):
            continue
        protocol = str(item.get("protocol", ""))
        port = item.get("port")
        if protocol in ("HTTP", "HTTPS") and isinstance(port, int):
            out.append((str(item.get("name", "")), port, protocol, str(item.get("hostname") or "")))
    return out


def probe_request(host: str) -> bytes:
    return f"HEAD / HTTP/1.1\r\nHost: {host}\r\nConnection: close\r\n\r\n".encode()


def answered(data: bytes) -> str:
    """The status line of an HTTP answer ("" when ``data`` is not one)."""
    line = data.split(b"\r\n", 1)[0].decode("latin-1", "replace")
    return line if line.startswith("HTTP/1.") and len(line.split()) >= 2 else ""


def _exchange(sock: socket.socket, protocol: str, hostname: str) -> str:
    """One request on the forwarded stream; the status line (raises OSError/ssl.SSLError)."""
    sock.settimeout(LIVE_TIMEOUT)
    host = hostname.replace("*", "verify") or "verify.meshctl.invalid"
    stream: socket.socket = sock
    if protocol == "HTTPS":
        context = ssl.create_default_context()
        # The listener's certificate is the user's; verify checks that it is served, not who
        # signed it (the handshake itself fails when no certificate is usable).
        context.check_hostname = False
        context.verify_mode = ssl.CERT_NONE
        stream = context.wrap_socket(sock, server_hostname=host)
    stream.sendall(probe_request(host))
    data = b""
    deadline = time.monotonic() + LIVE_TIMEOUT
    while b"\r\n" not in data and time.monotonic() < deadline:
        chunk = stream.recv(4096)
        if not chunk:
            break
        data += chunk
    return answered(data)


def _live_one(ctx: Any, pod: str, namespace: str, listener: tuple[str, int, str, str]) -> str:
    """ "" when the listener answered; else what happened."""
    from meshctl.kube import portforward

    name, port, protocol, hostname = listener
    try:
        with portforward.stream(ctx.kube, namespace, pod, port) as sock:
            status = _exchange(sock, protocol, hostname)
    except KubeError as exc:
        return f"listener {name} ({protocol} {port}): {exc}"
    except (OSError, ssl.SSLError) as exc:
        return f"listener {name} ({protocol} {port}) on {pod}: {exc}"
    return "" if status else f"listener {name} ({protocol} {port}) on {pod}: no HTTP answer"


def _live(ctx: Any) -> Result:
    from meshctl.kube import objects
    from meshctl.kube.resources import PODS

    listed, found = _objects(ctx), _findings(ctx)
    if listed is None or found is None:
        return Result.skip(_NO_API)
    broken = {line.split(":", 1)[0] for line in found.unprogrammed}
    problems, tried = [], 0
    for gateway in listed[1]:
        meta = gateway.get("metadata") or {}
        key = f"{meta.get('namespace')}/{meta.get('name')}"
        if key not in found.gateways or key in broken:
            continue
        try:
            pods, _ = objects.list_objects(
                ctx.kube,
                PODS,
                str(meta.get("namespace")),
                label_selector=f"{GATEWAY_NAME_LABEL}={meta.get('name')}",
            )
        except KubeError as exc:
            problems.append(f"{key}: {exc}")
            continue
        ready = [p for p in pods if _ready(p)]
        if not ready:
            problems.append(f"{key}: no ready proxy pod (label {GATEWAY_NAME_LABEL})")
            continue
        pod = str((ready[0].get("metadata") or {}).get("name"))
        for listener in _listeners(gateway):
            tried += 1
            why = _live_one(ctx, pod, str(meta.get("namespace")), listener)
            if why:
                problems.append(f"{key}: {why}")
    if problems:
        return Result.fail(
            f"{len(problems)} listener(s) did not answer",
            hint="'kubectl logs' of the Gateway's proxy pod says why (its access log names each "
            "request); a TLS failure means no usable certificate for that listener",
            details=problems,
        )
    if not tried:
        return Result.skip("no Programmed Gateway with an HTTP or HTTPS listener")
    return Result.ok(f"{tried} listener(s) answered a request")


def _ready(pod: Mapping[str, Any]) -> bool:
    status = pod.get("status")
    if not isinstance(status, Mapping):
        return False
    return any(
        c.get("type") == "Ready" and c.get("status") == "True"
        for c in status.get("conditions") or ()
        if isinstance(c, Mapping)
    )


checks = (
    Check(
        category=CATEGORY,
        description="every Gateway of meshctl's classes is Programmed",
        run=_programmed,
    ),
    Check(
        category=CATEGORY,
        description="every HTTPRoute is attached to its Gateways",
        run=_attached,
    ),
    Check(
        category=CATEGORY,
        description="each Gateway listener answers a request",
        run=_live,
    ),
)
