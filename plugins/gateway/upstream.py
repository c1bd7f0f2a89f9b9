"""The gateway's HTTP/1.1 client towards backends: pooled keep-alive connections per endpoint,
requests written with their body streamed (Content-Length as the client sent it, else
chunked), responses parsed by httptools and their bodies streamed back.

Owns the upstream half of RFC 9112 and the pool. Invariants: a connection returns to the pool
only after a whole response was read and the whole request sent, with keep-alive on both sides;
a pooled connection the backend closed while idle is never used for a request (checked, and a
request that finds it dead before any byte of its body was sent is retried once on a new
connection); every wait has a deadline.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

import httptools

from .exchange import Body, Headers, end_to_end

log = logging.getLogger(__name__)

_READ = 64 * 1024
MAX_IDLE_PER_ENDPOINT = 256  # above the concurrency of one busy gateway to one endpoint


class Writer(Protocol):
    """The sending half of a connection to an endpoint: a TCP socket, or an HBONE stream."""

    def write(self, data: bytes) -> None: ...
    def writelines(self, data: list[bytes]) -> None: ...
    async def drain(self) -> None: ...
    def write_eof(self) -> None: ...  # half-close: nothing more from us, reading goes on
    def is_closing(self) -> bool: ...
    def close(self) -> None: ...
    def abort(self) -> None: ...


class TcpWriter:
    """``Writer`` over an asyncio stream writer."""

    def __init__(self, writer: asyncio.StreamWriter) -> None:
        self._w = writer

    def write(self, data: bytes) -> None:
        self._w.write(data)

    def writelines(self, data: list[bytes]) -> None:
        self._w.writelines(data)

    async def drain(self) -> None:
        await self._w.drain()

    def write_eof(self) -> None:
        if self._w.can_write_eof() and not self._w.is_closing():
            self._w.write_eof()

    def is_closing(self) -> bool:
        return self._w.is_closing()

    def close(self) -> None:
        self._w.close()

    def abort(self) -> None:
        self._w.transport.abort()


# (host, port) -> (reader, writer): how a connection to an endpoint is made (plaintext TCP, or
# a stream through an HBONE tunnel).
Dialer = Callable[[str, int], Awaitable[tuple[asyncio.StreamReader, Writer]]]


class ConnectError(Exception):
    """No connection to the endpoint (refused, unreachable, timed out): another may serve."""


class UpstreamError(Exception):
    """The backend broke off the exchange after it began (reset, bad response, timeout)."""


async def tcp_dialer(host: str, port: int) -> tuple[asyncio.StreamReader, Writer]:
    reader, writer = await asyncio.open_connection(host, port, limit=_READ)
    return reader, TcpWriter(writer)


@dataclass(slots=True)
class _Conn:
    key: tuple[str, int]
    reader: asyncio.StreamReader
    writer: Writer
    reused: bool = False

    def alive(self) -> bool:
        # Bytes from an idle backend (buffered) are no answer to anything we sent: unusable.
        return not (self.reader.at_eof() or self.writer.is_closing() or self.reader._buffer)  # type: ignore[attr-defined]

    def close(self) -> None:
        self.writer.close()


class _ResponseParse:
    """httptools' callbacks as events; interim (1xx) responses are skipped whole."""

    def __init__(self) -> None:
        self.events: list[tuple[str, Any]] = []
        self.headers: list[tuple[bytes, bytes]] = []
        self.head_done = False
        self.interim = False
        self.keep_alive = False
        self.status = 0
        self.parser: Any = None

    def on_header(self, name: bytes, value: bytes) -> None:
        self.headers.append((name, value))

    def on_headers_complete(self) -> None:
        status = self.parser.get_status_code()
        headers, self.headers = self.headers, []
        if 100 <= status < 200 and status != 101:  # 100 Continue and the like
            self.interim = True
            return
        self.head_done = True
        # Read now: once the whole response is parsed in the same feed, the parser answers
        # for the next message.
        self.keep_alive = self.parser.should_keep_alive()
        self.status = status
        self.events.append(("head", headers))

    def on_body(self, body: bytes) -> None:
        self.events.append(("body", bytes(body)))

    def on_message_complete(self) -> None:
        if self.interim:
            self.interim = False
            return
        self.events.append(("end", None))


