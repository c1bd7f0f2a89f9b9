"""A fleet of node-proxy Delta xDS streams spread over worker processes, for the control-plane
scale benchmark (``bench_scale_controlplane``).

Owns: the worker processes (spawned, each an asyncio loop holding many streams, one gRPC
channel per stream as one ztunnel per node has), each stream subscribing to Address and
Authorization as ztunnel does (wildcard, its Node metadata first), ACKing every response, and
reconnecting at once when its stream ends (to the next address of its list: a second replica);
and the parent's handle on them (``Fleet``): grow, point at other replicas, arm an expectation
(workload uid -> IP), wait until every stream holds it, read per-stream facts.
Time stamps are ``time.monotonic()``, one clock for every process of the machine (Linux
CLOCK_MONOTONIC), so the parent compares its write times with the workers' arrival times.
Invariants: a worker never decodes a body it was not asked about (the full push of 10,000
workloads is counted, not parsed: the client must not be the bottleneck); every worker process
is ended by ``Fleet.close``.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import multiprocessing
import threading
import time
from collections.abc import AsyncIterator, Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from typing import Any

import grpc
import grpc.aio

from meshctl.proto import workload_pb2, xds_pb2, xds_pb2_grpc
from tests.harness.xds_client import ADDRESS, AUTHORIZATION, ztunnel_node

_RECONNECT_DELAY = 0.2  # ztunnel's first backoff step is of this order


class _Token(grpc.AuthMetadataPlugin):
    def __init__(self, token: str) -> None:
        self._headers = (("authorization", f"Bearer {token}"), ("clusterid", "Kubernetes"))

    def __call__(self, context: Any, callback: Any) -> None:
        callback(self._headers, None)


@dataclass(frozen=True, slots=True)
class Target:
    """How to reach the control plane: addresses (replicas, tried in turn) and trust."""

    addresses: tuple[str, ...]
    root_pem: bytes
    token: str
    server_name: str


@dataclass(slots=True)
class _StreamFacts:
    index: int
    connects: int = 0
    connected_at: float = 0.0  # when the current stream was opened
    address_at: float = 0.0  # its first Address response (the full push)
    authz_at: float = 0.0  # its first Authorization response
    full_resources: int = 0
    address_bytes: int = 0  # the full push's sizes (Address, Authorization)
    authz_bytes: int = 0
    # Since the last ``mark``:
    expect: dict[str, bytes] = field(default_factory=dict)
    done: dict[str, float] = field(default_factory=dict)  # uid -> when it held the expected IP
    bytes: int = 0
    responses: int = 0


class _Worker:
    def __init__(self, conn: Connection, target: Target, first_index: int) -> None:
        self.conn = conn
        self.target = target
        self.next_index = first_index
        self.streams: list[_StreamFacts] = []
        self.tasks: list[asyncio.Task[None]] = []
        self.stopping = asyncio.Event()

    def add(self, count: int) -> None:
        for _ in range(count):
            facts = _StreamFacts(index=self.next_index)
            self.next_index += 1
            self.streams.append(facts)
            self.tasks.append(asyncio.ensure_future(self._keep(facts)))

    async def _keep(self, facts: _StreamFacts) -> None:
        attempt = 0
        while not self.stopping.is_set():
            addresses = self.target.addresses
            address = addresses[(facts.index + attempt) % len(addresses)]
            attempt += 1
            with contextlib.suppress(Exception):  # the replica went away: reconnect
                await self._stream(facts, address)
            if not self.stopping.is_set():
                await asyncio.sleep(_RECONNECT_DELAY)

    async def _stream(self, facts: _StreamFacts, address: str) -> None:
        t = self.target
        credentials = grpc.composite_channel_credentials(
            grpc.ssl_channel_credentials(root_certificates=t.root_pem),
            grpc.metadata_call_credentials(_Token(t.token)),
        )
        options = [
            ("grpc.use_local_subchannel_pool", 1),
            ("grpc.ssl_target_name_override", t.server_name),
            ("grpc.max_receive_message_length", -1),
        ]
        outbox: asyncio.Queue[xds_pb2.DeltaDiscoveryRequest] = asyncio.Queue()
        n = facts.index
        node = ztunnel_node(ip=f"10.9.{n // 250}.{n % 250 + 1}", pod=f"ztunnel-{n}")
        outbox.put_nowait(xds_pb2.DeltaDiscoveryRequest(type_url=ADDRESS, node=node))
        outbox.put_nowait(xds_pb2.DeltaDiscoveryRequest(type_url=AUTHORIZATION, node=node))

        async def requests() -> AsyncIterator[xds_pb2.DeltaDiscoveryRequest]:
            while True:
                yield await outbox.get()

        async with grpc.aio.secure_channel(address, credentials, options=options) as channel:
            stub = xds_pb2_grpc.AggregatedDiscoveryServiceStub(channel)
            call = stub.DeltaAggregatedResources(requests())
            facts.connects += 1
            facts.connected_at = time.monotonic()
            facts.address_at = facts.authz_at = 0.0
            async for response in call:
                now = time.monotonic()
                self._arrived(facts, response, now)
                outbox.put_nowait(
                    xds_pb2.DeltaDiscoveryRequest(
                        type_url=response.type_url, response_nonce=response.nonce
                    )
                )

    def _arrived(self, facts: _StreamFacts, response: Any, now: float) -> None:
        size = response.ByteSize()
        facts.bytes += size
        facts.responses += 1
        if response.type_url == AUTHORIZATION:
            if not facts.authz_at:
                facts.authz_at, facts.authz_bytes = now, size
            return
        if not facts.address_at:
            facts.address_at = now
            facts.full_resources = len(response.resources)
            facts.address_bytes = size
        expect = facts.expect
        if not expect:
            return
        for r in response.resources:
            wanted = expect.get(r.name)
            if wanted is None:
                continue
            address = workload_pb2.Address.FromString(r.resource.value)
            if address.WhichOneof("type") == "workload" and (
                bytes(address.workload.addresses[0]) == wanted
            ):
                facts.done.setdefault(r.name, now)
            else:
                facts.done.pop(r.name, None)
        for name in response.removed_resources:
            facts.done.pop(name, None)

    def synced(self, since: float) -> bool:
        return all(s.address_at > since and s.authz_at > since for s in self.streams)

    async def wait_done(self, timeout: float) -> list[tuple[float | None, int, int]]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if all(len(s.done) == len(s.expect) for s in self.streams):
                break
            await asyncio.sleep(0.005)
        return [
            (
                max(s.done.values(), default=0.0) if len(s.done) == len(s.expect) else None,
                s.bytes,
                s.responses,
            )
            for s in self.streams
        ]

    async def serve(self) -> None:
        loop = asyncio.get_running_loop()
        commands: asyncio.Queue[Any] = asyncio.Queue()

        def receive() -> None:  # a thread: a blocking read never stalls the streams
            while True:
                try:
                    command = self.conn.recv()
                except EOFError:
                    command = ("stop",)
                loop.call_soon_threadsafe(commands.put_nowait, command)
                if command[0] == "stop":
                    return

        threading.Thread(target=receive, daemon=True).start()
        while True:
            command, *args = await commands.get()
            if command == "add":
                self.add(args[0])
                self.conn.send(len(self.streams))
            elif command == "addresses":
                self.target = Target(tuple(args[0]), *self._trust())
                self.conn.send(True)
            elif command == "facts":
                self.conn.send([_public(s) for s in self.streams])
            elif command == "mark":
                expect = {uid: ipaddress.ip_address(ip).packed for uid, ip in args[0].items()}
                for s in self.streams:
                    s.expect, s.done, s.bytes, s.responses = dict(expect), {}, 0, 0
                self.conn.send(True)
            elif command == "wait":
                self.conn.send(await self.wait_done(args[0]))
            elif command == "stop":
                self.stopping.set()
                for task in self.tasks:
                    task.cancel()
                await asyncio.gather(*self.tasks, return_exceptions=True)
                self.conn.send(True)
                return

    def _trust(self) -> tuple[bytes, str, str]:
        return self.target.root_pem, self.target.token, self.target.server_name


def _public(s: _StreamFacts) -> dict[str, float]:
    return {
        "connects": s.connects,
        "connected_at": s.connected_at,
        "address_at": s.address_at,
        "authz_at": s.authz_at,
        "full_resources": s.full_resources,
        "full_bytes": s.address_bytes + s.authz_bytes,
    }


def worker_main(conn: Connection, target: Target, first_index: int) -> None:
    """A worker process: serves the parent's commands until ``stop``."""
    # Calls cut by a killed replica or by ``stop`` leave grpc.aio's request tasks behind:
    # expected here, not worth a line on the benchmark's output.
    logging.getLogger("asyncio").setLevel(logging.CRITICAL)

    async def serve() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
        await _Worker(conn, target, first_index).serve()

    asyncio.run(serve())


