"""The gateway's HTTP/2 front end (RFC 9113) on the h2 library: ALPN ``h2`` over TLS and h2c
with prior knowledge on plaintext ports; each stream a request handed to the forwarder.

Owns the server side of one HTTP/2 connection: streams to ``Inbound`` values (``:authority``,
else Host), request bodies with flow control (window returned as the forwarder takes each
chunk), responses framed within the peer's windows, RST_STREAM when a response breaks off, and
GOAWAY on drain (streams in flight finish). Abuse budgets as the HBONE proxy keeps them (token
buckets: streams the peer resets, SETTINGS/PING frames): exceeding one answers GOAWAY
ENHANCE_YOUR_CALM and closes. Invariant: a stream's failure is that stream's; a protocol error
closes this connection only.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from dataclasses import dataclass
from typing import Any

import h2.config
import h2.connection
import h2.errors
import h2.events
import h2.exceptions
import h2.settings
from hyperframe.frame import GoAwayFrame

from .exchange import Body, Headers, Inbound, end_to_end
from .h2output import H2Output
from .http1 import Limits

log = logging.getLogger(__name__)
PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_READ = 64 * 1024
MAX_STREAMS = 100
RESET_BURST, RESET_RATE = 200, 100.0  # as meshctl.core.wire.hbone's TunnelSettings
CONTROL_BURST, CONTROL_RATE = 200, 100.0


@dataclass(slots=True)
class _Bucket:
    tokens: float
    capacity: float
    rate: float
    stamp: float = 0.0

    def take(self, now: float) -> bool:
        if self.stamp:
            self.tokens = min(self.capacity, self.tokens + (now - self.stamp) * self.rate)
        self.stamp = now
        if self.tokens < 1:
            return False
        self.tokens -= 1
        return True


class _CalmError(Exception):
    pass


class _Stream:
    """One request's response, framed as HEADERS and DATA within the windows."""

    def __init__(self, conn: Http2Connection, stream_id: int, *, head_only: bool) -> None:
        self.conn, self.id, self.head_only = conn, stream_id, head_only
        self._started = False
        self.closed = False
        self.window_open = asyncio.Event()

    @property
    def started(self) -> bool:
        return self._started

    async def start(
        self, status: int, headers: Headers, length: int | None, *, end_stream: bool = False
    ) -> None:
        self._started = True
        out = [(":status", str(status))]
        out.extend((n, v) for n, v in headers if n not in ("content-length",))
        if length is not None and status not in (204, 304) and not end_stream:
            out.append(("content-length", str(length)))
        ended = self.head_only or end_stream
        self.conn.h2.send_headers(self.id, out, end_stream=ended)
        if ended:
            self.closed = True
        await self.conn.flush()

    async def write(self, data: bytes) -> None:
        view = memoryview(data)
        while view and not self.closed:
            h2c = self.conn.h2
            try:
                window = h2c.local_flow_control_window(self.id)
            except h2.exceptions.StreamClosedError as exc:
                raise ConnectionResetError("stream reset by the client") from exc
            if window <= 0:
                self.window_open.clear()
                await self.window_open.wait()
                continue
            size = min(window, h2c.max_outbound_frame_size, len(view))
            h2c.send_data(self.id, view[:size].tobytes())
            view = view[size:]
            await self.conn.flush()
        if self.closed and view:
            raise ConnectionResetError("stream reset by the client")

    async def end(self, trailers: Headers | None = None) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(h2.exceptions.StreamClosedError):
                if trailers:  # RFC 9113 8.1: a HEADERS frame ending the stream
                    self.conn.h2.send_headers(self.id, trailers, end_stream=True)
                else:
                    self.conn.h2.end_stream(self.id)
            await self.conn.flush()

    def abort(self) -> None:
        if not self.closed:
            self.closed = True
            with contextlib.suppress(h2.exceptions.ProtocolError):
                self.conn.h2.reset_stream(self.id, h2.errors.ErrorCodes.INTERNAL_ERROR)
            self.conn.flush_soon()