@dataclass(slots=True, kw_only=True)
class Response:
    status: int
    headers: Headers  # lower-case names, end-to-end only
    length: int | None
    body: AsyncIterator[bytes]
    received: int = 0
    chunked: bool = False
    # HTTP/2 upstreams: the head ended the stream (a trailers-only response: no body, nothing
    # after it), and the trailers once the body has ended (None: HTTP/1.1, none kept)
    ended: bool = False
    trailers: Headers | None = None
    _closer: Callable[[], None] = field(default=lambda: None)

    def close(self) -> None:
        """Give up on the rest of the body (the connection is closed, not pooled)."""
        self._closer()


class Pool:
    def __init__(self, *, connect_timeout: float = 5.0, idle_timeout: float = 60.0) -> None:
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self._idle: dict[tuple[str, int], list[tuple[_Conn, float]]] = {}
        self.opened = 0  # connections made (for tests and the admin dump)

    async def _acquire(self, key: tuple[str, int], dial: Dialer) -> _Conn:
        now = asyncio.get_running_loop().time()
        idle = self._idle.get(key, [])
        while idle:
            conn, since = idle.pop()
            if conn.alive() and now - since < self.idle_timeout:
                conn.reused = True
                return conn
            conn.close()
        try:
            reader, writer = await asyncio.wait_for(dial(*key), self.connect_timeout)
        except TimeoutError as exc:
            raise ConnectError(f"connect to {key[0]}:{key[1]} timed out") from exc
        except OSError as exc:
            raise ConnectError(f"connect to {key[0]}:{key[1]}: {exc.strerror or exc}") from exc
        self.opened += 1
        return _Conn(key, reader, writer)

    def _release(self, conn: _Conn) -> None:
        idle = self._idle.setdefault(conn.key, [])
        if len(idle) >= MAX_IDLE_PER_ENDPOINT or not conn.alive():
            conn.close()
            return
        idle.append((conn, asyncio.get_running_loop().time()))

    def close(self) -> None:
        for idle in self._idle.values():
            for conn, _ in idle:
                conn.close()
        self._idle.clear()

    async def request(
        self,
        key: tuple[str, int],
        *,
        method: str,
        target: str,
        headers: Headers,
        body: Body,
        head_timeout: float,
        dial: Dialer = tcp_dialer,
    ) -> Response:
        """Send the request to ``key`` and return once the response head arrived."""
        for attempt in (0, 1):
            conn = await self._acquire(key, dial)
            try:
                return await self._exchange(conn, method, target, headers, body, head_timeout)
            except _StaleConnectionError:
                conn.close()
                if attempt or body.received:
                    raise UpstreamError("backend closed the connection") from None
        raise AssertionError("unreachable")  # pragma: no cover

    async def _exchange(
        self,
        conn: _Conn,
        method: str,
        target: str,
        headers: Headers,
        body: Body,
        head_timeout: float,
    ) -> Response:
        chunked = body.length is None and not body.done
        out = [f"{method} {target} HTTP/1.1\r\n"]
        out.extend(f"{n}: {v}\r\n" for n, v in headers if n not in ("content-length",))
        if body.length is not None and not (body.length == 0 and method in ("GET", "HEAD")):
            out.append(f"content-length: {body.length}\r\n")
        if chunked:
            out.append("transfer-encoding: chunked\r\n")
        out.append("\r\n")
        try:
            conn.writer.write("".join(out).encode("latin-1"))
        except (ConnectionError, OSError, RuntimeError) as exc:
            raise _StaleConnectionError from exc
        sender = asyncio.create_task(_send_body(conn, body, chunked))
        sender.add_done_callback(_retrieve)
        try:
            state, parser = await self._read_head(conn, head_timeout)
        except BaseException:
            _abandon(conn, sender)
            raise
        status = state.status
        raw = next(v for k, v in state.events if k == "head")
        resp_headers = [(n.decode("latin-1").lower(), v.decode("latin-1")) for n, v in raw]
        lengths = [v for n, v in resp_headers if n == "content-length"]
        chunked_response = any(n == "transfer-encoding" for n, _ in resp_headers)
        length = int(lengths[0]) if lengths and not chunked_response else None
        no_body = method == "HEAD" or status in (204, 304)
        if no_body:
            length = 0 if method != "HEAD" else length
        keep = state.keep_alive
        made: list[Response] = []  # the generator reads the response it belongs to
        response = Response(
            status=status,
            headers=end_to_end(resp_headers),
            length=length,
            body=self._body(conn, parser, state, sender, made, keep, no_body),
            chunked=chunked_response,
        )
        made.append(response)
        response._closer = lambda: _abandon(conn, sender)
        return response

    async def _read_head(self, conn: _Conn, head_timeout: float) -> tuple[_ResponseParse, Any]:
        """The parse state once a final (not 1xx) response head arrived."""
        state = _ResponseParse()
        parser = httptools.HttpResponseParser(state)
        state.parser = parser
        loop = asyncio.get_running_loop()
        deadline = loop.time() + head_timeout
        got_bytes = False
        while True:
            try:
                data = await asyncio.wait_for(
                    conn.reader.read(_READ), max(deadline - loop.time(), 0.0)
                )
            except TimeoutError as exc:
                raise UpstreamError("no response head in time") from exc
            except (ConnectionError, OSError) as exc:
                if conn.reused and not got_bytes:
                    raise _StaleConnectionError from exc
                raise UpstreamError(f"backend reset: {exc}") from exc
            if not data:
                if conn.reused and not got_bytes:
                    raise _StaleConnectionError
                raise UpstreamError("backend closed the connection before a response")
            got_bytes = True
            try:
                parser.feed_data(data)
            except httptools.HttpParserError as exc:
                raise UpstreamError(f"backend sent no valid HTTP response ({exc})") from exc
            if state.head_done:
                return state, parser

    async def _body(
        self,
        conn: _Conn,
        parser: Any,
        state: _ResponseParse,
        sender: asyncio.Task[None],
        made: list[Response],
        keep: bool,
        no_body: bool,
    ) -> AsyncIterator[bytes]:
        response = made[0]
        done = no_body
        try:
            while True:
                events, state.events = state.events, []
                for kind, value in events:
                    if kind == "body" and not no_body:
                        response.received += len(value)
                        yield value
                    elif kind == "end":
                        done = True
                if done:
                    break
                try:
                    data = await asyncio.wait_for(conn.reader.read(_READ), self.idle_timeout)
                except TimeoutError as exc:
                    raise UpstreamError("response body stalled") from exc
                except (ConnectionError, OSError) as exc:
                    raise UpstreamError(f"backend reset: {exc}") from exc
                if not data:
                    _check_close_delimited(response)
                    done, keep = True, False
                    continue
                try:
                    parser.feed_data(data)
                except httptools.HttpParserError as exc:
                    raise UpstreamError(f"bad response body ({exc})") from exc
        except BaseException:
            _abandon(conn, sender)
            raise
        if keep and sender.done() and not sender.cancelled() and sender.exception() is None:
            self._release(conn)
        else:
            _abandon(conn, sender)


