"""The HBONE request's header values: ``:authority``, ``forwarded`` and ``baggage``.

Owns their wire forms: ``:authority`` is ``<ip>:<port>`` with IPv6 in brackets (RFC 9110 §9.3.6,
CONNECT's authority-form; RFC 3986 §3.2.2); ``forwarded`` is RFC 7239 with ``for`` quoted (it
carries ``:`` and ``[]``); ``baggage`` is the W3C Baggage list ztunnel sends (``k8s.*`` and
``service.*`` keys). Invariant: ``parse_authority(format_authority(a)) == a``; parsers raise
``ValueError`` with the reason and accept nothing else.
"""

from __future__ import annotations

import functools
import ipaddress
from collections.abc import Mapping
from dataclasses import dataclass

from meshctl.core.mesh.addresses import ip as parse_ip

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True, slots=True)
class Authority:
    """A CONNECT target: an IP literal and a port (hostnames are for double HBONE, not here)."""

    ip: IPAddress
    port: int

    def __str__(self) -> str:
        return format_authority(self.ip, self.port)


def format_authority(ip: str | IPAddress, port: int) -> str:
    return f"{_host(ip)}:{port}"


@functools.lru_cache(maxsize=8192)
def _host(ip: str | IPAddress) -> str:
    """The canonical host text of ``ip`` (IPv6 bracketed), remembered: every new connection
    formats two (authority, forwarded) of a few distinct addresses, and ``str`` of an
    ``ipaddress`` value was 6% of the outbound proxy's CPU per connection (profiled)."""
    addr = parse_ip(ip)
    return f"[{addr}]" if addr.version == 6 else str(addr)


@functools.lru_cache(
    maxsize=8192
)  # every stream to one destination asks the same (errors not kept)
def parse_authority(text: str) -> Authority:
    """``1.2.3.4:80`` or ``[::1]:80`` -> Authority; anything else is a ``ValueError``."""
    if text.startswith("["):
        host, sep, port_text = text[1:].partition("]:")
        if not sep:
            raise ValueError(f"authority {text!r}: want [ipv6]:port")
        addr: IPAddress = ipaddress.IPv6Address(host)
    else:
        host, sep, port_text = text.rpartition(":")
        if not sep or ":" in host:
            raise ValueError(f"authority {text!r}: want ip:port")
        addr = ipaddress.IPv4Address(host)
    if not port_text.isdigit() or len(port_text) > 5 or not 0 < int(port_text) < 65536:
        raise ValueError(f"authority {text!r}: bad port")
    return Authority(addr, int(port_text))


def format_forwarded(src_ip: str | IPAddress, src_port: int, *, host: str | None = None) -> str:
    """RFC 7239 ``for="<ip>:<port>"`` (IPv6 bracketed), plus ``host=`` for a service hostname."""
    value = f'for="{format_authority(src_ip, src_port)}"'
    if host:
        value += f";host={host}"
    return value


def parse_forwarded_for(value: str) -> tuple[IPAddress, int | None] | None:
    """The client address of the first ``for=`` element, or None when absent or obfuscated."""
    first = value.split(",", 1)[0]
    for pair in first.split(";"):
        key, _, raw = pair.strip().partition("=")
        if key.strip().lower() != "for":
            continue
        node = raw.strip().strip('"')
        try:
            if node.startswith("["):
                host, _, rest = node[1:].partition("]")
                port = int(rest[1:]) if rest.startswith(":") else None
                return ipaddress.IPv6Address(host), port
            host, sep, port_text = node.partition(":")
            return ipaddress.IPv4Address(host), int(port_text) if sep else None
        except ValueError:
            return None
    return None


def parse_forwarded_host(value: str) -> str | None:
    """The ``host=`` of the first RFC 7239 element (unquoted), or None when absent or empty.

    What the client's proxy says it dialled (a Service hostname): a claim, only ever matched
    against the services of the workload it reached, never trusted on its own.
    """
    first = value.split(",", 1)[0]
    for pair in first.split(";"):
        key, sep, raw = pair.strip().partition("=")
        if not sep or key.strip().lower() != "host":
            continue
        host = raw.strip()
        if len(host) >= 2 and host[0] == host[-1] == '"':
            host = host[1:-1]
        return host or None
    return None


def format_baggage(
    *,
    cluster: str,
    namespace: str,
    workload_type: str,
    workload_name: str,
    service: str,
    revision: str,
) -> str:
    """ztunnel's baggage: where the source runs and which canonical service it belongs to."""
    items = [
        ("k8s.cluster.name", cluster),
        ("k8s.namespace.name", namespace),
        (f"k8s.{workload_type or 'deployment'}.name", workload_name),
        ("service.name", service),
        ("service.version", revision),
    ]
    return ",".join(f"{k}={v}" for k, v in items if v)


def parse_baggage(value: str) -> Mapping[str, str]:
    """W3C baggage members as a mapping (properties after ``;`` are dropped)."""
    result = {}
    for member in value.split(","):
        key, sep, rest = member.partition("=")
        if sep and key.strip():
            result[key.strip()] = rest.split(";", 1)[0].strip()
    return result
