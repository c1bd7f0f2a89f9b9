"""The gateway's HTTP/2 client towards gRPC backends (``upstream_h2.H2Pool``) against a real
grpcio server on loopback: calls share one connection, the backend's trailers come back after
the body, a connection idle past the idle timeout is replaced, a refused connect is a
``ConnectError`` (another endpoint may serve)."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest
from meshctl_plugins.gateway.exchange import Body
from meshctl_plugins.gateway.upstream import ConnectError
from meshctl_plugins.gateway.upstream_h2 import H2Pool


@contextlib.contextmanager
def echo_server() -> Iterator[int]:
    def echo(request: bytes, context: grpc.ServicerContext) -> bytes:
        context.set_trailing_metadata((("x-echoed", str(len(request))),))
        return request

    handler = grpc.method_handlers_generic_handler(
        "t.E", {"Echo": grpc.unary_unary_rpc_method_handler(echo)}
    )
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    server.add_generic_rpc_handlers((handler,))
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    try:
        yield port
    finally:
        server.stop(None)


def _frame(payload: bytes) -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload  # gRPC's length-prefixed message


async def _call(
    pool: H2Pool, port: int, payload: bytes
) -> tuple[int, bytes, list[tuple[str, str]]]:
    body = Body(None, bound=0)
    body.put_nowait(_frame(payload))
    body.put_nowait(None)
    response = await pool.request(
        ("127.0.0.1", port),
        method="POST",
        target="/t.E/Echo",
        headers=[("host", "backend"), ("content-type", "application/grpc")],
        body=body,
        head_timeout=5,
    )
    data = b"".join([chunk async for chunk in response.body])
    return response.status, data, response.trailers or []


def test_calls_share_one_connection_and_their_trailers_come_back():
    async def run(port: int) -> None:
        pool = H2Pool()
        try:
            for payload in (b"a", b"bb", b"ccc"):
                status, data, trailers = await _call(pool, port, payload)
                assert (status, data) == (200, _frame(payload))
                assert ("grpc-status", "0") in trailers
                assert ("x-echoed", str(len(payload))) in trailers
            assert pool.opened == 1
        finally:
            pool.close()

    with echo_server() as port:
        asyncio.run(run(port))


def test_a_connection_idle_past_the_timeout_is_replaced():
    async def run(port: int) -> None:
        pool = H2Pool(idle_timeout=0.2)
        try:
            await _call(pool, port, b"x")
            await asyncio.sleep(0.3)
            await _call(pool, port, b"y")
            assert pool.opened == 2
        finally:
            pool.close()

    with echo_server() as port:
        asyncio.run(run(port))


def test_a_refused_connect_is_a_connect_error():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]

    async def run() -> None:
        pool = H2Pool()
        with pytest.raises(ConnectError):
            await _call(pool, port, b"x")

    asyncio.run(run())
