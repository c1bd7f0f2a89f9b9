"""One request as the gateway's front ends (HTTP/1.1, HTTP/2) hand it to the forwarder, and the
sink its response goes to: what the routing code sees of either protocol.

Owns ``Inbound`` (the request head, its body as an async stream of bytes, and where it arrived)
and the ``ResponseSink`` protocol. Invariants: header names are lower-case; hop-by-hop headers
are already gone (each protocol has its own); a body stream ends (None) exactly once, or raises
``BodyError`` when the client went away or broke its framing.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Protocol

# RFC 9110 7.6.1: connection-specific fields a proxy never forwards.
HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-connection",
        "te",
        "trailer",
        "transfer-encoding",
        "upgrade",
        "expect",
        "http2-settings",
    }
)

Headers = list[tuple[str, str]]


class BodyError(Exception):
    """The request body did not arrive whole (the client reset, closed, or stalled)."""


def end_to_end(headers: Headers) -> Headers:
    """``headers`` without hop-by-hop fields, nor those the Connection header names."""
    named = {
        token.strip().lower()
        for name, value in headers
        if name == "connection"
        for token in value.split(",")
    }
    return [(n, v) for n, v in headers if n not in HOP_BY_HOP and n not in named]


class Body:
    """A request body as it arrives: chunks through a small queue (the reader waits when the
    upstream is slower than the client: backpressure), None at its end."""

    def __init__(
        self,
        length: int | None,
        *,
        empty: bool = False,
        bound: int = 8,
        taken: Callable[[int], None] | None = None,
    ) -> None:
        self.length = length  # Content-Length, or None (chunked, or an HTTP/2 stream)
        # ``bound`` 0: unbounded (HTTP/2, whose flow-control window bounds what is queued);
        # ``taken`` hears of each chunk handed on (HTTP/2 returns that much window then).
        self._queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue(maxsize=bound)
        self._taken = taken
        self.done = empty
        self.received = 0
        if empty:
            self._queue.put_nowait(None)

    async def put(self, chunk: bytes | BaseException | None) -> None:
        await self._queue.put(chunk)

    def put_nowait(self, chunk: bytes | BaseException | None) -> bool:
        try:
            self._queue.put_nowait(chunk)
        except asyncio.QueueFull:
            return False
        return True

    async def chunks(self) -> AsyncIterator[bytes]:
        while not self.done:
            item = await self._queue.get()
            if item is None:
                self.done = True
                return
            if isinstance(item, BaseException):
                self.done = True
                raise BodyError(str(item) or type(item).__name__) from item
            self.received += len(item)
            yield item
            if self._taken is not None:
                self._taken(len(item))

    async def drain(self) -> None:
        """Read and drop what is left (a request answered without reading its body)."""
        async for _ in self.chunks():
            pass


@dataclass(slots=True, kw_only=True)
class Inbound:
    method: str
    target: str  # the request target as sent (origin form: path and query)
    authority: str  # Host, or :authority
    headers: Headers  # lower-case names, end-to-end only
    body: Body
    scheme: str  # http | https (what the client used to reach us)
    port: int  # the listener port as the table names it
    client: tuple[str, int]
    protocol: str  # HTTP/1.1 | HTTP/2
    sni: str = ""
    started: float = 0.0  # loop time the head was complete
    extra: dict[str, str] = field(default_factory=dict)


class ResponseSink(Protocol):
    """Where a response goes: the front end frames it for its protocol."""

    @property
    def started(self) -> bool: ...

    async def start(
        self, status: int, headers: Headers, length: int | None, *, end_stream: bool = False
    ) -> None:
        """Send the head; ``length`` None: the body's length is not known (chunked/streamed).
        ``end_stream``: the head is the whole response (HTTP/2: a trailers-only gRPC answer)."""

    async def write(self, data: bytes) -> None: ...

    async def end(self, trailers: Headers | None = None) -> None:
        """The response is complete; ``trailers`` go after the body where the protocol has
        them (HTTP/2; HTTP/1.1 drops them: no client of ours asks for chunked trailers)."""

    def abort(self) -> None:
        """The response cannot be completed (the upstream broke off): reset it."""
