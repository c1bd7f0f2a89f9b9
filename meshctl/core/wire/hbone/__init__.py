"""HBONE, sans-IO: HTTP/2 CONNECT tunnels (RFC 9113 §8.5, RFC 9110 §9.3.6) as Istio speaks them.

``HboneConnection`` takes bytes and returns events; ``headers`` owns the request's header forms.
Nothing here touches a socket, a clock or a TLS library: the data plane is the I/O shell.
"""

from meshctl.core.wire.hbone.connection import HboneConnection, TunnelSettings, TunnelStateError
from meshctl.core.wire.hbone.events import (
    ConnectionClosed,
    DataReceived,
    Event,
    StreamEnded,
    StreamReset,
    TunnelOpened,
    TunnelRefused,
    TunnelRejected,
    TunnelRequested,
    Writable,
)
from meshctl.core.wire.hbone.headers import Authority, format_authority, parse_authority

__all__ = [
    "Authority",
    "ConnectionClosed",
    "DataReceived",
    "Event",
    "HboneConnection",
    "StreamEnded",
    "StreamReset",
    "TunnelOpened",
    "TunnelRefused",
    "TunnelRejected",
    "TunnelRequested",
    "TunnelSettings",
    "TunnelStateError",
    "Writable",
    "format_authority",
    "parse_authority",
]
