"""The gateway's HTTP/1.1 front end: one client connection, parsed by httptools (llhttp), its
requests handed to the forwarder one at a time, keep-alive.

Owns the client side of RFC 9112: request framing (Content-Length or chunked, read as it
arrives and passed on with backpressure), response framing (Content-Length when known, else
chunked, or close-delimited for an HTTP/1.0 client), keep-alive, and the answers to bad input:
a request the parser refuses -> 400, a head past the limit -> 431, a Content-Length past the body
limit -> 413, a head not complete within the header timeout -> 408 (slowloris), each followed
by closing this connection only. Invariant: every request gets one response or the connection
closes; a client that resets affects only its own requests.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import httptools

from .exchange import Body, Headers, Inbound, end_to_end

log = logging.getLogger(__name__)

REASONS = {
    100: "Continue",
    200: "OK",
    301: "Moved Permanently",
    302: "Found",
    303: "See Other",
    307: "Temporary Redirect",
    308: "Permanent Redirect",
    400: "Bad Request",
    404: "Not Found",
    408: "Request Timeout",
    413: "Content Too Large",
    421: "Misdirected Request",
    431: "Request Header Fields Too Large",
    500: "Internal Server Error",
    502: "Bad Gateway",
    503: "Service Unavailable",
    504: "Gateway Timeout",
}
_READ = 64 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class Limits:
    header_bytes: int = 64 * 1024  # request line + headers
    body_bytes: int = 0  # 0: no limit of ours
    header_timeout: float = 10.0
    idle_timeout: float = 60.0


class _TooLargeError(Exception):
    pass


class _Parse:
    """httptools' callbacks collected as events; the connection acts on them after each feed."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.events: list[tuple[str, Any]] = []
        self.in_head = False
        self.began = 0.0
        self.head_bytes = 0
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.parser: Any = None

    def _count(self, n: int) -> None:
        self.head_bytes += n
        if self.head_bytes > self.limit:
            raise _TooLargeError

    def on_message_begin(self) -> None:
        self.in_head, self.head_bytes, self.url, self.headers = True, 0, b"", []
        self.began = asyncio.get_running_loop().time()

    def on_url(self, url: bytes) -> None:
        self._count(len(url))
        self.url += url

    def on_header(self, name: bytes, value: bytes) -> None:
        self._count(len(name) + len(value) + 4)
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        # Read now: after the feed the parser may be in the next message (a body in the same
        # bytes, or a pipelined request) and answer for that one.
        p = self.parser
        facts = (p.get_method(), p.get_http_version(), p.should_keep_alive())
        self.in_head = False
        self.events.append(("head", (self.url, self.headers, facts)))

    def on_body(self, body: bytes) -> None:
        self.events.append(("body", bytes(body)))

    def on_message_complete(self) -> None:
        self.events.append(("end", None))


def _refusal(parser: Any, data: bytes) -> tuple[int, str] | None:
    """Feed ``data``; the answer to what the parser refused (None: all well)."""
    try:
        parser.feed_data(data)
    except httptools.HttpParserUpgrade:
        return 400, "protocol upgrades are not served"
    except httptools.HttpParserCallbackError as exc:
        if isinstance(exc.__context__, _TooLargeError):
            return 431, "request head too large"
        return 400, "bad request"
    except httptools.HttpParserError as exc:
        return 400, f"bad request ({exc})"
    return None


def reason(status: int) -> str:
    return REASONS.get(status, "Unknown")


def head_bytes(status: int, headers: Headers) -> bytes:
    lines = [f"HTTP/1.1 {status} {reason(status)}\r\n"]
    lines.extend(f"{n}: {v}\r\n" for n, v in headers)
    lines.append("\r\n")
    return "".join(lines).encode("latin-1")


def plain_response(status: int, text: str, extra: Headers = ()) -> bytes:  # type: ignore[assignment]
    body = text.encode()
    headers = [
        ("content-type", "text/plain"),
        ("content-length", str(len(body))),
        ("connection", "close"),
        *extra,
    ]
    return head_bytes(status, headers) + body