class Http2Connection(H2Output):
    writer: asyncio.StreamWriter

    def __init__(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        *,
        handler: Any,
        port: int,
        scheme: str,
        sni: str,
        limits: Limits,
        initial: bytes = b"",
    ) -> None:
        self.reader, self.writer = reader, writer
        self.handler, self.port, self.scheme, self.sni = handler, port, scheme, sni
        self.limits = limits
        self.initial = initial
        peer = writer.get_extra_info("peername") or ("", 0)
        self.client = (str(peer[0]), int(peer[1]))
        config = h2.config.H2Configuration(client_side=False, header_encoding="utf-8")
        self.h2 = h2.connection.H2Connection(config=config)
        self.streams: dict[int, tuple[_Stream, Body, asyncio.Task[None]]] = {}
        self.closing = False
        self.resets = _Bucket(RESET_BURST, RESET_BURST, RESET_RATE)
        self.control = _Bucket(CONTROL_BURST, CONTROL_BURST, CONTROL_RATE)

    @property
    def busy(self) -> bool:
        return bool(self.streams)

    async def run(self) -> None:
        self.h2.update_settings(
            {
                h2.settings.SettingCodes.MAX_CONCURRENT_STREAMS: MAX_STREAMS,
                h2.settings.SettingCodes.MAX_HEADER_LIST_SIZE: self.limits.header_bytes,
            }
        )
        self.h2.initiate_connection()
        try:
            await self.flush()
            await self._read_loop()
        except _CalmError as exc:
            log.info("%s: HTTP/2 %s: GOAWAY ENHANCE_YOUR_CALM", self.client[0], exc)
            self.h2.close_connection(h2.errors.ErrorCodes.ENHANCE_YOUR_CALM)
            self.flush_soon()
        except (ConnectionError, OSError):
            pass
        finally:
            for stream, body, task in list(self.streams.values()):
                stream.closed = True
                body.put_nowait(ConnectionResetError("client connection closed"))
                task.cancel()
            self.writer.close()
            with contextlib.suppress(Exception):
                await self.writer.wait_closed()

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        opened = loop.time()
        data, self.initial = self.initial, b""
        while True:
            if data:
                try:
                    events = self.h2.receive_data(data)
                except h2.exceptions.ProtocolError as exc:
                    log.info("%s: HTTP/2 protocol error: %s", self.client[0], exc)
                    self.flush_soon()  # h2 queued its GOAWAY
                    return
                for event in events:
                    self._event(event, loop.time())
                await self.flush()
            if self.closing and not self.streams:
                return
            started = self.h2.state_machine.state != h2.connection.ConnectionState.IDLE
            timeout = (
                self.limits.idle_timeout
                if started or self.streams
                else max(opened + self.limits.header_timeout - loop.time(), 0.0)
            )
            try:
                data = await asyncio.wait_for(self.reader.read(_READ), timeout)
            except TimeoutError:
                if self.streams:
                    continue  # waiting on backends, not on the client
                return
            if not data:
                return

    def _event(self, event: Any, now: float) -> None:  # noqa: PLR0912 (one branch per event)
        if isinstance(event, h2.events.RequestReceived):
            self._request(event)
        elif isinstance(event, h2.events.DataReceived):
            entry = self.streams.get(event.stream_id)
            if entry is not None:
                entry[1].put_nowait(event.data)
            else:
                self.h2.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
            if entry is not None and event.flow_controlled_length > len(event.data):
                # padding counts against the window too; nobody will take it: return it now
                pad = event.flow_controlled_length - len(event.data)
                self.h2.acknowledge_received_data(pad, event.stream_id)
        elif isinstance(event, h2.events.StreamEnded):
            entry = self.streams.get(event.stream_id)
            if entry is not None:
                entry[1].put_nowait(None)
        elif isinstance(event, h2.events.StreamReset):
            if event.remote_reset and not self.resets.take(now):
                raise _CalmError("too many streams reset by the client (rapid reset)")
            entry = self.streams.pop(event.stream_id, None)
            if entry is not None:
                stream, body, task = entry
                stream.closed = True
                stream.window_open.set()
                body.put_nowait(ConnectionResetError("stream reset by the client"))
                task.cancel()
        elif isinstance(event, h2.events.WindowUpdated):
            targets = (
                [s for s, _, _ in self.streams.values()]
                if event.stream_id == 0
                else [e[0] for e in [self.streams.get(event.stream_id)] if e is not None]
            )
            for stream in targets:
                stream.window_open.set()
        elif isinstance(event, h2.events.RemoteSettingsChanged | h2.events.PingReceived):
            if not self.control.take(now):
                raise _CalmError("too many SETTINGS/PING frames")
            for stream, _, _ in self.streams.values():
                stream.window_open.set()  # a larger initial window opens every stream
        elif isinstance(event, h2.events.ConnectionTerminated):
            self.closing = True

    def _request(self, event: h2.events.RequestReceived) -> None:
        if self.closing:  # opened after our GOAWAY: not processed, safe to retry elsewhere
            self.h2.reset_stream(event.stream_id, h2.errors.ErrorCodes.REFUSED_STREAM)
            return
        pseudo: dict[str, str] = {}
        headers: Headers = []
        for name, value in event.headers:
            n, v = str(name), str(value)
            if n.startswith(":"):
                pseudo[n] = v
            else:
                headers.append((n, v))
        cookies = [v for n, v in headers if n == "cookie"]
        if len(cookies) > 1:  # RFC 9113 8.2.3: one field again for HTTP/1.1 upstreams
            headers = [(n, v) for n, v in headers if n != "cookie"] + [
                ("cookie", "; ".join(cookies))
            ]
        authority = pseudo.get(":authority") or next((v for n, v in headers if n == "host"), "")
        lengths = [v for n, v in headers if n == "content-length"]
        limit = self.limits.body_bytes
        if limit and lengths and lengths[0].isdigit() and int(lengths[0]) > limit:
            self.h2.send_headers(
                event.stream_id, [(":status", "413"), ("content-length", "0")], end_stream=True
            )
            return
        ended = event.stream_ended is not None
        sid = event.stream_id
        body = Body(
            int(lengths[0]) if lengths and lengths[0].isdigit() else None,
            empty=ended,
            bound=0,
            taken=lambda n: self._taken(sid, n),
        )
        method = pseudo.get(":method", "GET")
        inbound = Inbound(
            method=method,
            target=pseudo.get(":path", "/"),
            authority=authority,
            headers=[(n, v) for n, v in end_to_end(headers) if n != "host"],
            body=body,
            scheme=self.scheme,
            port=self.port,
            client=self.client,
            protocol="HTTP/2",
            sni=self.sni,
            started=asyncio.get_running_loop().time(),
        )
        stream = _Stream(self, sid, head_only=method == "HEAD")
        task = asyncio.create_task(self._serve(inbound, stream))
        self.streams[sid] = (stream, body, task)

    def _taken(self, stream_id: int, size: int) -> None:
        with contextlib.suppress(h2.exceptions.ProtocolError):
            self.h2.acknowledge_received_data(size, stream_id)
            self.flush_soon()

    async def _serve(self, inbound: Inbound, stream: _Stream) -> None:
        try:
            await self.handler(inbound, stream)
        except (ConnectionError, OSError):
            stream.abort()
        except Exception:
            log.exception("request %s %s failed", inbound.method, inbound.target)
            stream.abort()
        finally:
            self.streams.pop(stream.id, None)
            if self.closing and not self.streams:
                self.reader.feed_eof()

    def drain(self) -> None:
        """GOAWAY: no new streams; those in flight finish, then the connection closes."""
        if self.closing:
            return
        self.closing = True
        # A graceful GOAWAY (RFC 9113 6.8: the last stream we take, NO_ERROR) written beside
        # h2's state, which would refuse the in-flight streams' frames after its own GOAWAY.
        self.flush_soon()
        frame = GoAwayFrame(0)
        frame.last_stream_id = self.h2.highest_inbound_stream_id
        frame.error_code = h2.errors.ErrorCodes.NO_ERROR
        if not self.writer.is_closing():
            self.writer.write(frame.serialize())
        if not self.streams:
            self.reader.feed_eof()
