"""gRPC through the gateway, as values: which requests are gRPC, what a GRPCRoute method match
takes, and what the gateway answers itself in gRPC's terms.

Owns gRPC's wire conventions the proxy needs (gRPC's doc/PROTOCOL-HTTP2.md): a request is gRPC
when it came over HTTP/2 with ``content-type`` ``application/grpc`` (or ``application/grpc+...``;
gRPC-Web is not gRPC), its ``:path`` is ``/<service>/<method>``; an answer of the gateway's own is
"trailers-only": HTTP 200 with ``grpc-status`` and a percent-encoded ``grpc-message`` in the one
HEADERS frame. Codes follow gRPC's doc/statuscodes.md; no route is ``UNIMPLEMENTED`` and every
failure to reach a backend is ``UNAVAILABLE`` (as gRPC's own HTTP-status mapping has it for 503).
Invariant: pure.
"""

from __future__ import annotations

import enum
from collections.abc import Iterable

from .model import RpcMatch


class Code(enum.IntEnum):
    OK = 0
    UNKNOWN = 2
    DEADLINE_EXCEEDED = 4
    PERMISSION_DENIED = 7
    RESOURCE_EXHAUSTED = 8
    UNIMPLEMENTED = 12
    INTERNAL = 13
    UNAVAILABLE = 14
    UNAUTHENTICATED = 16


# The gateway's own HTTP answers in gRPC's terms: 404 no route; 500 (a rule without a usable
# backend), 502 and 503 (no endpoint, every endpoint refused, the backend broke off) and 504
# (no answer in time) all mean the backend cannot be reached now.
_BY_HTTP_STATUS = {
    400: Code.INTERNAL,
    401: Code.UNAUTHENTICATED,
    403: Code.PERMISSION_DENIED,
    404: Code.UNIMPLEMENTED,
    413: Code.RESOURCE_EXHAUSTED,
    429: Code.UNAVAILABLE,
    500: Code.UNAVAILABLE,
    502: Code.UNAVAILABLE,
    503: Code.UNAVAILABLE,
    504: Code.UNAVAILABLE,
}
CONTENT_TYPE = "application/grpc"


def is_grpc(protocol: str, headers: Iterable[tuple[str, str]]) -> bool:
    """A gRPC call: HTTP/2 and a gRPC content-type (names lower-case)."""
    if protocol != "HTTP/2":
        return False
    for name, value in headers:
        if name == "content-type":
            kind = value.strip().lower()
            return kind == CONTENT_TYPE or kind.startswith((CONTENT_TYPE + "+", CONTENT_TYPE + ";"))
    return False


def code_for(http_status: int) -> Code:
    """The gRPC status of an answer the gateway gives itself with ``http_status``."""
    return _BY_HTTP_STATUS.get(http_status, Code.UNKNOWN)


def encode_message(text: str) -> str:
    """``grpc-message``'s encoding: UTF-8, every byte outside 0x20-0x7E and '%' as %XX."""
    out = []
    for byte in text.encode("utf-8"):
        out.append(chr(byte) if 0x20 <= byte <= 0x7E and byte != 0x25 else f"%{byte:02X}")
    return "".join(out)


def trailers_only(code: Code, message: str) -> list[tuple[str, str]]:
    """The headers of a trailers-only response (sent with ``:status`` 200 and END_STREAM)."""
    out = [("content-type", CONTENT_TYPE), ("grpc-status", str(int(code)))]
    if message:
        out.append(("grpc-message", encode_message(message)))
    return out


def method_holds(match: RpcMatch, path: str) -> bool:
    """``path`` (a request's ``:path``) calls the service and method ``match`` names."""
    if not match.service and not match.method:
        return True
    if not path.startswith("/"):
        return False
    service, slash, method = path[1:].partition("/")
    if not slash or "/" in method or not service or not method:
        return False
    return (not match.service or service == match.service) and (
        not match.method or method == match.method
    )
