"""An app stream gives back every byte of flow credit it took, however its stream ends.

The connection window is shared by all streams of a pooled HBONE connection: credit a finished
stream kept would be lost to its siblings for good (enough of it stalls the connection, as the
adversarial Node test showed under load). Logic only, with stand-ins for the transport and the
tunnel; the netns adversarial test runs the real thing.
"""

from __future__ import annotations

from typing import Any, cast

from meshctl.proxy.relay import AppStream


class Transport:
    """The parts of ``asyncio.Transport`` an ``AppStream`` uses."""

    def __init__(self) -> None:
        self.written = 0
        self.closing = False

    def write(self, data: bytes) -> None:
        self.written += len(data)

    def is_closing(self) -> bool:
        return self.closing

    def abort(self) -> None:
        self.closing = True

    def close(self) -> None:
        self.closing = True

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        return None


class Tunnel:
    """Records the credit given back and the streams reset."""

    def __init__(self) -> None:
        self.credit = 0
        self.resets: list[int] = []

    def consumed(self, sid: int, flow: int) -> None:
        self.credit += flow

    def reset(self, sid: int) -> None:
        self.resets.append(sid)

    def finished(self, sid: int) -> None:
        return None

    def send(self, sid: int, data: bytes, source: Any) -> None:
        return None

    def end(self, sid: int) -> None:
        return None


def stream(*, connected: bool = True) -> tuple[AppStream, Tunnel]:
    app, tunnel = AppStream(), Tunnel()
    app.bind(cast(Any, tunnel), 1)
    if connected:
        app.connection_made(cast(Any, Transport()))
    return app, tunnel


def test_credit_goes_back_at_once_while_the_app_socket_takes_bytes():
    app, tunnel = stream()
    app.tunnel_data(b"x" * 100, 109)  # padding counts: the flow, not the length
    assert tunnel.credit == 109


def test_credit_held_for_a_full_app_socket_goes_back_when_the_peer_resets_the_stream():
    app, tunnel = stream()
    app.pause_writing()
    app.tunnel_data(b"x" * 100, 100)
    app.tunnel_data(b"y" * 50, 50)
    assert tunnel.credit == 0  # backpressure: the app is slow
    app.tunnel_reset("stream reset (code 8)")
    assert tunnel.credit == 150


def test_credit_of_bytes_that_came_before_the_app_socket_goes_back_on_a_reset():
    app, tunnel = stream(connected=False)
    app.tunnel_data(b"x" * 70, 70)
    app.tunnel_reset("stream reset (code 8)")
    assert tunnel.credit == 70


def test_credit_held_when_the_app_goes_away_goes_back_before_the_stream_is_reset():
    app, tunnel = stream()
    app.pause_writing()
    app.tunnel_data(b"x" * 100, 100)
    app.connection_lost(ConnectionResetError())
    assert tunnel.credit == 100
    assert tunnel.resets == [1]


def test_credit_is_never_given_back_twice():
    app, tunnel = stream()
    app.pause_writing()
    app.tunnel_data(b"x" * 100, 100)
    app.resume_writing()
    app.connection_lost(None)
    assert tunnel.credit == 100
