"""A pod's listeners let go without touching the connection that gets their descriptor next.

The node proxy closes a pod's listeners when its sandbox is replaced; the accept loop's task
was cancelled but runs its cleanup later. If the listener closed first, its number may already
belong to a new connection's transport by then, and removing "its" reader hit that transport
(uvloop: "File descriptor N is used by transport"): an exception in the event loop, seen in CI.
"""

from __future__ import annotations

import asyncio
import socket

import uvloop

from meshctl.proxy.relay import accept_loop, stop_accepting


async def _reuse_after_stop() -> None:
    listener = socket.socket()
    listener.bind(("127.0.0.1", 0))
    listener.listen()
    number = listener.fileno()
    task = asyncio.ensure_future(accept_loop(listener, lambda _accepted: None))
    await asyncio.sleep(0)  # the loop registered its reader
    task.cancel()
    stop_accepting(listener)
    # The freed number goes to the next socket, wrapped in a transport before the task runs.
    left, right = socket.socketpair()
    if left.fileno() != number:
        left, right = right, left
    assert left.fileno() == number
    transport, _ = await asyncio.get_running_loop().connect_accepted_socket(asyncio.Protocol, left)
    try:
        await asyncio.gather(task, return_exceptions=True)
        assert task.cancelled(), task.exception()
        assert not transport.is_closing()
    finally:
        transport.close()
        right.close()


def test_a_stopped_listeners_number_reused_by_a_transport_is_left_alone():
    uvloop.run(_reuse_after_stop())
