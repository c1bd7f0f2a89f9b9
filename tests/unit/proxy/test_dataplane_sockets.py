"""The data plane's socket plumbing on loopback: dialling without a resolver, accepting in
batches, and handing a socket to a transport without ever closing its descriptor twice."""

from __future__ import annotations

import asyncio
import errno
import gc
import socket

import pytest
import uvloop

from meshctl.proxy.relay import Accepted, accept_loop, adopt, connect


class _AbortsAtOnce(asyncio.Protocol):
    """A protocol that gives up in ``connection_made`` (a stream reset while we dialled)."""

    lost = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        transport.abort()

    def connection_lost(self, exc: Exception | None) -> None:
        self.lost = True


def _listener() -> socket.socket:
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(256)  # room for every client of the batch test before it accepts
    return srv


async def _dialled(srv: socket.socket) -> socket.socket:
    sock = socket.socket()
    sock.setblocking(False)
    await connect(sock, srv.getsockname(), timeout=5)
    return sock


def test_a_transport_closed_in_connection_made_never_closes_a_reused_descriptor_again():
    async def main() -> None:
        with _listener() as srv:
            sock = await _dialled(srv)
            number = sock.fileno()
            proto = _AbortsAtOnce()
            await adopt(sock, proto)
            await asyncio.sleep(0.01)
            assert proto.lost
            # The transport closed the descriptor; the next socket gets the same number.
            with socket.socket() as bystander:
                assert bystander.fileno() == number
                del sock
                gc.collect()  # a socket object still holding the number would close it now
                bystander.getsockname()  # EBADF if its descriptor was closed behind its back

    uvloop.run(main())


def test_a_handed_over_socket_belongs_to_its_transport():
    async def main() -> bytes:
        with _listener() as srv:
            sock = await _dialled(srv)
            got: asyncio.Future[bytes] = asyncio.get_running_loop().create_future()

            class Reader(asyncio.Protocol):
                def data_received(self, data: bytes) -> None:
                    got.set_result(data)

            transport = await adopt(sock, Reader())
            assert sock.fileno() == -1  # let go: only the transport closes the descriptor
            peer, _ = srv.accept()
            with peer:
                peer.sendall(b"hello")
                data = await asyncio.wait_for(got, 5)
            transport.close()
            return data

    assert uvloop.run(main()) == b"hello"


def test_connect_reports_a_refused_port_as_the_os_error():
    async def main() -> None:
        with _listener() as srv:
            addr = srv.getsockname()
        with socket.socket() as sock:  # nothing listens on addr any more
            sock.setblocking(False)
            with pytest.raises(ConnectionRefusedError) as caught:
                await connect(sock, addr, timeout=5)
            assert caught.value.errno == errno.ECONNREFUSED

    uvloop.run(main())


def test_accept_loop_takes_every_queued_connection_and_stops_cleanly():
    async def main() -> list[tuple[str, int]]:
        accepted: list[Accepted] = []
        with _listener() as srv:
            clients = [socket.create_connection(srv.getsockname()) for _ in range(100)]
            task = asyncio.ensure_future(accept_loop(srv, accepted.append))
            for _ in range(200):
                if len(accepted) == len(clients):
                    break
                await asyncio.sleep(0.01)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            peers = sorted(a.peer for a in accepted)
            for a in accepted:
                a.sock.close()
            for c in clients:
                assert (c.getsockname()[0], c.getsockname()[1]) in peers
                c.close()
            # The loop's reader is gone with the task: the listener can be watched again.
            asyncio.get_running_loop().add_reader(srv.fileno(), lambda: None)
            asyncio.get_running_loop().remove_reader(srv.fileno())
            return peers

    assert len(uvloop.run(main())) == 100