class _Sink:
    """A response to one request on this connection, framed for HTTP/1.1."""

    def __init__(self, conn: Connection, *, head_only: bool, http10: bool) -> None:
        self.conn = conn
        self.head_only = head_only
        self.http10 = http10
        self.chunked = False
        self._started = False
        self.close_after = False
        self.finished = False

    @property
    def started(self) -> bool:
        return self._started

    async def start(
        self, status: int, headers: Headers, length: int | None, *, end_stream: bool = False
    ) -> None:
        self._started = True
        if end_stream:
            length = 0
        out = [(n, v) for n, v in headers if n not in ("content-length", "transfer-encoding")]
        no_body = status in (204, 304) or 100 <= status < 200
        if length is not None:
            if not no_body:
                out.append(("content-length", str(length)))
        elif not no_body and not self.head_only:
            if self.http10:
                self.close_after = True  # close-delimited: an HTTP/1.0 client knows no chunks
            else:
                self.chunked = True
                out.append(("transfer-encoding", "chunked"))
        if self.close_after or self.conn.closing:
            self.close_after = True
            out.append(("connection", "close"))
        self.conn.writer.write(head_bytes(status, out))
        await self.conn.writer.drain()

    async def write(self, data: bytes) -> None:
        if self.head_only or not data:
            return
        if self.chunked:
            self.conn.writer.writelines([b"%x\r\n" % len(data), data, b"\r\n"])
        else:
            self.conn.writer.write(data)
        await self.conn.writer.drain()

    async def end(self, trailers: Headers | None = None) -> None:
        if self.chunked and not self.head_only:
            self.conn.writer.write(b"0\r\n\r\n")
            await self.conn.writer.drain()
        self.finished = True

    def abort(self) -> None:
        self.close_after = True
        self.conn.writer.transport.abort()


