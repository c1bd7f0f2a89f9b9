"""The sockets the supervisor binds and the data plane inherits (Istio's port numbers).

Owns binding: proxy ports on all addresses (IPv4, and IPv6 with V6ONLY when the namespace has
it), the admin port on loopback only. Invariant: a port already in use is a ``UserError`` naming
the port and its role, before any child starts.
"""

from __future__ import annotations

import socket

from meshctl.errors import ConfigError, MeshctlError, PortInUseError
from meshctl.net.sockets import IP_TRANSPARENT, IPV6_TRANSPARENT, SOL_IPV6, listener

from .settings import ZtunnelSettings

_BACKLOG = 4096


def bind_all(settings: ZtunnelSettings, *, proxy: bool = True) -> dict[str, socket.socket]:
    """role -> listening socket; IPv6 twins are named ``<role>6``. Without ``proxy`` (node
    mode: the proxy ports live in each pod's netns) only metrics, readiness and admin."""
    wanted = dict(pod_ports(settings)) if proxy else {}
    wanted["metrics"] = settings.metrics_port
    wanted["readiness"] = settings.readiness_port
    out: dict[str, socket.socket] = {}
    try:
        for role, port in wanted.items():
            out[role] = _listen("0.0.0.0", port, role)  # noqa: S104 (the pod's ports)
            if socket.has_ipv6:
                six = _listen_optional_v6(port, role)
                if six is not None:
                    out[role + "6"] = six
        if proxy and settings.tproxy:
            for role in ("inbound_plaintext", "inbound_plaintext6"):
                if role in out:
                    _transparent(out[role])
        out["admin"] = _listen("127.0.0.1", settings.admin_port, "admin")
    except BaseException:
        for sock in out.values():
            sock.close()
        raise
    return out


def _transparent(sock: socket.socket) -> None:
    """TPROXY hands a connection only to a transparent listener (the kernel drops the rest)."""
    try:
        if sock.family == socket.AF_INET:
            sock.setsockopt(socket.SOL_IP, IP_TRANSPARENT, 1)
        else:
            sock.setsockopt(SOL_IPV6, IPV6_TRANSPARENT, 1)
    except OSError as exc:
        raise ConfigError(
            f"TPROXY interception: cannot make the inbound listener transparent "
            f"({exc.strerror or exc})",
            hint="the proxy needs CAP_NET_ADMIN in TPROXY mode (the injector adds it), or "
            "inject with sidecar.istio.io/interceptionMode: REDIRECT",
        ) from exc


def pod_ports(settings: ZtunnelSettings) -> dict[str, int]:
    """The proxy ports: outbound capture, inbound plaintext, HBONE."""
    return {
        "outbound": settings.outbound_port,
        "inbound_plaintext": settings.inbound_plaintext_port,
        "inbound": settings.inbound_port,
    }


def _listen(host: str, port: int, role: str) -> socket.socket:
    sock = listener(
        host,
        port,
        what=role,
        backlog=_BACKLOG,
        v6only=True,
        in_use_hint="is another proxy running in this network namespace?",
    )
    sock.set_inheritable(True)
    return sock


def _listen_optional_v6(port: int, role: str) -> socket.socket | None:
    try:
        return _listen("::", port, role)
    except PortInUseError:
        raise
    except MeshctlError:
        return None  # no IPv6 in this namespace
