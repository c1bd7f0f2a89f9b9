"""A minimal HTTP/1.1 responder for a proxy's own ports: readiness, metrics, admin.

Owns the wire side only: one request per connection, ``Connection: close``, a read deadline on
the head and the body, bodies up to 64 KiB (read and dropped: handlers see the method, path,
query and headers), anything malformed answered 400. A proxy passes a ``Handler`` per port (its
routes). Invariants: every connection gets exactly one response and is closed; a client that is
slow to send its request is answered 400 after the deadline, one that stops reading is dropped.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING
from urllib.parse import parse_qs, urlsplit

if TYPE_CHECKING:
    import socket

Response = tuple[int, str, bytes]
# (method, path, query, headers with lower-case names) -> response
Handler = Callable[[str, str, dict[str, list[str]], dict[str, str]], Awaitable[Response]]
_REASONS = {
    200: "OK",
    400: "Bad Request",
    404: "Not Found",
    405: "Method Not Allowed",
    503: "Service Unavailable",
}
_READ_DEADLINE = 5.0
_MAX_BODY = 64 * 1024


async def serve(sock: socket.socket, handler: Handler) -> asyncio.Server:
    """Answer HTTP requests arriving on the listening ``sock`` with ``handler``."""

    async def one(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_DEADLINE)
            request_line = head.split(b"\r\n", 1)[0].decode("latin-1")
            method, target, _ = request_line.split(" ", 2)
            headers: dict[str, str] = {}
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.decode("latin-1").partition(":")
                headers[name.strip().lower()] = value.strip()
            length = min(int(headers.get("content-length") or 0), _MAX_BODY)
            if length:
                await asyncio.wait_for(reader.readexactly(length), _READ_DEADLINE)
            url = urlsplit(target)
            status, ctype, body = await handler(method, url.path, parse_qs(url.query), headers)
        except (
            ValueError,  # a request line or header that is not HTTP, or a bad content-length
            asyncio.IncompleteReadError,
            asyncio.LimitOverrunError,  # a head longer than the reader's 64 KiB limit
            TimeoutError,
            ConnectionError,
        ):
            status, ctype, body = 400, "text/plain", b"bad request\n"
        try:
            writer.write(
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
                f"Content-Type: {ctype}\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode("latin-1")
                + body
            )
            await asyncio.wait_for(writer.drain(), _READ_DEADLINE)
        except (ConnectionError, TimeoutError):
            pass
        finally:
            writer.close()

    return await asyncio.start_server(one, sock=sock)
