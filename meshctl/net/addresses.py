"""The addresses of this network namespace: what a server listening on every address answers on.

Read over netlink (pyroute2) in the calling thread's namespace. Link-local addresses are left
out (a peer would need the interface's zone to dial them); nothing pyroute2 makes leaves here.
"""

from __future__ import annotations

import socket

from meshctl.errors import NetError

_SCOPE_LINK = 253


def local_addresses(*, v6: bool = True) -> list[str]:
    """Every address of every interface (IPv4 first; IPv6 with ``v6``), in the kernel's order."""
    from pyroute2 import IPRoute

    found: dict[int, list[str]] = {socket.AF_INET: [], socket.AF_INET6: []}
    try:
        with IPRoute() as ipr:
            for message in ipr.get_addr():
                family = message.get("family")
                address = message.get_attr("IFA_ADDRESS")
                if family in found and address and message.get("scope") != _SCOPE_LINK:
                    found[family].append(str(address))
    except OSError as exc:
        raise NetError(f"cannot read this host's addresses: {exc.strerror or exc}") from exc
    return list(dict.fromkeys(found[socket.AF_INET] + (found[socket.AF_INET6] if v6 else [])))
