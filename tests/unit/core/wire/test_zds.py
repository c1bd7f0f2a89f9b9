"""ZDS: the node proxy's rules per request, and the codec against Istio's bytes."""

from __future__ import annotations

import asyncio
import os
import socket
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.wire import zds
from meshctl.net import zds as wire

INFO = zds.WorkloadInfo("web", "shop", "web-sa")


def test_snapshot_removes_exactly_the_pods_neither_added_nor_kept():
    session = zds.ProxySession()
    running = {"a", "b", "c", "d"}
    assert session.receive(zds.Add("a", INFO), 1, running=running).action == "add"
    assert session.receive(zds.Keep("b"), 0, running=running).action == "keep"
    assert session.receive(zds.Add("e", INFO), 1, running=running).action == "add"
    # A delete before the snapshot takes the pod out of it again.
    assert session.receive(zds.Delete("e"), 0, running=running).action == "delete"
    verdict = session.receive(zds.SnapshotSent(), 0, running=running | {"e"})
    assert verdict.action == "snapshot"
    assert verdict.remove == {"c", "d", "e"}
    assert session.snapshot_done


@pytest.mark.parametrize(
    ("request_", "fds", "fault"),
    [
        (zds.Add("a", INFO), 0, zds.Fault.RECONNECT),  # add needs its netns
        (zds.Add("a", INFO), 2, zds.Fault.RECONNECT),  # exactly one
        (zds.Delete("a"), 1, zds.Fault.RECONNECT),  # nothing else carries one
        (zds.SnapshotSent(), 1, zds.Fault.RECONNECT),
        (zds.Add("a", None), 1, zds.Fault.STOP),  # ProtocolError: workload_info required
    ],
)
def test_bad_requests_end_the_connection_or_the_manager(request_, fds, fault):
    verdict = zds.ProxySession().receive(request_, fds, running=())
    assert verdict.fault is fault
    assert verdict.reason


def test_keep_after_the_snapshot_and_a_second_snapshot_are_protocol_errors():
    session = zds.ProxySession()
    session.receive(zds.SnapshotSent(), 0, running=())
    assert session.receive(zds.Keep("a"), 0, running=()).fault is zds.Fault.STOP
    assert session.receive(zds.SnapshotSent(), 0, running=()).fault is zds.Fault.STOP
    # Steady state: adds and deletes are fine.
    assert session.receive(zds.Add("a", INFO), 1, running=()).action == "add"
    assert session.receive(zds.Delete("a"), 0, running=()).action == "delete"


def test_codec_writes_istios_bytes():
    assert wire.encode_hello(zds.VERSION_V1) == bytes.fromhex("0801")
    assert wire.encode_request(zds.SnapshotSent()) == bytes.fromhex("1a00")
    assert wire.encode_request(zds.Delete("u1")) == bytes.fromhex("120412027531")
    assert wire.encode_request(zds.Keep("u1")) == bytes.fromhex("2a040a027531")
    assert wire.encode_response(zds.Ack()) == bytes.fromhex("0a00")
    assert wire.decode_response(bytes.fromhex("0a00")) == zds.Ack()
    assert wire.decode_hello(bytes.fromhex("0801")) == 1


def test_decoder_tolerates_unknown_fields_and_refuses_garbage():
    # field 15 (varint) appended: an unknown field from a newer peer is skipped.
    assert wire.decode_request(bytes.fromhex("1a00") + bytes.fromhex("7801")) == zds.SnapshotSent()
    with pytest.raises(zds.ZdsError, match="without a payload"):
        wire.decode_request(b"")
    with pytest.raises(zds.ZdsError, match="not a WorkloadRequest"):
        wire.decode_request(b"\xff\xff\xff")
    with pytest.raises(zds.ZdsError, match="without an ack"):
        wire.decode_response(b"")


names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=60)


@given(names, names, names, names)
def test_requests_round_trip(uid, name, namespace, sa):
    for request in (
        zds.Add(uid, zds.WorkloadInfo(name, namespace, sa)),
        zds.Add(uid, None),
        zds.Keep(uid),
        zds.Delete(uid),
        zds.SnapshotSent(),
    ):
        assert wire.decode_request(wire.encode_request(request)) == request


def test_a_request_over_the_packet_limit_is_refused_before_sending():
    with pytest.raises(zds.ZdsError, match="1024"):
        wire.encode_request(zds.Add("u" * 1100, INFO))


def test_netns_check_tells_a_namespace_from_a_file():
    fd = os.open("/proc/self/ns/net", os.O_RDONLY)
    try:
        assert wire.is_netns(fd)
    finally:
        os.close(fd)
    fd = os.open("/proc/self/ns/uts", os.O_RDONLY)  # a namespace, but not a network one
    try:
        assert not wire.is_netns(fd)
    finally:
        os.close(fd)
    with open(os.devnull, "rb") as handle:  # noqa: PTH123
        assert not wire.is_netns(handle.fileno())


def _open_fds() -> int:
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


def test_connection_closes_what_a_truncated_packet_carried():
    async def scenario() -> None:
        a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        conn = wire.Connection(b)
        fd = os.open(os.devnull, os.O_RDONLY)
        before = _open_fds()
        socket.send_fds(a, [b"x" * 2000], [fd])
        os.close(fd)
        with pytest.raises(zds.ZdsError, match="truncated"):
            await conn.recv(timeout=2)
        assert _open_fds() == before - 1  # the received copy was closed
        a.close()
        with pytest.raises(ConnectionError):
            await conn.recv(timeout=2)
        conn.close()

    asyncio.run(scenario())
