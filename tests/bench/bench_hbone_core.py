"""Benchmark: CPU per HBONE tunnel in the sans-IO core, beside the same tunnels through h2.

Run from the repository root: python -m tests.bench.bench_hbone_core [--tunnels N] [--smoke]

Both sides of one HTTP/2 connection live in this process (no sockets, no TLS): the client opens
a CONNECT with the headers our data plane sends, the server answers 200, 1 KiB goes each way,
both half-close, the window is given back; ``--tunnels`` of them one after another on the same
connection, as pooled tunnels are. The baseline is the same exchange between two
``h2.connection.H2Connection`` objects, measured in the same run, so the figure is what framing
HTTP/2 ourselves saves (docs/ztunnel.md: why the HBONE core frames HTTP/2 itself). Each side is
measured ``--repeat`` times; the range is printed (the machine's cores are shared).
``--smoke``: a few tunnels, checks only that every figure was produced (CI).
Not part of the test suite: figures, not a gate.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.smoke import figures_produced

PAYLOAD = b"x" * 1024
AUTHORITY = "10.0.0.2:8080"
HEADERS = [("forwarded", 'for="10.0.0.1:40000"'), ("baggage", "k8s.namespace.name=default")]


class _Side(Protocol):
    def data_to_send(self) -> bytes: ...


def _pump(
    client: _Side,
    server: _Side,
    to_server: Callable[[bytes], None],
    to_client: Callable[[bytes], None],
) -> None:
    """Move bytes between the two sides until both are quiet."""
    while True:
        a, b = client.data_to_send(), server.data_to_send()
        if not a and not b:
            return
        if a:
            to_server(a)
        if b:
            to_client(b)


def ours(tunnels: int) -> float:
    """CPU seconds for ``tunnels`` tunnels through our core (both sides)."""
    from meshctl.core.wire.hbone.connection import HboneConnection
    from meshctl.core.wire.hbone.events import (
        DataReceived,
        StreamEnded,
        TunnelOpened,
        TunnelRequested,
    )

    client, server = HboneConnection(client=True), HboneConnection(client=False)
    moved = 0

    def to_server(data: bytes) -> None:
        for ev in server.receive(data, 0.0):
            if isinstance(ev, TunnelRequested):
                server.respond(ev.stream_id, 200)
            elif isinstance(ev, DataReceived):
                server.consumed(ev.stream_id, ev.flow)
                server.send(ev.stream_id, bytes(ev.data))
            elif isinstance(ev, StreamEnded):
                server.end(ev.stream_id)

    def to_client(data: bytes) -> None:
        nonlocal moved
        for ev in client.receive(data, 0.0):
            if isinstance(ev, TunnelOpened):
                client.send(ev.stream_id, PAYLOAD)
                client.end(ev.stream_id)
            elif isinstance(ev, DataReceived):
                moved += len(ev.data)
                client.consumed(ev.stream_id, ev.flow)

    def pump() -> None:
        _pump(client, server, to_server, to_client)

    pump()  # prefaces and SETTINGS: not per tunnel
    start = time.process_time()
    for _ in range(tunnels):
        client.open(AUTHORITY, HEADERS)
        pump()
    took = time.process_time() - start
    if moved != tunnels * len(PAYLOAD):
        raise RuntimeError(f"our core moved {moved} bytes back, wanted {tunnels * len(PAYLOAD)}")
    return took


def through_h2(tunnels: int) -> float:
    """CPU seconds for the same tunnels between two h2 connections (the baseline)."""
    import h2.config
    import h2.connection
    import h2.events

    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
    client.initiate_connection()
    server.initiate_connection()
    moved = 0

    def to_server(data: bytes) -> None:
        for ev in server.receive_data(data):
            if isinstance(ev, h2.events.RequestReceived):
                server.send_headers(ev.stream_id, [(":status", "200")])
            elif isinstance(ev, h2.events.DataReceived):
                server.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                server.send_data(ev.stream_id, ev.data)
            elif isinstance(ev, h2.events.StreamEnded):
                server.end_stream(ev.stream_id)

    def to_client(data: bytes) -> None:
        nonlocal moved
        for ev in client.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                client.send_data(ev.stream_id, PAYLOAD, end_stream=True)
            elif isinstance(ev, h2.events.DataReceived):
                moved += len(ev.data)
                client.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)

    def pump() -> None:
        _pump(client, server, to_server, to_client)

    request = [(":method", "CONNECT"), (":authority", AUTHORITY), *HEADERS]
    pump()
    start = time.process_time()
    for _ in range(tunnels):
        client.send_headers(client.get_next_available_stream_id(), request)
        pump()
    took = time.process_time() - start
    if moved != tunnels * len(PAYLOAD):
        raise RuntimeError(f"h2 moved {moved} bytes back, wanted {tunnels * len(PAYLOAD)}")
    return took


def _range(fn: Callable[[int], float], tunnels: int, repeat: int) -> tuple[float, float]:
    """(best, worst) CPU-us per tunnel over ``repeat`` runs."""
    runs = [fn(tunnels) / tunnels * 1e6 for _ in range(repeat)]
    return min(runs), max(runs)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tunnels", type=int, default=5000)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--smoke", action="store_true", help="a few tunnels: figures produced?")
    args = parser.parse_args()
    if args.smoke:
        args.tunnels, args.repeat = 50, 1
    # Stream ids run out at 2^31; one connection is plenty for any sane --tunnels.
    lo, hi = _range(ours, args.tunnels, args.repeat)
    base_lo, base_hi = _range(through_h2, args.tunnels, args.repeat)
    print(f"HBONE core: {args.tunnels} tunnels per run, {args.repeat} runs, both sides in-process")
    print(f"{'':28} {'CPU-us per tunnel (best-worst)':32}")
    print(f"{'our core':28} {lo:.0f}-{hi:.0f}")
    print(f"{'h2 (baseline, same run)':28} {base_lo:.0f}-{base_hi:.0f}")
    print(f"{'h2 / ours (best runs)':28} {base_lo / lo:.1f}x")
    figures = {"ours us/tunnel": lo, "h2 us/tunnel": base_lo}
    return figures_produced(figures) if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