class Connection:
    """One client connection: ``run`` reads and parses; requests are handled in order."""

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        handler: Any,  # async (Inbound, sink) -> None
        port: int,
        scheme: str,
        sni: str,
        limits: Limits,
        initial: bytes = b"",
    ) -> None:
        self.initial = initial  # bytes read before this connection knew it was HTTP/1.1
        self.reader, self.writer = reader, writer
        self.handler, self.port, self.scheme, self.sni = handler, port, scheme, sni
        self.limits = limits
        self.closing = False  # drain: finish the request in flight, then close
        peer = writer.get_extra_info("peername") or ("", 0)
        self.client = (str(peer[0]), int(peer[1]))
        self._requests: asyncio.Queue[tuple[Inbound, _Sink] | None] = asyncio.Queue(maxsize=4)
        self._body: Body | None = None
        self.busy = False
        self.heads = 0  # request heads received

    async def run(self) -> None:
        """Serve until the client closes, breaks the protocol or stalls, or we drain."""
        worker = asyncio.create_task(self._serve_requests())
        try:
            await self._read_loop()
        finally:
            if self._body is not None and not self._body.done:
                self._body.put_nowait(ConnectionResetError("client closed the connection"))
            with contextlib.suppress(asyncio.QueueFull):
                self._requests.put_nowait(None)
            try:
                await worker
            finally:
                self.writer.close()
                with contextlib.suppress(Exception):
                    await self.writer.wait_closed()

    async def _read_loop(self) -> None:
        state = _Parse(self.limits.header_bytes)
        parser = httptools.HttpRequestParser(state)
        state.parser = parser
        loop = asyncio.get_running_loop()
        opened = loop.time()
        if self.initial and not await self._feed(state, parser, self.initial):
            return
        while not self.closing:
            # A new connection must send its first head in time, and every head must complete
            # within the header timeout from its first byte (slowloris).
            waiting_head = state.in_head or not self.heads
            if waiting_head:
                began = state.began if state.in_head else opened
                timeout = max(began + self.limits.header_timeout - loop.time(), 0.0)
            else:
                timeout = self.limits.idle_timeout
            try:
                data = await asyncio.wait_for(self.reader.read(_READ), timeout)
            except TimeoutError:
                if await self._timed_out(waiting_head=waiting_head):
                    continue
                return
            except (ConnectionError, OSError):
                return
            if not data or not await self._feed(state, parser, data):
                return

    async def _feed(self, state: _Parse, parser: Any, data: bytes) -> bool:
        """Parse ``data`` and act on it; False when the connection is done."""
        refusal = _refusal(parser, data)
        if refusal is not None:
            await self._refuse(*refusal)
            return False
        return await self._dispatch(state, parser)

    async def _timed_out(self, *, waiting_head: bool) -> bool:
        """A read timed out: True to keep reading (the upstream is slow, not the client)."""
        if waiting_head:
            await self._refuse(408, "request head not complete in time")
            return False
        if self._body is not None:
            self._body.put_nowait(TimeoutError("request body stalled"))
            return False
        return self.busy

    async def _dispatch(self, state: _Parse, parser: Any) -> bool:
        events, state.events = state.events, []
        for kind, value in events:
            if kind == "head":
                if not await self._begin(*value):
                    return False
            elif kind == "body" and self._body is not None:
                await self._body.put(value)
            elif kind == "end" and self._body is not None:
                await self._body.put(None)
                self._body = None
        return True

    async def _begin(
        self, url: bytes, raw: list[tuple[bytes, bytes]], facts: tuple[bytes, str, bool]
    ) -> bool:
        self.heads += 1
        method = facts[0].decode("latin-1")
        version = facts[1]
        headers = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in raw]
        hosts = [v for n, v in headers if n == "host"]
        lengths = [v for n, v in headers if n == "content-length"]
        chunked = any(n == "transfer-encoding" for n, _ in headers)
        if (version == "1.1" and len(hosts) != 1) or len(hosts) > 1:
            await self._refuse(400, "a request needs exactly one Host header")
            return False
        length: int | None = int(lengths[0]) if lengths and not chunked else None
        if self.limits.body_bytes and length is not None and length > self.limits.body_bytes:
            await self._refuse(413, f"request body over {self.limits.body_bytes} bytes")
            return False
        body = Body(length, empty=length in (None, 0) and not chunked)
        if not body.done:
            self._body = body
            if any(n == "expect" and v.lower() == "100-continue" for n, v in headers):
                self.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        keep = facts[2]
        inbound = Inbound(
            method=method,
            target=url.decode("latin-1"),
            authority=hosts[0] if hosts else "",
            headers=end_to_end(headers),
            body=body,
            scheme=self.scheme,
            port=self.port,
            client=self.client,
            protocol=f"HTTP/{version}",
            sni=self.sni,
            started=asyncio.get_running_loop().time(),
        )
        sink = _Sink(self, head_only=method == "HEAD", http10=version == "1.0")
        sink.close_after = not keep
        await self._requests.put((inbound, sink))
        return True

    async def _serve_requests(self) -> None:
        while (item := await self._requests.get()) is not None:
            inbound, sink = item
            self.busy = True
            try:
                await self.handler(inbound, sink)
                if not inbound.body.done:
                    sink.close_after = True  # an unread body would be taken for the next head
            except (ConnectionError, OSError):
                sink.close_after = True
            except Exception:
                log.exception("request %s %s failed", inbound.method, inbound.target)
                sink.close_after = True
            finally:
                self.busy = False
            if sink.close_after or not sink.finished or self.closing:
                self.closing = True
                self.reader.feed_eof()
                return

    async def _refuse(self, status: int, text: str) -> None:
        """Answer a request we will not serve, then close (only when no response is under
        way on this connection: one in flight finishes first, then the connection closes)."""
        log.info("%s %s: %s", self.client[0], status, text)
        while self.busy:
            await asyncio.sleep(0.01)
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            self.writer.write(plain_response(status, f"{text}\n"))
            await self.writer.drain()
        self.closing = True

    def drain(self) -> None:
        """Finish the request in flight, then close; an idle connection closes now."""
        self.closing = True
        if not self.busy:
            self.reader.feed_eof()
