"""TLS for the gateway's HTTPS listeners: one server context per port whose ``sni_callback``
picks the context of the listener the client's SNI names (each built from that listener's
first usable certificate), ALPN ``h2`` and ``http/1.1``.

Owns the SNI -> certificate step. Invariants: the per-port context never changes, only the
map behind its callback (a new config's certificates are served from the next handshake on,
without a restart or a new socket); a name no listener with a certificate covers fails the
handshake (the callback answers ``unrecognized_name``; asyncio's TLS transport closes the
connection before the alert reaches the client), never served another listener's
certificate; the SNI the handshake chose is kept on the connection (``sni_of``) for the 421
check. Keys live in memory
and, while a context loads them, in a private temporary directory (stdlib ``ssl`` reads files).
"""

from __future__ import annotations

import hashlib
import logging
import ssl
from typing import Any

from meshctl import keypair
from meshctl.core.gateway import hostnames
from meshctl.core.gateway.config import GatewayConfig, KeyPair
from meshctl.core.gateway.model import Protocol

log = logging.getLogger(__name__)
ALPN = ("h2", "http/1.1")
_SNI_ATTRIBUTE = "meshctl_sni"


def _context(pair: KeyPair, alpn: tuple[str, ...]) -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    keypair.load_key_pair(ctx, pair.chain_pem, pair.key_pem)
    ctx.set_alpn_protocols(list(alpn))
    return ctx


def sni_of(ssl_object: Any) -> str:
    return str(getattr(ssl_object, _SNI_ATTRIBUTE, "") or "")


class SniContexts:
    """Per HTTPS port: (hostname pattern, context) in the table's listener order."""

    def __init__(self, alpn: tuple[str, ...] = ALPN) -> None:
        self.alpn = alpn
        self._by_port: dict[int, list[tuple[str, ssl.SSLContext]]] = {}
        self._built: dict[str, ssl.SSLContext] = {}  # key pair digest -> context
        self._base: dict[int, ssl.SSLContext] = {}
        self.one_label = False

    def update(self, config: GatewayConfig) -> None:
        """Take ``config``'s certificates; contexts of unchanged key pairs are kept."""
        by_port: dict[int, list[tuple[str, ssl.SSLContext]]] = {}
        built: dict[str, ssl.SSLContext] = {}
        for port in config.table.ports:
            if port.protocol is not Protocol.HTTPS:
                continue
            entries = by_port.setdefault(port.port, [])
            for lr in port.listeners:
                for ref in lr.listener.certificates:
                    pair = config.certificates.get(ref)
                    if pair is None:
                        continue
                    digest = hashlib.sha256(pair.chain_pem + b"\0" + pair.key_pem).hexdigest()
                    ctx = built.get(digest) or self._built.get(digest)
                    if ctx is None:
                        try:
                            ctx = _context(pair, self.alpn)
                        except (ssl.SSLError, OSError) as exc:
                            log.warning(
                                "certificate %s of %s unusable: %s", ref, lr.listener.label, exc
                            )
                            continue
                    built[digest] = ctx
                    entries.append((lr.listener.hostname, ctx))
                    break  # the listener's first usable certificate
        self._by_port, self._built = by_port, built
        self.one_label = config.table.one_label_wildcards

    def server_context(self, port: int) -> ssl.SSLContext:
        """The context a listening socket of ``port`` uses (the same object for its life)."""
        base = self._base.get(port)
        if base is None:
            base = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            base.minimum_version = ssl.TLSVersion.TLSv1_2
            base.set_alpn_protocols(list(self.alpn))
            base.sni_callback = lambda obj, name, _ctx: self._choose(port, obj, name)
            self._base[port] = base
        return base

    def _choose(self, port: int, ssl_object: Any, name: str | None) -> int | None:
        entries = self._by_port.get(port, [])
        host = hostnames.request_host(name or "")
        for pattern, ctx in entries:
            if (not host and pattern == hostnames.ANY) or (
                host and hostnames.matches(pattern, host, one_label=self.one_label)
            ):
                ssl_object.context = ctx
                setattr(ssl_object, _SNI_ATTRIBUTE, host)
                return None
        if not host and entries:  # a client without SNI: the first listener's certificate
            ssl_object.context = entries[0][1]
            return None
        return ssl.ALERT_DESCRIPTION_UNRECOGNIZED_NAME
