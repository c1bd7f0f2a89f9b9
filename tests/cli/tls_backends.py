"""TLS backends for the passthrough tests: any number of names, each served on its own loopback
port with its own self-signed certificate, by one asyncio loop in one thread (a hundred backends
cost one thread, and stop at once).

A connection's protocol: the client sends ``UP DOWN\\n`` then UP bytes; the backend sends DOWN
pattern bytes while it reads (both ways at once), then ``NAME ALPN SHA256\\n``: its name, the
ALPN protocol the handshake chose (``-`` none) and the digest of the UP bytes it read.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import ssl
import threading
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.harness import gateway as gw

ALPN = ("x-meshctl-test", "http/1.1")  # what the backends accept, in their order


def pattern(n: int, seed: int) -> bytes:
    block = bytes((i * 7 + seed) % 256 for i in range(4096))
    return (block * (n // len(block) + 1))[:n]


@dataclass
class TlsBackend:
    name: str  # the SNI it serves and the name it answers
    port: int
    cert: bytes  # its certificate (PEM): the only one a client of it trusts
    der: bytes  # the same, DER: what the client must see as the peer's
    seen: list[int] = field(default_factory=list)  # UP byte counts of the exchanges it served


async def _exchange(backend: TlsBackend, reader: Any, writer: Any) -> None:
    with contextlib.suppress(ConnectionError, OSError, ssl.SSLError, ValueError):
        head = await reader.readline()
        up, down = (int(x) for x in head.split())
        digest = hashlib.sha256()

        async def read_up() -> None:
            left = up
            while left:
                chunk = await reader.read(min(left, 65536))
                if not chunk:
                    raise ConnectionError("the client stopped early")
                digest.update(chunk)
                left -= len(chunk)

        async def write_down() -> None:
            data = pattern(down, seed=len(backend.name))
            for at in range(0, len(data), 65536):
                writer.write(data[at : at + 65536])
                await writer.drain()

        await asyncio.gather(read_up(), write_down())
        backend.seen.append(up)
        alpn = writer.get_extra_info("ssl_object").selected_alpn_protocol() or "-"
        writer.write(f"{backend.name} {alpn} {digest.hexdigest()}\n".encode())
        await writer.drain()
    with contextlib.suppress(ConnectionError, OSError, ssl.SSLError):
        writer.close()
        await writer.wait_closed()


@contextlib.contextmanager
def tls_backends(names: Sequence[str], tmp: Path) -> Iterator[dict[str, TlsBackend]]:
    """A backend per name, each its own certificate and port; stopped on exit."""
    from cryptography import x509
    from cryptography.hazmat.primitives.serialization import Encoding

    loop = asyncio.new_event_loop()
    backends: dict[str, TlsBackend] = {}
    servers: list[asyncio.Server] = []

    async def start() -> None:
        for name in names:
            chain, key = gw.server_cert(name, label=f"backend {name}")
            crt, pem = tmp / f"{name}.crt", tmp / f"{name}.key"
            crt.write_bytes(chain)
            pem.write_bytes(key)
            ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            ctx.load_cert_chain(crt, pem)
            ctx.set_alpn_protocols(list(ALPN))
            der = x509.load_pem_x509_certificate(chain).public_bytes(Encoding.DER)
            backend = TlsBackend(name, 0, chain, der)

            def handler(r: Any, w: Any, b: TlsBackend = backend) -> Any:
                return _exchange(b, r, w)

            server = await asyncio.start_server(handler, "127.0.0.1", 0, ssl=ctx, backlog=256)
            backend.port = server.sockets[0].getsockname()[1]
            backends[name] = backend
            servers.append(server)

    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    asyncio.run_coroutine_threadsafe(start(), loop).result(60)
    try:
        yield backends
    finally:

        async def stop() -> None:
            for server in servers:
                server.close()

        asyncio.run_coroutine_threadsafe(stop(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def gateway_objects(backends: dict[str, TlsBackend], port: int = 443) -> list[dict[str, Any]]:
    """A Gateway with one TLS passthrough listener, a TLSRoute per backend for its own name, the
    backends' Services and EndpointSlices. No Secret: the gateway holds no certificate."""
    objects = [
        gw.gateway_class(),
        gw.gateway(
            {
                "name": "tls",
                "port": port,
                "protocol": "TLS",
                "tls": {"mode": "Passthrough"},
                "allowedRoutes": {"namespaces": {"from": "All"}},
            }
        ),
    ]
    for i, backend in enumerate(backends.values()):
        service = f"b{i}"
        objects += [
            {
                "apiVersion": "gateway.networking.k8s.io/v1",
                "kind": "TLSRoute",
                "metadata": {
                    "name": service,
                    "namespace": "app",
                    "creationTimestamp": "2026-01-01T00:00:00Z",
                },
                "spec": {
                    "parentRefs": [{"name": "gw", "namespace": "infra", "sectionName": "tls"}],
                    "hostnames": [backend.name],
                    "rules": [{"backendRefs": [{"name": service, "port": 443}]}],
                },
            },
            gw.service(service, ports=(443,)),
            gw.endpoint_slice(service, [("127.0.0.1", True)], backend.port, service_port=443),
        ]
    return objects


def client_context(backend: TlsBackend, alpn: Sequence[str] = ()) -> ssl.SSLContext:
    """Trusts ``backend``'s certificate and nothing else: a completed handshake was with it."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cadata=backend.cert.decode())
    if alpn:
        ctx.set_alpn_protocols(list(alpn))
    return ctx
