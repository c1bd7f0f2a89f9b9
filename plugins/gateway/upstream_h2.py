"""The gateway's HTTP/2 client towards backends (RFC 9113, h2c with prior knowledge: what gRPC
servers speak in plaintext, and over an HBONE stream to a mesh endpoint): one connection per
endpoint multiplexing the calls to it, request bodies and responses streamed within the flow
control windows, response trailers kept (gRPC's ``grpc-status`` lives there).

Owns the upstream half of gRPC calls (``Forwarder`` sends every gRPC call here, whatever route
kind took it). Invariants: a connection takes new streams only while it has not failed, has not
been told GOAWAY and stays under the backend's MAX_CONCURRENT_STREAMS (else another is opened);
its first failure fails every stream on it with that error; a response ends exactly once (its
body iterator ends, then ``trailers`` is set) or raises ``UpstreamError``; every wait has a
deadline; a response given up on resets its stream (CANCEL).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings

from .exchange import Body, BodyError, Headers, end_to_end
from .h2output import H2Output
from .upstream import ConnectError, Dialer, Response, UpstreamError, Writer, tcp_dialer

log = logging.getLogger(__name__)
_READ = 64 * 1024
_WINDOW = 4 * 1024 * 1024  # our receive window per stream and connection (a gRPC stream's)


@dataclass(slots=True)
class _Call:
    """One stream's state as the connection's reader fills it."""

    head: asyncio.Future[tuple[int, Headers, bool]]
    chunks: asyncio.Queue[bytes | BaseException | None] = field(default_factory=asyncio.Queue)
    trailers: Headers = field(default_factory=list)
    window: asyncio.Event = field(default_factory=asyncio.Event)
    done: bool = False  # ended or reset: nothing more to send or cancel

    def fail(self, exc: BaseException) -> None:
        self.done = True
        self.window.set()
        if not self.head.done():
            self.head.set_exception(exc)
        else:
            self.chunks.put_nowait(exc)


class _Connection(H2Output):
    writer: Writer

    def __init__(self, key: tuple[str, int], reader: asyncio.StreamReader, writer: Writer) -> None:
        self.key = key
        self.reader, self.writer = reader, writer
        config = h2.config.H2Configuration(client_side=True, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config=config)
        self.calls: dict[int, _Call] = {}
        self.error: UpstreamError | None = None
        self.goaway = False
        self.task: asyncio.Task[None] | None = None
        self.used = asyncio.get_running_loop().time()  # when its last call started

    @property
    def usable(self) -> bool:
        if self.error is not None or self.goaway or self.writer.is_closing():
            return False
        return len(self.calls) < self.h2.remote_settings.max_concurrent_streams

    async def start(self) -> None:
        self.h2.local_settings = h2.settings.Settings(
            client=True,
            initial_values={
                h2.settings.SettingCodes.ENABLE_PUSH: 0,
                h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: _WINDOW,
            },
        )
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(_WINDOW)
        await self.flush()
        self.task = asyncio.create_task(self._read_loop())

    def close(self) -> None:
        self._fail(UpstreamError("connection to the backend closed"))
        self.writer.close()
        if self.task is not None:
            self.task.cancel()

    def _fail(self, error: UpstreamError) -> None:
        if self.error is None:
            self.error = error
        for call in self.calls.values():
            call.fail(self.error)
        self.calls.clear()

    async def _read_loop(self) -> None:
        try:
            while True:
                data = await self.reader.read(_READ)
                if not data:
                    self._fail(UpstreamError("backend closed the connection"))
                    return
                try:
                    events = self.h2.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    self.flush_soon()
                    self._fail(UpstreamError(f"backend broke HTTP/2 ({exc})"))
                    self.writer.close()
                    return
                for event in events:
                    self._event(event)
                self.flush_soon()
        except (ConnectionError, OSError) as exc:
            self._fail(UpstreamError(f"backend reset: {exc}"))

    def _event(self, event: Any) -> None:  # noqa: PLR0912 (one branch per event)
        call = self.calls.get(getattr(event, "stream_id", 0) or 0)
        if isinstance(event, h2.events.ResponseReceived):
            if call is not None and not call.head.done():
                status, headers = _split(event.headers)
                ended = event.stream_ended is not None
                call.head.set_result((status, headers, ended))
                if ended:
                    self._end(event.stream_id, call)
        elif isinstance(event, h2.events.DataReceived):
            if call is not None:
                call.chunks.put_nowait(event.data)
                padding = event.flow_controlled_length - len(event.data)
            else:
                padding = event.flow_controlled_length  # nobody reads it: its window back now
            if padding:
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    self.h2.acknowledge_received_data(padding, event.stream_id)
        elif isinstance(event, h2.events.TrailersReceived):
            if call is not None:
                call.trailers = [(str(n), str(v)) for n, v in event.headers]
        elif isinstance(event, h2.events.StreamEnded):
            if call is not None and call.head.done():
                self._end(event.stream_id, call)
        elif isinstance(event, h2.events.StreamReset):
            if call is not None:
                self.calls.pop(event.stream_id, None)
                code = h2.errors.ErrorCodes(event.error_code).name
                call.fail(UpstreamError(f"backend reset the stream ({code})"))
        elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
            # a window (the connection's, or a larger initial one) opened: senders look again
            for each in self.calls.values():
                each.window.set()
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.goaway = True  # streams above last_stream_id were not processed: they fail
            last = event.last_stream_id or 0
            for sid in [s for s in self.calls if s > last]:
                self.calls.pop(sid).fail(UpstreamError("backend sent GOAWAY before the call"))

    def _end(self, stream_id: int, call: _Call) -> None:
        self.calls.pop(stream_id, None)
        call.done = True
        call.window.set()
        call.chunks.put_nowait(None)

    def cancel(self, stream_id: int, call: _Call) -> None:
        self.calls.pop(stream_id, None)
        if not call.done:
            call.done = True
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.h2.reset_stream(stream_id, h2.errors.ErrorCodes.CANCEL)
            self.flush_soon()


def _split(raw: Any) -> tuple[int, Headers]:
    status = 0
    headers: Headers = []
    for name, value in raw:
        n, v = str(name), str(value)
        if n == ":status":
            status = int(v) if v.isdigit() else 0
        elif not n.startswith(":"):
            headers.append((n, v))
    return status, end_to_end(headers)


class H2Pool:
    """HTTP/2 connections to endpoints, one (or more, past a backend's stream limit) each."""

    def __init__(self, *, connect_timeout: float = 5.0, idle_timeout: float = 60.0) -> None:
        self.connect_timeout = connect_timeout
        self.idle_timeout = idle_timeout
        self._conns: dict[tuple[str, int], list[_Connection]] = {}
        self.opened = 0

    async def _acquire(self, key: tuple[str, int], dial: Dialer) -> _Connection:
        now = asyncio.get_running_loop().time()
        conns = []
        for conn in self._conns.get(key, []):
            if conn.error is None and (conn.calls or now - conn.used < self.idle_timeout):
                conns.append(conn)
            else:
                conn.close()  # failed, or idle past the timeout (its endpoint may be gone)
        self._conns[key] = conns
        for conn in conns:
            if conn.usable:
                conn.used = now
                return conn
        try:
            reader, writer = await asyncio.wait_for(dial(*key), self.connect_timeout)
        except TimeoutError as exc:
            raise ConnectError(f"connect to {key[0]}:{key[1]} timed out") from exc
        except OSError as exc:
            raise ConnectError(f"connect to {key[0]}:{key[1]}: {exc.strerror or exc}") from exc
        conn = _Connection(key, reader, writer)
        try:
            await conn.start()
        except (ConnectionError, OSError) as exc:
            writer.close()
            raise ConnectError(f"connect to {key[0]}:{key[1]}: {exc}") from exc
        self.opened += 1
        conns.append(conn)
        return conn

    def close(self) -> None:
        for conns in self._conns.values():
            for conn in conns:
                conn.close()
        self._conns.clear()

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
        """Open a stream to ``key`` (``headers``' ``host`` becomes ``:authority``), send the
        body as it arrives, and return once the response head arrived."""
        conn = await self._acquire(key, dial)
        authority = next((v for n, v in headers if n == "host"), f"{key[0]}:{key[1]}")
        out = [(":method", method), (":scheme", "http"), (":authority", authority)]
        out.append((":path", target))
        out.extend((n, v) for n, v in headers if n not in ("host", "content-length", "te"))
        if body.length is not None:
            out.append(("content-length", str(body.length)))
        out.append(("te", "trailers"))  # RFC 9113 8.2.2: the one TE an HTTP/2 request carries
        stream_id = conn.h2.get_next_available_stream_id()
        call = _Call(head=asyncio.get_running_loop().create_future())
        conn.calls[stream_id] = call
        try:
            conn.h2.send_headers(stream_id, out, end_stream=body.done)
            await conn.flush()
        except (ConnectionError, OSError, h2.exceptions.ProtocolError) as exc:
            conn.calls.pop(stream_id, None)
            conn.close()
            raise ConnectError(f"connection to {key[0]}:{key[1]} failed: {exc}") from exc
        sender = asyncio.create_task(_send_body(conn, stream_id, call, body))
        sender.add_done_callback(_retrieve)
        try:
            status, response_headers, ended = await asyncio.wait_for(call.head, head_timeout)
        except TimeoutError as exc:
            sender.cancel()
            conn.cancel(stream_id, call)
            raise UpstreamError("no response head in time") from exc
        except BaseException:
            sender.cancel()
            conn.cancel(stream_id, call)
            raise
        lengths = [v for n, v in response_headers if n == "content-length"]
        made: list[Response] = []  # the generator reads the response it belongs to
        response = Response(
            status=status,
            headers=response_headers,
            length=0 if ended else (int(lengths[0]) if lengths and lengths[0].isdigit() else None),
            body=_empty() if ended else self._body(conn, stream_id, call, sender, made),
            ended=ended,
        )
        made.append(response)

        def give_up() -> None:
            sender.cancel()
            conn.cancel(stream_id, call)

        response._closer = give_up
        return response

    async def _body(
        self,
        conn: _Connection,
        stream_id: int,
        call: _Call,
        sender: asyncio.Task[None],
        made: list[Response],
    ) -> AsyncIterator[bytes]:
        response = made[0]
        try:
            while True:
                try:
                    item = await asyncio.wait_for(call.chunks.get(), self.idle_timeout)
                except TimeoutError as exc:
                    raise UpstreamError("response body stalled") from exc
                if item is None:
                    break
                if isinstance(item, BaseException):
                    raise item  # noqa: TRY301 (the connection's failure, as this stream's)
                response.received += len(item)
                with contextlib.suppress(h2.exceptions.ProtocolError):
                    conn.h2.acknowledge_received_data(len(item), stream_id)
                    conn.flush_soon()
                yield item
            response.trailers = call.trailers
        except BaseException:
            sender.cancel()
            conn.cancel(stream_id, call)
            raise


async def _empty() -> AsyncIterator[bytes]:
    nothing: tuple[bytes, ...] = ()  # an async generator without a chunk (trailers-only)
    for chunk in nothing:
        yield chunk


def _retrieve(task: asyncio.Task[None]) -> None:
    if not task.cancelled():
        task.exception()


async def _send_body(conn: _Connection, stream_id: int, call: _Call, body: Body) -> None:
    """The request body onto the stream within its windows, then END_STREAM. A client that
    breaks off its body resets the stream; a backend that already answered whole ends it."""
    if body.done:
        return
    try:
        async for chunk in body.chunks():
            view = memoryview(chunk)
            while view and not call.done:
                window = conn.h2.local_flow_control_window(stream_id)
                if window <= 0:
                    call.window.clear()
                    await call.window.wait()
                    continue
                size = min(window, conn.h2.max_outbound_frame_size, len(view))
                conn.h2.send_data(stream_id, view[:size].tobytes())
                view = view[size:]
                await conn.flush()
        if not call.done:
            conn.h2.end_stream(stream_id)
            await conn.flush()
    except BodyError:
        conn.cancel(stream_id, call)
    except h2.exceptions.StreamClosedError:
        pass  # the backend ended or reset the stream first: its response says what happened
    except (ConnectionError, OSError, h2.exceptions.ProtocolError) as exc:
        call.fail(UpstreamError(f"sending the body: {exc}"))
