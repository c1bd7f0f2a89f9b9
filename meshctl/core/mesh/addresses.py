"""IP address literals parsed once.

Owns the parse of an address string into an ``ipaddress`` object for the data path, which sees
the same few addresses (its own, its peers', service VIPs) on every connection: the stdlib
parser costs microseconds per call and showed up in the per-connection profile. Invariant:
``ip(x) == ipaddress.ip_address(x)`` for every input, and the same ``ValueError`` for bad ones
(errors are not cached).
"""

from __future__ import annotations

import functools
import ipaddress

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address


@functools.lru_cache(maxsize=8192)
def ip(value: str | IPAddress) -> IPAddress:
    """``ipaddress.ip_address(value)``, remembered (bounded: old entries are dropped)."""
    return ipaddress.ip_address(value)
