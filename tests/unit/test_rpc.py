"""The gRPC adapter over real TLS on loopback: auth headers, certificate swap, limits, bad peers."""

from __future__ import annotations

import asyncio
import socket
import time
from pathlib import Path
from typing import Any

import grpc
import pytest

from meshctl import rpc
from meshctl.errors import PortInUseError
from meshctl.proto import citadel_pb2, citadel_pb2_grpc
from tests.harness.kube import CertificateAuthority


class EchoCA(citadel_pb2_grpc.IstioCertificateServiceServicer):
    """Answers with the caller's headers as the 'chain', so the test sees what was sent."""

    async def CreateCertificate(  # noqa: N802 (gRPC method name)
        self, request: citadel_pb2.IstioCertificateRequest, context: Any
    ) -> citadel_pb2.IstioCertificateResponse:
        headers = dict(context.invocation_metadata())
        return citadel_pb2.IstioCertificateResponse(
            cert_chain=[headers.get("authorization", "-"), headers.get("clusterid", "-")]
        )


def serving(ca: CertificateAuthority) -> rpc.KeyPair:
    pair = ca.issue("ca.test", ip_sans=["127.0.0.1"], dns_sans=["ca.test"], server=True)
    return rpc.KeyPair(cert_chain_pem=pair.cert_pem, key_pem=pair.key_pem)


async def started(pair: rpc.KeyPair, **kwargs: Any) -> tuple[rpc.Server, int]:
    server = rpc.Server(pair, **kwargs)
    server.add(citadel_pb2_grpc.add_IstioCertificateServiceServicer_to_server, EchoCA())
    port = server.listen("127.0.0.1:0")
    await server.start()
    return server, port


async def call(channel: grpc.aio.Channel, csr: str = "csr") -> list[str]:
    stub = citadel_pb2_grpc.IstioCertificateServiceStub(channel)
    response = await stub.CreateCertificate(citadel_pb2.IstioCertificateRequest(csr=csr), timeout=5)
    return list(response.cert_chain)


def run(coro: Any) -> Any:
    return asyncio.run(coro)


def test_token_file_is_read_on_every_call_and_sent_with_the_cluster_id(tmp_path: Path) -> None:
    ca = CertificateAuthority("rpc-a")
    token = tmp_path / "istio-token"
    token.write_text("first\n")

    async def scenario() -> tuple[list[str], list[str]]:
        server, port = await started(serving(ca))
        auth = rpc.CallAuth(token_file=token, cluster_id="c1")
        async with rpc.connect(f"127.0.0.1:{port}", root_pem=ca.cert_pem, auth=auth) as channel:
            first = await call(channel)
            token.write_text("second")
            second = await call(channel)
        await server.stop(0)
        return first, second

    first, second = run(scenario())
    assert first == ["Bearer first", "c1"]
    assert second == ["Bearer second", "c1"]


def test_missing_token_file_fails_the_call_and_names_the_path(
    tmp_path: Path,
) -> None:
    ca = CertificateAuthority("rpc-a")
    missing = tmp_path / "nope"

    async def scenario() -> grpc.aio.AioRpcError:
        server, port = await started(serving(ca))
        auth = rpc.CallAuth(token_file=missing)
        async with rpc.connect(f"127.0.0.1:{port}", root_pem=ca.cert_pem, auth=auth) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(channel)
        await server.stop(0)
        return caught.value

    error = run(scenario())
    # grpcio reports a failed credentials plugin as UNAVAILABLE; the message carries ours.
    assert error.code() == grpc.StatusCode.UNAVAILABLE
    assert f"cannot read the service-account token {missing}" in (error.details() or "")


def test_swapped_key_pair_serves_new_handshakes() -> None:
    ca_a, ca_b = CertificateAuthority("rpc-a"), CertificateAuthority("rpc-b")

    async def scenario() -> tuple[grpc.StatusCode, list[str]]:
        server, port = await started(serving(ca_a))
        # A client that trusts only B cannot talk to the server while it serves A's pair.
        async with rpc.connect(f"127.0.0.1:{port}", root_pem=ca_b.cert_pem) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(channel)
        server.set_key_pair(serving(ca_b))
        async with rpc.connect(f"127.0.0.1:{port}", root_pem=ca_b.cert_pem) as channel:
            after = await call(channel)
        await server.stop(0)
        return caught.value.code(), after

    before, after = run(scenario())
    assert before == grpc.StatusCode.UNAVAILABLE
    assert after == ["-", "-"]  # no auth configured: no headers sent


def test_alternate_server_name_is_checked_instead_of_the_address() -> None:
    ca = CertificateAuthority("rpc-a")
    pair = ca.issue("only-dns", dns_sans=["istiod.mesh.svc"], server=True)

    async def scenario() -> list[str]:
        server, port = await started(
            rpc.KeyPair(cert_chain_pem=pair.cert_pem, key_pem=pair.key_pem)
        )
        address = f"127.0.0.1:{port}"
        async with rpc.connect(address, root_pem=ca.cert_pem, server_name="istiod.mesh.svc") as ch:
            answer = await call(ch)
        await server.stop(0)
        return answer

    assert run(scenario()) == ["-", "-"]


