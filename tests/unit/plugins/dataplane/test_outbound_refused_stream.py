"""A tunnel the peer refused unprocessed (REFUSED_STREAM: the draining node proxy's GOAWAY crossed
it) is opened once more with every byte the app sent, instead of failing the connection; any
other reset, a second refusal, or more bytes than are kept fails it as before."""

from __future__ import annotations

from meshctl_plugins.dataplane.outbound import REPLAY_LIMIT, _OutboundStream

from meshctl.proxy.telemetry import Flow, Peer, Telemetry
from meshctl.proxy.tunnel import REFUSED_REASON


class StandInTunnel:
    """What the app stream asks of its tunnel, recorded."""

    flags = "RESET"

    def __init__(self) -> None:
        self.sent: list[tuple[int, bytes]] = []
        self.ended: list[int] = []

    def send(self, sid: int, data: bytes, source: object) -> None:
        self.sent.append((sid, bytes(data)))

    def end(self, sid: int) -> None:
        self.ended.append(sid)

    def consumed(self, sid: int, n: int) -> None:
        return None

    def reset(self, sid: int) -> None:
        return None

    def finished(self, sid: int) -> None:
        return None


def stream() -> tuple[_OutboundStream, Flow, list[_OutboundStream]]:
    flow = Flow(
        Telemetry(), direction="outbound", src=Peer(("10.0.0.1", 5000)), dst=Peer(("10.0.0.2", 80))
    )
    reopened: list[_OutboundStream] = []
    return _OutboundStream(flow, None, reopen=reopened.append), flow, reopened


def test_a_refused_tunnel_is_opened_again_with_the_bytes_already_sent() -> None:
    app, flow, reopened = stream()
    app.data_received(b"early ")  # before the stream exists
    first = StandInTunnel()
    app.bind(first, 1)  # type: ignore[arg-type]
    app.data_received(b"request")
    app.eof_received()
    app.tunnel_reset(REFUSED_REASON)
    assert reopened == [app]
    assert flow.state == "new"
    app.data_received(b" more")  # while the next connection is on its way
    second = StandInTunnel()
    app.bind(second, 3)  # type: ignore[arg-type]
    assert b"".join(d for _, d in second.sent) == b"early request more"
    assert {sid for sid, _ in second.sent} == {3}
    assert second.ended == [3]
    app.tunnel_opened()
    assert flow.state == "open"


def test_only_one_second_chance_and_only_for_a_refusal() -> None:
    app, flow, reopened = stream()
    app.bind(StandInTunnel(), 1)  # type: ignore[arg-type]
    app.tunnel_reset(REFUSED_REASON)
    app.bind(StandInTunnel(), 3)  # type: ignore[arg-type]
    app.tunnel_reset(REFUSED_REASON)
    assert len(reopened) == 1
    assert flow.state == "failed"

    other, other_flow, other_reopened = stream()
    other.bind(StandInTunnel(), 1)  # type: ignore[arg-type]
    other.tunnel_reset("stream reset (code 2)")
    assert (other_reopened, other_flow.state) == ([], "failed")


def test_a_stream_opened_or_past_the_replay_limit_is_not_opened_again() -> None:
    opened, flow, reopened = stream()
    opened.bind(StandInTunnel(), 1)  # type: ignore[arg-type]
    opened.tunnel_opened()
    opened.tunnel_reset(REFUSED_REASON)
    assert reopened == []
    assert flow.state == "closed"

    big, big_flow, big_reopened = stream()
    big.bind(StandInTunnel(), 1)  # type: ignore[arg-type]
    big.data_received(b"x" * (REPLAY_LIMIT + 1))
    big.tunnel_reset(REFUSED_REASON)
    assert (big_reopened, big_flow.state) == ([], "failed")
