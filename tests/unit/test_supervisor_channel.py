"""The supervisor's channel to a data-plane child survives the child's replacement.

A child found dead before the event loop read its end-of-file still has its channel registered
with the loop's selector. Closing that socket under the transport left the selector's record of
the descriptor number behind; the next child's socketpair got the same number, the loop never
watched it, and the new child's hello went unread (a restarted worker hung until the hello
timeout: the ambient node proxy's crashed-worker test saw readiness stall). The channel is now
closed through its transport.
"""

from __future__ import annotations

import asyncio
import sys
import textwrap

from meshctl import process
from meshctl.core.wire import channel

# A data plane that says hello, reads its config and stays until killed.
CHILD = textwrap.dedent(
    """
    import json, os, socket, struct, sys, time
    s = socket.socket(fileno=int(sys.argv[1]))
    body = json.dumps({"v": 2, "type": "hello", "pid": os.getpid(), "versions": [2]}).encode()
    s.sendall(struct.pack(">I", len(body)) + body)
    while s.recv(65536):
        pass
    """
)


class NoFeed(process.Feed):
    def current(self) -> list[channel.Message]:
        return []

    def changes(self) -> list[channel.Message]:
        return []


def _config(_index: int, fds: dict[str, int]) -> channel.ProxyConfig:
    return channel.ProxyConfig(mode="sidecar", workload="ns/name/sa", listeners=fds)


def test_a_child_replaced_before_its_eof_was_read_gets_a_watched_channel():
    async def main() -> None:
        supervisor = process.Supervisor(
            argv=lambda fd: [sys.executable, "-c", CHILD, str(fd)],
            config=_config,
            listeners={},
            feed=NoFeed(),
            drain_deadline=1.0,
            hello_timeout=5.0,
        )
        for _ in range(3):
            child = await supervisor._start(0)
            # Killed and forgotten in one go, as when the exit is seen before the EOF is read:
            # the next child must still be heard (its hello within the timeout).
            supervisor._kill(child)
        last = await supervisor._start(0)
        assert last.fed
        supervisor._kill(last)

    asyncio.run(asyncio.wait_for(main(), 30))