def test_message_over_the_limit_is_resource_exhausted_and_the_server_keeps_serving() -> None:
    ca = CertificateAuthority("rpc-a")

    async def scenario() -> tuple[grpc.StatusCode, list[str]]:
        server, port = await started(serving(ca), max_message_bytes=64 * 1024)
        async with rpc.connect(f"127.0.0.1:{port}", root_pem=ca.cert_pem) as channel:
            with pytest.raises(grpc.aio.AioRpcError) as caught:
                await call(channel, csr="x" * (128 * 1024))
            after = await call(channel)
        await server.stop(0)
        return caught.value.code(), after

    code, after = run(scenario())
    assert code == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert after == ["-", "-"]


def test_plaintext_client_gets_no_service_and_the_server_keeps_serving() -> None:
    ca = CertificateAuthority("rpc-a")

    async def scenario() -> tuple[bytes, list[str]]:
        server, port = await started(serving(ca))
        loop = asyncio.get_running_loop()

        def plaintext() -> bytes:
            # An HTTP/2 preface in the clear: the TLS listener must answer with an alert or close.
            with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
                sock.sendall(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n")
                try:
                    return sock.recv(100)
                except (ConnectionResetError, TimeoutError):
                    return b""

        answer = await loop.run_in_executor(None, plaintext)
        async with rpc.connect(f"127.0.0.1:{port}", root_pem=ca.cert_pem) as channel:
            after = await call(channel)
        await server.stop(0)
        return answer, after

    answer, after = run(scenario())
    # Either nothing or a TLS alert record (content type 21), never an HTTP/2 frame.
    assert answer == b"" or answer[0] == 21
    assert after == ["-", "-"]


def test_listen_on_a_taken_port_is_a_clear_error() -> None:
    ca = CertificateAuthority("rpc-a")

    async def scenario() -> None:
        with socket.socket() as taken:
            taken.bind(("127.0.0.1", 0))
            taken.listen()
            port = taken.getsockname()[1]
            server = rpc.Server(serving(ca))
            with pytest.raises(
                PortInUseError,
                match=f"cannot listen on 127.0.0.1:{port} \\(gRPC\\): the port is already in use",
            ):
                server.listen(f"127.0.0.1:{port}")

    run(scenario())


def test_translate_names_what_where_and_status() -> None:
    ca = CertificateAuthority("rpc-a")

    async def scenario() -> rpc.RpcError:
        with socket.socket() as unused:
            unused.bind(("127.0.0.1", 0))
            port = unused.getsockname()[1]
        address = f"127.0.0.1:{port}"
        async with rpc.connect(address, root_pem=ca.cert_pem) as channel:
            try:
                await call(channel)
            except grpc.aio.AioRpcError as exc:
                return rpc.translate(exc, what="CreateCertificate", address=address)
        raise AssertionError("the call to a closed port succeeded")

    error = run(scenario())
    assert error.code == "UNAVAILABLE"
    assert error.message.startswith("CreateCertificate at 127.0.0.1:")
    assert "\n" not in error.message
    assert error.hint is not None
    assert "reachable" in error.hint


class BusyCA(citadel_pb2_grpc.IstioCertificateServiceServicer):
    """Holds the event loop a moment per call, as signing does: calls queue in grpc meanwhile."""

    async def CreateCertificate(  # noqa: N802 (gRPC method name)
        self, request: citadel_pb2.IstioCertificateRequest, context: Any
    ) -> citadel_pb2.IstioCertificateResponse:
        time.sleep(0.001)  # the point: a busy loop, as a CPU-bound signer makes it
        return citadel_pb2.IstioCertificateResponse(cert_chain=["leaf"])


def test_a_burst_of_calls_beyond_grpcs_default_backlog_is_queued_not_cancelled() -> None:
    """2,000 calls at once (pods starting together) while the server is busy: grpc's defaults
    cancel calls at random once 1,000 wait unanswered; every one of them must be served."""
    ca = CertificateAuthority("rpc-burst")

    async def scenario() -> list[str]:
        server = rpc.Server(serving(ca))
        server.add(citadel_pb2_grpc.add_IstioCertificateServiceServicer_to_server, BusyCA())
        port = server.listen("127.0.0.1:0")
        await server.start()
        channels = [
            rpc.connect(f"127.0.0.1:{port}", root_pem=ca.cert_pem, server_name="ca.test")
            for _ in range(25)
        ]
        await asyncio.gather(*(ch.channel_ready() for ch in channels))

        async def one(i: int) -> str:
            stub = citadel_pb2_grpc.IstioCertificateServiceStub(channels[i % len(channels)])
            try:
                await stub.CreateCertificate(citadel_pb2.IstioCertificateRequest(), timeout=120)
            except grpc.aio.AioRpcError as exc:
                return exc.code().name
            return "OK"

        try:
            return await asyncio.gather(*(one(i) for i in range(2000)))
        finally:
            for ch in channels:
                await ch.close()
            await server.stop(0)

    codes = run(scenario())
    assert {c: codes.count(c) for c in set(codes)} == {"OK": 2000}
