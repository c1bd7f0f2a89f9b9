"""The tunnel shell writes what the core queued, and schedules nothing when nothing is queued.

A read that only delivers DATA to its stream (every message of a request/response exchange)
queues no frame: scheduling a write for it cost a loop callback per message for nothing. What
an event's handler queues without flushing itself (the default 400 for a request nobody
serves) must still leave in the same loop iteration.
"""

from __future__ import annotations

import asyncio
from typing import Any

from meshctl.core.wire.hbone import (
    DataReceived,
    HboneConnection,
    TunnelOpened,
    TunnelRefused,
    TunnelRequested,
    TunnelSettings,
)
from meshctl.proxy.tunnel import TunnelProtocol


class Transport:
    """What ``TunnelProtocol`` uses of an asyncio transport: writes are recorded."""

    def __init__(self) -> None:
        self.written: list[bytes] = []

    def write(self, data: bytes) -> None:
        self.written.append(bytes(data))

    def writelines(self, data: list[bytes]) -> None:
        self.written.append(b"".join(data))

    def is_closing(self) -> bool:
        return False

    def get_extra_info(self, name: str) -> Any:
        return None


class Sink:
    def __init__(self) -> None:
        self.data = bytearray()

    def tunnel_opened(self) -> None: ...
    def tunnel_refused(self, status: int) -> None: ...
    def tunnel_data(self, data: bytes | memoryview, flow: int) -> None:
        self.data += data

    def tunnel_ended(self) -> None: ...
    def tunnel_reset(self, reason: str) -> None: ...
    def tunnel_writable(self) -> None: ...


class CountingLoop:
    """The running loop, with its ``call_soon`` calls counted."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.scheduled = 0

    def call_soon(self, callback: Any, *args: Any) -> asyncio.Handle:
        self.scheduled += 1
        return self.loop.call_soon(callback, *args)

    def time(self) -> float:
        return self.loop.time()


def exchange(peer: HboneConnection, proto: TunnelProtocol, transport: Transport) -> list[Any]:
    """Whatever the server shell wrote so far goes to the peer; its events come back."""
    out, transport.written[:] = b"".join(transport.written), []
    return peer.receive(out, 0.0)


async def served_stream() -> tuple[HboneConnection, TunnelProtocol, Transport, Sink, int]:
    sink = Sink()

    def on_request(proto: TunnelProtocol, ev: TunnelRequested) -> None:
        proto.attach(ev.stream_id, sink)
        proto.respond(ev.stream_id, 200)

    proto = TunnelProtocol(client=False, settings=_settings(), on_request=on_request)
    transport = Transport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    peer = HboneConnection(client=True)
    sid = peer.open("10.0.0.2:80")
    proto.data_received(peer.data_to_send())
    await asyncio.sleep(0)  # the coalesced write runs
    assert any(isinstance(ev, TunnelOpened) for ev in exchange(peer, proto, transport))
    return peer, proto, transport, sink, sid


def _settings() -> TunnelSettings:
    return TunnelSettings()


def test_a_read_that_only_delivers_data_schedules_no_write() -> None:
    asyncio.run(_test_a_read_that_only_delivers_data_schedules_no_write())


async def _test_a_read_that_only_delivers_data_schedules_no_write() -> None:
    peer, proto, transport, sink, sid = await served_stream()
    peer.data_to_send()  # the SETTINGS ACK is the peer's business, not this read's
    counting = CountingLoop(asyncio.get_running_loop())
    proto._loop = counting  # type: ignore[assignment]
    for _ in range(3):
        peer.send(sid, b"x" * 1024)
        proto.data_received(peer.data_to_send())
    await asyncio.sleep(0)
    assert bytes(sink.data) == b"x" * 3072
    assert counting.scheduled == 0
    assert transport.written == []


def test_a_frame_queued_by_a_handler_leaves_in_the_same_iteration() -> None:
    asyncio.run(_test_a_frame_queued_by_a_handler_leaves_in_the_same_iteration())


async def _test_a_frame_queued_by_a_handler_leaves_in_the_same_iteration() -> None:
    proto = TunnelProtocol(client=False, settings=_settings())  # nobody serves requests: 400
    transport = Transport()
    proto.connection_made(transport)  # type: ignore[arg-type]
    peer = HboneConnection(client=True)
    peer.open("10.0.0.2:80")
    proto.data_received(peer.data_to_send())
    await asyncio.sleep(0)
    events = exchange(peer, proto, transport)
    assert [ev.status for ev in events if isinstance(ev, TunnelRefused)] == [400]


def test_a_reply_to_data_still_goes_out_coalesced() -> None:
    asyncio.run(_test_a_reply_to_data_still_goes_out_coalesced())


async def _test_a_reply_to_data_still_goes_out_coalesced() -> None:
    peer, proto, transport, _, sid = await served_stream()
    proto.send(sid, b"pong", source=_Source())  # the app answers: one scheduled write
    await asyncio.sleep(0)
    events = exchange(peer, proto, transport)
    got = b"".join(bytes(ev.data) for ev in events if isinstance(ev, DataReceived))
    assert got == b"pong"


class _Source:
    def pause_source(self) -> None: ...
    def resume_source(self) -> None: ...
