"""Arbitrary frame sequences from the peer never raise out of the sans-IO HBONE core.

The peer is a frame generator (hyperframe + hpack, no state machine of its own): it sends
anything, in any order, on any stream, split at any byte. Between reads the test acts as the
shell does: it answers requests, gives back window, writes, half-closes and resets streams it
was told about, and sometimes closes or drains the connection. Whatever happens, the core
reports events (a broken peer is a ``ConnectionClosed``), and what it writes is valid HTTP/2
made of well-formed frames. ``MESHCTL_FUZZ_EXAMPLES`` raises the example count for a longer hunt.
"""

from __future__ import annotations

import os

import hpack
from h2.errors import ErrorCodes
from hyperframe.frame import (
    ContinuationFrame,
    DataFrame,
    Frame,
    GoAwayFrame,
    HeadersFrame,
    PingFrame,
    PriorityFrame,
    PushPromiseFrame,
    RstStreamFrame,
    SettingsFrame,
    WindowUpdateFrame,
)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from meshctl.core.wire.hbone import (
    ConnectionClosed,
    DataReceived,
    HboneConnection,
    StreamEnded,
    StreamReset,
    TunnelOpened,
    TunnelRefused,
    TunnelRequested,
    TunnelSettings,
)
from tests.unit.core.wire.test_hbone import received

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
SMALL = TunnelSettings(
    stream_window=65535,
    connection_window=65535,
    max_frame_size=16384,
    high_water=100_000,
    low_water=10_000,
)

stream_ids = st.sampled_from([0, 1, 2, 3, 5, 7, 9, 11, 101, 2**31 - 1])
header_sets = st.sampled_from(
    [
        [(":method", "CONNECT"), (":authority", "10.0.0.2:80")],
        [(":method", "CONNECT"), (":authority", "[fd00::2]:8080"), ("forwarded", 'for="1:2"')],
        [(":method", "CONNECT"), (":authority", "not an authority")],
        [(":method", "GET"), (":path", "/"), (":scheme", "https"), (":authority", "a:1")],
        [(":status", "200")],
        [(":status", "401")],
        [(":status", "100")],
        [(":status", "abc")],
        [("x-trailer", "1")],
        [(":method", "CONNECT")],
        [],
    ]
)
error_codes = st.sampled_from([0, 1, 2, 3, 5, 7, 8, 11, 0xFFFF])


def _data(draw: st.DrawFn, sid: int) -> bytes:
    f = DataFrame(sid or 1, data=draw(st.binary(max_size=2000)) * draw(st.integers(1, 40)))
    if draw(st.booleans()):
        f.flags.add("END_STREAM")
    if draw(st.booleans()):
        f.flags.add("PADDED")
        f.pad_length = draw(st.integers(0, 20))
    return f.serialize()


def _headers(draw: st.DrawFn, sid: int) -> bytes:
    block = hpack.Encoder().encode(draw(header_sets))
    if draw(st.booleans()):
        block = draw(st.binary(max_size=40))  # not HPACK at all
    f = HeadersFrame(sid or 1, data=block)
    if draw(st.booleans()):
        f.flags.add("END_STREAM")
    if draw(st.integers(0, 3)):  # else a CONTINUATION should follow
        f.flags.add("END_HEADERS")
    return f.serialize()


def _settings(draw: st.DrawFn, sid: int) -> bytes:
    values = draw(
        st.dictionaries(
            st.sampled_from([1, 2, 3, 4, 5, 6, 8, 0x99]),
            st.sampled_from([0, 1, 100, 16384, 65535, 2**20, 2**31 - 1, 2**32 - 1]),
            max_size=3,
        )
    )
    f = SettingsFrame(0, settings=values)
    if draw(st.booleans()) and not values:
        f.flags.add("ACK")
    return f.serialize()


def _ping(draw: st.DrawFn, sid: int) -> bytes:
    f = PingFrame(0, opaque_data=b"12345678")
    if draw(st.booleans()):
        f.flags.add("ACK")
    return f.serialize()


def _continuation(draw: st.DrawFn, sid: int) -> bytes:
    f = ContinuationFrame(sid or 1, data=hpack.Encoder().encode(draw(header_sets)))
    f.flags.add("END_HEADERS")
    return f.serialize()


def _unknown(draw: st.DrawFn, sid: int) -> bytes:
    """A frame type nobody knows (RFC 9113 §4.1: ignore it)."""
    payload = draw(st.binary(max_size=30))
    return len(payload).to_bytes(3, "big") + b"\xee\x00" + sid.to_bytes(4, "big") + payload


