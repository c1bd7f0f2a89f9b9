"""The inbound side names a handshake the event loop timed out as a timeout, whichever loop."""

from __future__ import annotations

import asyncio
import socket
import ssl

import pytest
import uvloop

from plugins.dataplane.inbound import _loop_timeout


@pytest.mark.parametrize("loop_factory", [asyncio.new_event_loop, uvloop.new_event_loop])
def test_the_loops_own_handshake_timeout_is_recognised(loop_factory):
    # No certificate needed: the client never sends its hello, so the timer is all that runs.
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)

    async def main() -> BaseException:
        loop = asyncio.get_running_loop()
        server_end, client_end = socket.socketpair()
        try:
            await loop.connect_accepted_socket(
                asyncio.Protocol, server_end, ssl=context, ssl_handshake_timeout=0.1
            )
        except (OSError, TimeoutError) as exc:  # as the inbound side catches it
            return exc
        finally:
            client_end.close()
        pytest.fail("a handshake with a silent client completed")

    loop = loop_factory()
    try:
        exc = loop.run_until_complete(main())
    finally:
        loop.close()
    assert _loop_timeout(exc), repr(exc)
    assert not _loop_timeout(ConnectionAbortedError("peer went away"))
    assert not _loop_timeout(ssl.SSLError(1, "bad record"))
