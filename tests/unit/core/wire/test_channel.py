"""The supervisor/data-plane channel: frames round-trip, and anything off-schema is refused."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.wire import channel

MESSAGES = [
    channel.Hello(pid=42),
    channel.ProxyConfig(mode="sidecar", workload="default/web/web", listeners={"outbound": 5}),
    channel.Certs(cert_chain="C", key="K", roots="R", generation=3),
    channel.Certs(identity="spiffe://td/ns/a/sa/b", cert_chain="C", key="K", roots="R"),
    channel.PodAdd(
        uid="u1", name="p", namespace="n", service_account="s", roles=("netns", "outbound")
    ),
    channel.PodDelete(uid="u1"),
    channel.PodsSynced(synced=True),
    channel.Workloads(document={"workloads": [{"uid": "x"}]}, generation=2),
    channel.WorkloadUpdates(
        updates=({"kind": "workload", "key": "u", "version": "1", "record": None},), generation=3
    ),
    channel.XdsState(state={"connected": True, "types": {"t": {"acked": True}}}),
    channel.Drain(deadline=2.5),
    channel.GatewayUpdate(version="v1", config="CgJndw=="),
    channel.GatewayListeners(ports=(80, 443)),
    channel.Status(ready=True, certs_generation=1, workloads_generation=1),
    channel.Drained(remaining=0),
    channel.Gather(request=7),
    channel.ReportRequest(request=8),
    channel.Report(request=8, worker=1, pid=99, connections={"open": 1, "flows": [{"a": 1}]}),
    channel.Gathered(
        request=7,
        reports=({"worker": 1, "pid": 99, "connections": {"open": 0, "flows": []}},),
        missing=(2,),
    ),
]


@given(st.lists(st.sampled_from(MESSAGES), max_size=20), st.integers(1, 64))
def test_messages_survive_framing_split_at_any_byte(msgs, step):
    data = b"".join(channel.encode(m) for m in msgs)
    dec = channel.Decoder()
    out = []
    for i in range(0, len(data), step):
        out.extend(dec.feed(data[i : i + step]))
    assert out == msgs


def test_certs_repr_never_shows_the_key():
    assert "SECRET" not in repr(channel.Certs(cert_chain="a", key="SECRET", roots="b"))


def _frame(body: dict) -> bytes:
    data = json.dumps(body).encode()
    return struct.pack(">I", len(data)) + data


@pytest.mark.parametrize(
    ("body", "problem"),
    [
        ({"v": channel.VERSION + 1, "type": "drain", "deadline": 1}, "version"),
        ({"v": channel.VERSION - 1, "type": "drain", "deadline": 1}, "version"),
        ({"v": channel.VERSION, "type": "reboot"}, "unknown message type"),
        ({"v": channel.VERSION, "type": "drain", "deadline": 1, "force": True}, "unknown field"),
        ({"v": channel.VERSION, "type": "drain"}, "deadline"),
    ],
)
def test_off_schema_frames_are_refused(body, problem):
    with pytest.raises(channel.ChannelError, match=problem):
        channel.Decoder().feed(_frame(body))


def test_oversized_frame_is_refused_before_buffering_it():
    with pytest.raises(channel.ChannelError, match="exceeds"):
        channel.Decoder().feed(struct.pack(">I", channel.MAX_FRAME + 1))
