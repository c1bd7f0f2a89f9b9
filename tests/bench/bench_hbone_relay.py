"""Benchmark: CPU per 1 KiB round trip through both HBONE shells in one process, beside the apps.

Run from the repository root: python -m tests.bench.bench_hbone_relay [--rounds N] [--smoke]

What ``bench_hbone``'s latency test sends, without its processes: a client app, an
``AppStream`` and a client ``TunnelProtocol``, TLS 1.3 over a loopback TCP connection, a server
``TunnelProtocol`` and ``AppStream``, and an echo app, all on one uvloop (the apps are raw
socket callbacks). Four relays per round trip, as through two sidecars. Printed beside it, in
the same run: the same tunnel without TLS (what uvloop's TLS transport and OpenSSL cost per
round trip) and the two apps talking directly (the floor). The difference between these
figures and ``bench_hbone``'s proxy CPU per round trip is what running the relays as separate
processes costs (a wake-up, a context switch and cold caches per relay: docs/ztunnel.md,
"Per message: where the time goes"). Each figure is the median of ``--repeat`` runs.
``--smoke``: a few round trips, checks only that every figure was produced (CI).
Not part of the test suite: figures, not a gate.
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import statistics
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.smoke import figures_produced

PAYLOAD = b"x" * 1024


def _tcp_pair() -> tuple[socket.socket, socket.socket]:
    with socket.create_server(("127.0.0.1", 0)) as listener:
        a = socket.create_connection(listener.getsockname())
        b, _ = listener.accept()
    for s in (a, b):
        s.setblocking(False)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return a, b


def _contexts() -> Any:
    from meshctl.core.pki import certs
    from meshctl.core.pki.identity import SpiffeId
    from meshctl.core.wire.channel import Certs
    from meshctl.proxy import tls

    now = datetime.now(UTC)
    root = certs.mint_root(trust_domain="cluster.local", now=now, ttl=timedelta(hours=1))
    leaf = certs.mint_workload(
        root, SpiffeId("cluster.local", "default", "bench"), now=now, ttl=timedelta(hours=1)
    )
    chain, key, roots = leaf.cert_pem.decode(), leaf.key_pem.decode(), root.cert_pem.decode()
    return tls.build(Certs(cert_chain=chain, key=key, roots=roots))


async def _ping_pong(client_app: socket.socket, server_app: socket.socket, rounds: int) -> float:
    """CPU seconds per round trip: the client sends 1 KiB, the echo app returns it, ``rounds``."""
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    state = {"got": 0, "n": 0}

    def echo() -> None:
        try:
            data = server_app.recv(65536)
        except BlockingIOError:
            return
        server_app.send(data)

    def reply() -> None:
        try:
            state["got"] += len(client_app.recv(65536))
        except BlockingIOError:
            return
        if state["got"] >= len(PAYLOAD):
            state["got"] -= len(PAYLOAD)
            state["n"] += 1
            if state["n"] >= rounds:
                done.set_result(None)
            else:
                client_app.send(PAYLOAD)

    loop.add_reader(server_app.fileno(), echo)
    loop.add_reader(client_app.fileno(), reply)
    start = time.process_time()
    client_app.send(PAYLOAD)
    await done
    took = time.process_time() - start
    loop.remove_reader(server_app.fileno())
    loop.remove_reader(client_app.fileno())
    return took / rounds


async def _through_shells(rounds: int, *, with_tls: bool) -> float:
    from meshctl.core.wire.hbone import TunnelRequested, TunnelSettings
    from meshctl.proxy.relay import AppStream
    from meshctl.proxy.tunnel import TunnelProtocol

    loop = asyncio.get_running_loop()
    contexts = _contexts() if with_tls else None
    settings = TunnelSettings()
    tunnel_a, tunnel_b = _tcp_pair()
    client_app, client_side = _tcp_pair()
    server_app, server_side = _tcp_pair()

    def on_request(proto: TunnelProtocol, ev: TunnelRequested) -> None:
        app = AppStream()
        proto.attach(ev.stream_id, app)
        app.bind(proto, ev.stream_id)

        async def deliver() -> None:
            await loop.create_connection(lambda: app, sock=server_side)
            proto.respond(ev.stream_id, 200)

        asyncio.ensure_future(deliver())  # noqa: RUF006 (awaited through the 200 below)

    server_tls: dict[str, Any] = {"ssl": contexts.server} if contexts else {}
    client_tls: dict[str, Any] = {"ssl": contexts.client, "server_hostname": ""} if contexts else {}
    _, (_, client) = await asyncio.gather(
        loop.connect_accepted_socket(
            lambda: TunnelProtocol(client=False, settings=settings, on_request=on_request),
            tunnel_b,
            **server_tls,
        ),
        loop.create_connection(
            lambda: TunnelProtocol(client=True, settings=settings), sock=tunnel_a, **client_tls
        ),
    )
    await client.connected
    app = AppStream()
    sid = client.open("10.0.0.2:80", [("forwarded", 'for="10.0.0.1:40000"')], app)
    app.bind(client, sid)
    await loop.create_connection(lambda: app, sock=client_side)
    await _ping_pong(client_app, server_app, max(10, rounds // 10))  # warm up
    return await _ping_pong(client_app, server_app, rounds)


async def _direct(rounds: int) -> float:
    client_app, server_app = _tcp_pair()
    return await _ping_pong(client_app, server_app, rounds)


def _median_us(fn: Any, repeat: int) -> float:
    import uvloop

    return statistics.median(uvloop.run(fn()) for _ in range(repeat)) * 1e6


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20_000)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--smoke", action="store_true", help="tiny runs: are figures produced?")
    args = parser.parse_args()
    if args.smoke:
        args.rounds, args.repeat = 200, 1
    n = args.rounds
    figures = {
        "shells with TLS us/rt": _median_us(lambda: _through_shells(n, with_tls=True), args.repeat),
        "shells without TLS us/rt": _median_us(
            lambda: _through_shells(n, with_tls=False), args.repeat
        ),
        "apps alone us/rt": _median_us(lambda: _direct(n), args.repeat),
    }
    tls_, plain, floor = figures.values()
    print(f"HBONE shells in one process: {n} round trips of 1 KiB, median of {args.repeat}")
    print(f"  through both shells, TLS 1.3   {tls_:6.1f} CPU-us per round trip")
    print(f"  through both shells, no TLS    {plain:6.1f}  (TLS costs {tls_ - plain:.1f})")
    print(f"  the apps alone (baseline)      {floor:6.1f}  (four relays cost {tls_ - floor:.1f})")
    return figures_produced(figures) if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