_BUILDERS = [
    _data,
    _headers,
    _settings,
    _ping,
    _continuation,
    _unknown,
    lambda draw, sid: RstStreamFrame(sid or 1, error_code=draw(error_codes)).serialize(),
    lambda draw, sid: WindowUpdateFrame(
        sid, window_increment=draw(st.sampled_from([0, 1, 1000, 65535, 2**20, 2**31 - 1]))
    ).serialize(),
    lambda draw, sid: GoAwayFrame(
        0,
        last_stream_id=draw(st.sampled_from([0, 1, 3, 2**31 - 1])),
        error_code=draw(error_codes),
        additional_data=b"fuzz",
    ).serialize(),
    lambda draw, sid: PriorityFrame(
        sid or 1, depends_on=draw(stream_ids), stream_weight=15
    ).serialize(),
    lambda draw, sid: PushPromiseFrame(sid or 1, promised_stream_id=2, data=b"").serialize(),
    lambda draw, sid: draw(st.binary(min_size=1, max_size=30)),  # not a frame at all
]


@st.composite
def frames(draw: st.DrawFn) -> bytes:
    build = draw(st.sampled_from(_BUILDERS))
    return bytes(build(draw, draw(stream_ids)))


local_actions = st.lists(
    st.tuples(
        st.sampled_from(["send", "end", "reset", "consumed", "respond", "open", "goaway", "close"]),
        st.integers(0, 5),
        st.sampled_from([0, 1, 1000, 70_000]),
    ),
    max_size=4,
)


class Shell:
    """What the data plane's shell does with events, with no sockets."""

    def __init__(self, conn: HboneConnection) -> None:
        self.conn = conn
        self.known: list[int] = []
        self.ended: set[int] = set()  # streams we half-closed (sending more is our misuse)
        self.answered: set[int] = set()  # requests we answered (answering again is misuse)
        self.out = b""

    def drain(self) -> None:
        self.out += self.conn.data_to_send()

    def handle(self, events: list) -> None:
        for ev in events:
            if isinstance(ev, TunnelRequested):
                self.known.append(ev.stream_id)
                self.respond(ev.stream_id, 200 if ev.stream_id % 4 == 1 else 401)
            elif isinstance(ev, DataReceived):
                self.conn.consumed(ev.stream_id, ev.flow)
                self.send(ev.stream_id, bytes(ev.data[:100]))  # an echo writes back
            elif isinstance(ev, StreamEnded):
                self.end(ev.stream_id)
            elif isinstance(ev, StreamReset | TunnelRefused):
                self.conn.reset(ev.stream_id)  # the shell's app side aborts too
            elif isinstance(ev, TunnelOpened):
                self.send(ev.stream_id, b"hello")
            self.drain()

    def respond(self, sid: int, status: int) -> None:
        if sid not in self.answered:
            self.answered.add(sid)
            self.conn.respond(sid, status)

    def send(self, sid: int, data: bytes) -> None:
        if sid not in self.ended:
            self.conn.send(sid, data)

    def end(self, sid: int) -> None:
        self.ended.add(sid)
        self.conn.end(sid)

    def act(self, actions: list[tuple[str, int, int]]) -> None:
        for name, index, size in actions:
            sid = self.known[index % len(self.known)] if self.known else 0
            if name == "open" and self.conn.client and self.conn.can_open():
                self.known.append(self.conn.open("10.0.0.2:80"))
            elif name == "goaway":
                self.conn.go_away()
            elif name == "close" and index == 0:
                self.conn.close(ErrorCodes.NO_ERROR)
            elif sid and name == "send":
                self.send(sid, b"s" * size)
            elif sid and name == "end":
                self.end(sid)
            elif sid and name == "reset":
                self.conn.reset(sid)
            elif sid and name == "consumed":
                self.conn.consumed(sid, size)
            elif sid and name == "respond" and not self.conn.client:
                self.respond(sid, 200)
            self.drain()


def _run(client: bool, chunks: list[tuple[bytes, list]], split: int) -> Shell:
    conn = HboneConnection(client=client, settings=SMALL)
    shell = Shell(conn)
    shell.drain()
    if client:
        for _ in range(3):
            shell.known.append(conn.open("10.0.0.2:80"))
            shell.conn.send(shell.known[-1], b"x" * 100_000)  # held beyond the window
        shell.drain()
        wire = SettingsFrame(0, settings={}).serialize()
    else:
        wire = PREFACE + SettingsFrame(0, settings={}).serialize()
    now = 0.0
    for frame_bytes, actions in chunks:
        wire += frame_bytes
        for i in range(0, len(wire), split):
            now += 0.001
            shell.handle(conn.receive(wire[i : i + split], now))
        wire = b""
        shell.act(actions)
    return shell