class Fleet:
    """The parent's handle: ``workers`` processes sharing the streams round-robin."""

    def __init__(self, target: Target, workers: int) -> None:
        context = multiprocessing.get_context("spawn")  # no inherited gRPC state
        self._conns: list[Connection] = []
        self._procs: list[Any] = []
        for w in range(workers):
            parent, child = context.Pipe()
            proc = context.Process(
                target=worker_main, args=(child, target, w * 10_000), daemon=True
            )
            proc.start()
            self._conns.append(parent)
            self._procs.append(proc)
        self.size = 0

    def _all(self, *command: Any) -> list[Any]:
        for conn in self._conns:
            conn.send(command)
        return [conn.recv() for conn in self._conns]

    def grow(self, total: int) -> None:
        """Adds streams until the fleet has ``total`` (spread evenly over the workers)."""
        add = total - self.size
        share = [
            add // len(self._conns) + (1 if w < add % len(self._conns) else 0)
            for w in range(len(self._conns))
        ]
        for conn, n in zip(self._conns, share, strict=True):
            conn.send(("add", n))
        for conn in self._conns:
            conn.recv()
        self.size = total

    def point_at(self, addresses: Sequence[str]) -> None:
        self._all("addresses", list(addresses))

    def facts(self) -> list[dict[str, float]]:
        return [f for part in self._all("facts") for f in part]

    def wait_synced(self, since: float, timeout: float) -> list[dict[str, float]]:
        """Until every stream got its first Address and Authorization after ``since``."""
        deadline = time.monotonic() + timeout
        while True:
            facts = self.facts()
            if all(f["address_at"] > since and f["authz_at"] > since for f in facts):
                return facts
            if time.monotonic() > deadline:
                late = sum(1 for f in facts if not (f["address_at"] > since and f["authz_at"]))
                raise TimeoutError(f"{late} of {len(facts)} streams not synced in {timeout} s")
            time.sleep(0.05)

    def mark(self, expect: Mapping[str, str]) -> None:
        """From now on, each stream is done once it holds every ``uid`` at its ``ip``."""
        self._all("mark", dict(expect))

    def wait(self, timeout: float) -> list[tuple[float | None, int, int]]:
        """Per stream: when it held the last expected IP (None: not within ``timeout``),
        bytes and responses received since ``mark``."""
        return [row for part in self._all("wait", timeout) for row in part]

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self._all("stop")
        for proc in self._procs:
            proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join()
