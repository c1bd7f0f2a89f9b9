"""TLS for HBONE: the contexts both sides use and the identity a handshake proved.

Owns Istio's HBONE TLS profile: TLS 1.3 only, ALPN ``h2``, no session resumption (no tickets;
clients never offer a session), our workload certificate on both sides, peers verified against
our roots, and no SNI (the client passes ``server_hostname=""``). Invariants: contexts are built
once per certificate generation and never mutated, so a rotation affects only new handshakes;
PEM material never touches a filesystem (``meshctl.keypair``).
"""

from __future__ import annotations

import contextlib
import ssl
from dataclasses import dataclass
from typing import Any

from meshctl import keypair
from meshctl.core.wire.channel import Certs

ALPN_H2 = "h2"


@dataclass(frozen=True, slots=True)
class TlsContexts:
    """The server and client contexts of one certificate generation."""

    server: ssl.SSLContext
    client: ssl.SSLContext
    generation: int


def build(certs: Certs) -> TlsContexts:
    """Contexts for ``certs``; raises ``ssl.SSLError``/``ValueError`` when the PEMs are unusable."""
    chain, key = certs.cert_chain.encode(), certs.key.encode()
    server = _context(ssl.PROTOCOL_TLS_SERVER, chain, key, certs.roots)
    client = _context(ssl.PROTOCOL_TLS_CLIENT, chain, key, certs.roots)
    return TlsContexts(server=server, client=client, generation=certs.generation)


def _context(protocol: int, chain: bytes, key: bytes, roots: str) -> ssl.SSLContext:
    ctx = ssl.SSLContext(protocol)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.maximum_version = ssl.TLSVersion.TLSv1_3
    keypair.load_key_pair(ctx, chain, key)
    ctx.load_verify_locations(cadata=roots)
    ctx.verify_mode = ssl.CERT_REQUIRED  # servers require a client certificate too
    ctx.check_hostname = False  # identity is the SPIFFE URI SAN, checked after the handshake
    ctx.set_alpn_protocols([ALPN_H2])
    ctx.options |= ssl.OP_NO_TICKET
    if protocol == ssl.PROTOCOL_TLS_SERVER:
        ctx.num_tickets = 0  # TLS 1.3 resumption tickets: none issued
    return ctx


def uri_sans(ssl_object: Any) -> list[str]:
    """The URI SANs of the verified peer certificate on ``ssl_object`` (empty if none)."""
    if ssl_object is None:
        return []
    with contextlib.suppress(ValueError):
        cert = ssl_object.getpeercert()
        if cert:
            return [v for k, v in cert.get("subjectAltName", ()) if k == "URI"]
    return []


def alpn(ssl_object: Any) -> str | None:
    if ssl_object is None:
        return None
    value = ssl_object.selected_alpn_protocol()
    return str(value) if value is not None else None