def _check_close_delimited(response: Response) -> None:
    """A backend's close ends a body only when nothing else frames it (RFC 9112 6.3)."""
    if response.length is not None or response.chunked:
        raise UpstreamError("backend closed the connection mid-response")


class _StaleConnectionError(Exception):
    """A pooled connection turned out closed before the backend saw this request."""


def _retrieve(task: asyncio.Task[None]) -> None:
    """The body sender's failure is the exchange's (said there): not an unretrieved error."""
    if not task.cancelled():
        task.exception()


def _abandon(conn: _Conn, sender: asyncio.Task[None]) -> None:
    sender.cancel()
    conn.writer.abort()


async def _send_body(conn: _Conn, body: Body, chunked: bool) -> None:
    try:
        async for chunk in body.chunks():
            if not chunk:
                continue  # an empty chunk is the end in chunked framing (RFC 9112 7.1)
            if chunked:
                conn.writer.writelines([b"%x\r\n" % len(chunk), chunk, b"\r\n"])
            else:
                conn.writer.write(chunk)
            await conn.writer.drain()
        if chunked:
            conn.writer.write(b"0\r\n\r\n")
        await conn.writer.drain()
    except (ConnectionError, OSError) as exc:
        with contextlib.suppress(Exception):
            conn.writer.abort()
        raise UpstreamError(f"sending the body: {exc}") from exc