def _parse_output(out: bytes, *, client: bool) -> None:
    """What the core wrote is a sequence of well-formed HTTP/2 frames (RFC 9113 §4.1)."""
    view = memoryview(out)
    if client:
        assert bytes(view[: len(PREFACE)]) == PREFACE
        view = view[len(PREFACE) :]
    while view:
        frame, length = Frame.parse_frame_header(view[:9])
        assert length <= 2**24 - 1  # our frames follow the peer's MAX_FRAME_SIZE (RFC 9113 §4.2)
        frame.parse_body(view[9 : 9 + length])
        assert len(view) >= 9 + length
        view = view[9 + length :]


@settings(
    max_examples=int(os.environ.get("MESHCTL_FUZZ_EXAMPLES", "150")),
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
@given(
    client=st.booleans(),
    chunks=st.lists(st.tuples(frames(), local_actions), min_size=1, max_size=25),
    split=st.sampled_from([1, 7, 9, 100, 1 << 20]),
)
def test_arbitrary_peer_frames_never_raise_out_of_the_core(client, chunks, split):
    shell = _run(client, chunks, split)
    closed = shell.conn.closed
    assert closed is None or isinstance(closed, ConnectionClosed)
    _parse_output(shell.out, client=client)


@settings(max_examples=100, deadline=None)
@given(
    order=st.permutations(["wu0", "wu1", "wu3", "wu5", "rst1", "rst3", "rst5"]),
    keep=st.sets(st.sampled_from([1, 3, 5])),
)
def test_resets_and_window_updates_in_one_read_end_only_their_streams(order, keep):
    # The fault seen against iperf3: RST_STREAM and WINDOW_UPDATE for streams we hold bytes
    # for, in one read, in any order. Only the reset streams end; the rest keep flowing.
    conn = HboneConnection(client=True, settings=SMALL)
    shell = Shell(conn)
    for _ in range(3):
        shell.known.append(conn.open("10.0.0.2:80"))
    shell.drain()
    answer = SettingsFrame(0, settings={}).serialize()
    for sid in (1, 3, 5):
        f = HeadersFrame(sid, data=hpack.Encoder().encode([(":status", "200")]))
        f.flags.add("END_HEADERS")
        answer += f.serialize()
    conn.receive(answer, 0.0)
    for sid in (1, 3, 5):
        conn.send(sid, b"x" * 150_000)  # beyond the window: held
    conn.data_to_send()
    frames_by_name = {
        f"wu{sid}": WindowUpdateFrame(sid, window_increment=1 << 20).serialize()
        for sid in (0, 1, 3, 5)
    }
    frames_by_name |= {
        f"rst{sid}": RstStreamFrame(sid, error_code=ErrorCodes.CANCEL).serialize()
        for sid in (1, 3, 5)
    }
    wire = b"".join(
        frames_by_name[n] for n in order if not (n.startswith("rst") and int(n[3:]) in keep)
    )
    events = conn.receive(wire, 1.0)
    reset = {e.stream_id for e in events if isinstance(e, StreamReset)}
    assert reset == {1, 3, 5} - keep
    assert conn.closed is None
    for sid in keep:
        assert conn.held_bytes(sid) < 150_000  # the window opened and bytes left


# -- against h2, an independent HTTP/2 implementation, in both roles -----------------------------


def _h2_peer(client: bool):
    import h2.config
    import h2.connection

    peer = h2.connection.H2Connection(
        h2.config.H2Configuration(client_side=client, header_encoding=None)
    )
    peer.initiate_connection()
    return peer


# Streams of any size, our reads split anywhere (h2 reads whole writes).
def _against_h2(test):
    sizes = st.lists(st.integers(0, 400_000), min_size=1, max_size=4)
    split = st.sampled_from([1, 13, 4096, 1 << 20])
    return settings(max_examples=60, deadline=None)(given(sizes=sizes, split=split)(test))


def _pump(ours, peer, split, on_peer_event, rounds=2000):
    """Move bytes both ways (ours split every ``split`` bytes) until both sides are quiet."""
    import h2.events

    ours_events = []
    for _ in range(rounds):
        a, b = ours.data_to_send(), peer.data_to_send()
        if not a and not b:
            return ours_events
        if a:
            for ev in peer.receive_data(a):
                if isinstance(ev, h2.events.DataReceived):
                    peer.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
                on_peer_event(ev)
        for i in range(0, len(b), split):
            for ev in ours.receive(b[i : i + split], 0.0):
                ours_events.append(ev)
                if isinstance(ev, DataReceived):
                    ours.consumed(ev.stream_id, ev.flow)
    raise AssertionError("never quiet")


@_against_h2
def test_our_client_and_an_h2_server_move_exact_bytes_both_ways(sizes, split):
    import h2.events

    ours = HboneConnection(client=True)
    peer = _h2_peer(client=False)
    got: dict[int, bytes] = {}
    ended: set[int] = set()

    def on_peer(ev):
        if isinstance(ev, h2.events.RequestReceived):
            headers = dict(ev.headers)
            assert headers[b":method"] == b"CONNECT"
            peer.send_headers(ev.stream_id, [(b":status", b"200")])
        elif isinstance(ev, h2.events.DataReceived):
            got[ev.stream_id] = got.get(ev.stream_id, b"") + ev.data
        elif isinstance(ev, h2.events.StreamEnded):
            ended.add(ev.stream_id)
            body = got.get(ev.stream_id, b"")
            peer.send_data(ev.stream_id, body[: peer.local_flow_control_window(ev.stream_id)])

    sids = [ours.open("10.0.0.2:80", [("forwarded", 'for="10.0.0.1:9"')]) for _ in sizes]
    payloads = {sid: bytes([sid % 251]) * n for sid, n in zip(sids, sizes, strict=True)}
    for sid in sids:
        ours.send(sid, payloads[sid])
        ours.end(sid)
    events = _pump(ours, peer, split, on_peer)
    assert TunnelOpened(sids[0]) in events
    for sid in sids:
        assert got.get(sid, b"") == payloads[sid]
        assert sid in ended
        echoed = received(events, sid)
        # h2 echoes what its window allows in one go: a prefix, at least one default window.
        assert echoed == payloads[sid][: len(echoed)]
        assert len(echoed) >= min(len(payloads[sid]), 65535)
    assert ours.closed is None


@_against_h2
def test_an_h2_client_and_our_server_move_exact_bytes_both_ways(sizes, split):
    import h2.events

    ours = HboneConnection(client=False)
    peer = _h2_peer(client=True)
    back: dict[int, bytes] = {}
    status: dict[int, bytes] = {}
    done: set[int] = set()

    def on_peer(ev):
        if isinstance(ev, h2.events.ResponseReceived):
            status[ev.stream_id] = dict(ev.headers)[b":status"]
        elif isinstance(ev, h2.events.DataReceived):
            back[ev.stream_id] = back.get(ev.stream_id, b"") + ev.data
        elif isinstance(ev, h2.events.StreamEnded):
            done.add(ev.stream_id)

    sids = []
    for _ in sizes:
        sid = peer.get_next_available_stream_id()
        peer.send_headers(sid, [(":method", "CONNECT"), (":authority", "10.0.0.2:80")])
        sids.append(sid)
    payloads = {sid: bytes([sid % 251 + 1]) * n for sid, n in zip(sids, sizes, strict=True)}
    received_by_us: dict[int, bytes] = {}
    pending = dict(payloads)
    for _ in range(400):
        for sid, rest in list(pending.items()):
            window = min(peer.local_flow_control_window(sid), peer.max_outbound_frame_size)
            if window or not rest:
                peer.send_data(sid, rest[:window], end_stream=len(rest) <= window)
                if len(rest) <= window:
                    del pending[sid]
                else:
                    pending[sid] = rest[window:]
        events = _pump(ours, peer, split, on_peer)
        for ev in events:
            if isinstance(ev, TunnelRequested):
                ours.respond(ev.stream_id, 200)
            elif isinstance(ev, DataReceived):
                received_by_us[ev.stream_id] = received_by_us.get(ev.stream_id, b"") + bytes(
                    ev.data
                )
            elif isinstance(ev, StreamEnded):
                ours.send(ev.stream_id, received_by_us.get(ev.stream_id, b""))  # echo back
                ours.end(ev.stream_id)
        if not pending and done >= set(sids):
            break
    _pump(ours, peer, split, on_peer)
    for sid in sids:
        assert status[sid] == b"200"
        assert received_by_us.get(sid, b"") == payloads[sid]
        assert back.get(sid, b"") == payloads[sid]
        assert sid in done
    assert ours.closed is None
