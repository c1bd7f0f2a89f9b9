"""The Delta xDS stream state machine: what is sent after each request and each store change."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.core.xds.delta import DeltaProtocolError, DeltaStream, Plain, Request

T = "type.googleapis.com/istio.workload.Address"


class DictCatalog(Plain):
    def __init__(self, versions=None, aliases=None, view=None):
        self.versions = dict(versions or {})
        self.aliases = dict(aliases or {})
        self._view = view

    def resolve(self, name):
        if name in self.versions:
            return name, self.versions[name]
        key = self.aliases.get(name)
        if key in self.versions:
            return key, self.versions[key]
        return None

    def view(self):
        return list(self.versions if self._view is None else self._view)

    def in_view(self, key):
        return key in (self.versions if self._view is None else self._view)


def names(response):
    return sorted(r.name for r in response.resources), sorted(response.removed)


def test_a_wildcard_subscription_gets_everything_at_once():
    stream = DeltaStream()
    out = stream.receive(Request(type_url=T), DictCatalog({"a": "1", "b": "1"}))
    assert names(out.response) == (["a", "b"], [])
    assert stream.wildcard(T)


def test_an_empty_store_still_gets_an_answer_with_a_nonce():
    out = DeltaStream().receive(Request(type_url=T), DictCatalog())
    assert out.response is not None
    assert out.response.nonce
    assert names(out.response) == ([], [])


def test_ztunnels_on_demand_form_subscribes_to_nothing_yet():
    stream = DeltaStream()
    catalog = DictCatalog({"uid-1": "1"}, aliases={"/10.0.0.1": "uid-1"})
    first = stream.receive(Request(type_url=T, subscribe=("*",), unsubscribe=("*",)), catalog)
    assert names(first.response) == ([], [])
    assert not stream.wildcard(T)
    # A lookup by address is answered under that exact name, and the resource under its own.
    out = stream.receive(Request(type_url=T, subscribe=("/10.0.0.1",)), catalog)
    assert names(out.response) == (["/10.0.0.1", "uid-1"], [])
    assert {r.name: r.key for r in out.response.resources} == {
        "/10.0.0.1": "uid-1",
        "uid-1": "uid-1",
    }
    # A name nobody has is answered with its removal (the client's waiter wakes on it).
    missing = stream.receive(Request(type_url=T, subscribe=("/10.9.9.9",)), catalog)
    assert names(missing.response) == ([], ["/10.9.9.9"])
    # Later changes reach both names; a removal too.
    catalog.versions["uid-1"] = "2"
    assert names(stream.refresh(T, catalog, {"uid-1", "/10.0.0.1"})) == (["/10.0.0.1", "uid-1"], [])
    del catalog.versions["uid-1"]
    assert names(stream.refresh(T, catalog, {"uid-1", "/10.0.0.1"})) == ([], ["/10.0.0.1", "uid-1"])


def test_a_store_change_sends_only_what_changed():
    stream = DeltaStream()
    catalog = DictCatalog({"a": "1", "b": "1"})
    stream.receive(Request(type_url=T), catalog)
    catalog.versions["a"] = "2"
    assert names(stream.refresh(T, catalog, {"a"})) == (["a"], [])
    assert stream.refresh(T, catalog, {"a", "b"}) is None  # nothing new
    catalog.versions["c"] = "1"
    del catalog.versions["b"]
    assert names(stream.refresh(T, catalog)) == (["c"], ["b"])


def test_ack_and_nack():
    stream = DeltaStream()
    catalog = DictCatalog({"a": "1"})
    first = stream.receive(Request(type_url=T), catalog).response
    assert not stream.acked(T)
    ack = stream.receive(Request(type_url=T, nonce=first.nonce), catalog)
    assert ack.response is None
    assert [r.name for r in ack.acked] == ["a"]
    assert stream.acked(T)
    catalog.versions["a"] = "2"
    push = stream.refresh(T, catalog, {"a"})
    nack = stream.receive(Request(type_url=T, nonce=push.nonce, error="a: bad address"), catalog)
    assert [(r.name, r.version) for r in nack.nacked] == [("a", "2")]
    assert nack.error == "a: bad address"
    assert stream.held(T)["a"] == "1"  # the client kept what it had
    # The refused version is not sent again, a newer one is.
    assert stream.refresh(T, catalog, {"a"}) is None
    assert stream.refresh(T, catalog) is None
    catalog.versions["a"] = "3"
    assert names(stream.refresh(T, catalog, {"a"})) == (["a"], [])


def test_a_nack_naming_some_resources_refuses_only_those():
    stream = DeltaStream()
    catalog = DictCatalog({"a": "1", "b": "1"})
    first = stream.receive(Request(type_url=T), catalog).response
    out = stream.receive(Request(type_url=T, nonce=first.nonce, error="b: no; zzz: what"), catalog)
    assert [r.name for r in out.nacked] == ["b"]
    assert stream.held(T) == {"a": "1"}


def test_an_unknown_nonce_is_reported_and_changes_nothing():
    stream = DeltaStream()
    catalog = DictCatalog({"a": "1"})
    stream.receive(Request(type_url=T), catalog)
    out = stream.receive(Request(type_url=T, nonce="999"), catalog)
    assert out.unknown_nonce
    assert out.response is None


def test_a_reconnect_sends_only_what_the_client_lacks():
    catalog = DictCatalog({"a": "1", "b": "2", "c": "1"})
    stream = DeltaStream()
    held = {"a": "1", "b": "1", "gone": "1", "c": ""}
    out = stream.receive(Request(type_url=T, initial_versions=held), catalog)
    # a is current; b is old; c's version is unknown (ztunnel sends ""); gone is gone.
    assert names(out.response) == (["b", "c"], ["gone"])


def test_an_on_demand_reconnect_resubscribes_to_what_the_client_holds():
    catalog = DictCatalog({"uid-1": "1", "uid-2": "1"})
    stream = DeltaStream()
    request = Request(
        type_url=T, subscribe=("*",), unsubscribe=("*",), initial_versions={"uid-1": "", "x": ""}
    )
    out = stream.receive(request, catalog)
    assert names(out.response) == (["uid-1"], ["x"])
    assert stream.subscribed(T) == {"uid-1", "x"}
    catalog.versions["uid-2"] = "2"
    assert stream.refresh(T, catalog, {"uid-2"}) is None  # not subscribed to it


def test_unsubscribed_names_are_forgotten():
    stream = DeltaStream()
    catalog = DictCatalog({"a": "1"})
    stream.receive(Request(type_url=T, subscribe=("*",), unsubscribe=("*",)), catalog)
    stream.receive(Request(type_url=T, subscribe=("a",)), catalog)
    assert stream.receive(Request(type_url=T, unsubscribe=("a",)), catalog).response is None
    catalog.versions["a"] = "2"
    assert stream.refresh(T, catalog, {"a"}) is None
    assert stream.held(T) == {}


def test_a_resource_leaving_the_view_is_removed():
    stream = DeltaStream()
    catalog = DictCatalog({"p1": "1", "p2": "1"}, view={"p1", "p2"})
    stream.receive(Request(type_url=T), catalog)
    catalog._view = {"p1"}
    assert names(stream.refresh(T, catalog, {"p2"})) == ([], ["p2"])


def test_every_type_is_its_own_subscription_and_nonces_never_repeat():
    stream = DeltaStream()
    a = stream.receive(Request(type_url=T), DictCatalog({"x": "1"})).response
    b = stream.receive(Request(type_url="other"), DictCatalog()).response
    assert stream.types() == [T, "other"]
    assert a.nonce != b.nonce


def test_a_request_without_type_is_a_protocol_error():
    with pytest.raises(DeltaProtocolError):
        DeltaStream().receive(Request(type_url=""), DictCatalog())


# -- properties -------------------------------------------------------------------------------

KEYS = ["k1", "k2", "k3", "k4"]
ALIASES = {"@k1": "k1", "@k2": "k2", "@none": "missing"}
NAMES = KEYS + list(ALIASES)

OPS = st.lists(
    st.one_of(
        st.tuples(st.just("set"), st.sampled_from(KEYS), st.integers(1, 4)),
        st.tuples(st.just("del"), st.sampled_from(KEYS), st.just(0)),
        st.tuples(st.just("sub"), st.sampled_from(NAMES), st.just(0)),
        st.tuples(st.just("unsub"), st.sampled_from(NAMES), st.just(0)),
        st.tuples(st.just("wildcard"), st.booleans(), st.just(0)),
        st.tuples(st.just("reconnect"), st.just(""), st.just(0)),
    ),
    max_size=25,
)


class Client:
    """An xDS client as ztunnel is one: applies what it accepts, ACKs or NACKs each response."""

    def __init__(self, refuse):
        self.held: dict[str, str] = {}
        self.refused: dict[str, str] = {}
        self.refuse = refuse  # (name, version) -> refuse it?

    def apply(self, stream, response, catalog):
        if response is None:
            return
        bad = []
        for r in response.resources:
            if self.refuse(r.name, r.version):
                bad.append(r.name)
                self.refused[r.name] = r.version
            else:
                self.held[r.name] = r.version
        for name in response.removed:
            self.held.pop(name, None)
        error = "; ".join(f"{n}: refused" for n in bad) or None
        out = stream.receive(Request(type_url=T, nonce=response.nonce, error=error), catalog)
        assert out.response is None


def step(stream, client, catalog, op, arg, value):
    """One operation of the property test; returns the stream (a reconnect makes a new one)."""
    if op in ("set", "del"):
        if op == "set":
            catalog.versions[arg] = str(value)
        else:
            catalog.versions.pop(arg, None)
        changed = {arg} | {a for a, k in ALIASES.items() if k == arg}
        client.apply(stream, stream.refresh(T, catalog, changed), catalog)
    elif op == "sub":
        out = stream.receive(Request(type_url=T, subscribe=(arg,)), catalog)
        client.apply(stream, out.response, catalog)
    elif op == "unsub":
        if not (stream.wildcard(T) and arg in catalog.versions):
            client.held.pop(arg, None)
        stream.receive(Request(type_url=T, unsubscribe=(arg,)), catalog)
    elif op == "wildcard":
        change = {"subscribe": ("*",)} if arg else {"unsubscribe": ("*",)}
        client.apply(
            stream, stream.receive(Request(type_url=T, **change), catalog).response, catalog
        )
        if not arg:
            for name in [n for n in client.held if n not in stream.subscribed(T)]:
                client.held.pop(name)
    else:  # reconnect: a new stream, told what the client holds
        wildcard = stream.wildcard(T)
        initial = {**client.held, **dict.fromkeys(stream.subscribed(T) - set(client.held), "")}
        stream = DeltaStream()
        on_demand = {} if wildcard else {"subscribe": ("*",), "unsubscribe": ("*",)}
        request = Request(type_url=T, initial_versions=initial, **on_demand)
        client.refused.clear()
        client.apply(stream, stream.receive(request, catalog).response, catalog)
    return stream


@settings(max_examples=300, deadline=None)
@given(OPS, st.booleans(), st.integers(0, 5))
def test_the_client_always_ends_up_holding_exactly_its_subscription(ops, start_wildcard, seed):
    catalog = DictCatalog({"k1": "1"}, aliases=ALIASES)
    client = Client(lambda name, version: (hash((name, version, seed)) % 7) == 0)
    stream = DeltaStream()
    on_demand = {} if start_wildcard else {"subscribe": ("*",), "unsubscribe": ("*",)}
    client.apply(
        stream, stream.receive(Request(type_url=T, **on_demand), catalog).response, catalog
    )
    for op, arg, value in ops:
        stream = step(stream, client, catalog, op, arg, value)
        # Invariant: the client holds the current version of every name it is subscribed to
        # (unless it refused that very version), and nothing else.
        expected = set(stream.subscribed(T))
        if stream.wildcard(T):
            expected |= set(catalog.versions)
        for name in expected:
            found = catalog.resolve(name)
            if found is None:
                assert name not in client.held, (name, client.held)
            elif client.refused.get(name) != found[1]:
                assert client.held.get(name) == found[1], (name, client.held, found)
        assert set(client.held) <= expected, (client.held, expected)


class OnDemandCatalog(DictCatalog):
    """Node-local keys come unasked; a service brings its members (istiod's on-demand rules)."""

    def __init__(self, versions, *, local=(), members=None):
        super().__init__(versions)
        self.local = set(local)
        self.members = dict(members or {})

    def implied(self):
        return sorted(k for k in self.local if k in self.versions)

    def implies(self, key, subscribed):
        if key in self.local:
            return True
        return any(key in m and svc in subscribed for svc, m in self.members.items())

    def companions(self, key):
        return self.members.get(key, ())


def on_demand_start(stream, catalog):
    return stream.receive(Request(type_url=T, subscribe=("*",), unsubscribe=("*",)), catalog)


def test_on_demand_the_first_response_carries_the_proxys_node_workloads_unasked():
    catalog = OnDemandCatalog({"me": "1", "neighbour": "1", "far": "1"}, local={"me", "neighbour"})
    stream = DeltaStream()
    first = on_demand_start(stream, catalog).response
    assert names(first) == (["me", "neighbour"], [])
    assert not stream.wildcard(T)
    # A new pod on the node comes too; one elsewhere does not.
    catalog.versions["new-local"] = "1"
    catalog.local.add("new-local")
    catalog.versions["new-far"] = "1"
    pushed = stream.refresh(T, catalog, {"new-local", "new-far"})
    assert names(pushed) == (["new-local"], [])
    # Node-local keys stay subscribed: their change and removal reach the client.
    catalog.versions["me"] = "2"
    del catalog.versions["neighbour"]
    pushed = stream.refresh(T, catalog, {"me", "neighbour"})
    assert names(pushed) == (["me"], ["neighbour"])


def test_on_demand_a_service_asked_for_brings_its_workloads_and_later_members():
    catalog = OnDemandCatalog(
        {"ns/svc": "1", "pod-a": "1", "pod-b": "1", "other": "1"},
        members={"ns/svc": ("pod-a", "pod-b")},
    )
    stream = DeltaStream()
    assert names(on_demand_start(stream, catalog).response) == ([], [])
    answer = stream.receive(Request(type_url=T, subscribe=("ns/svc",)), catalog).response
    assert names(answer) == (["ns/svc", "pod-a", "pod-b"], [])
    catalog.versions["pod-c"] = "1"
    catalog.members["ns/svc"] = ("pod-a", "pod-b", "pod-c")
    catalog.versions["other"] = "2"
    pushed = stream.refresh(T, catalog, {"pod-c", "other"})
    assert names(pushed) == (["pod-c"], [])


def test_a_wildcard_stream_ignores_what_on_demand_would_imply():
    catalog = OnDemandCatalog({"me": "1", "far": "1"}, local={"me"}, members={"far": ("me",)})
    stream = DeltaStream()
    first = stream.receive(Request(type_url=T), catalog).response
    assert names(first) == (["far", "me"], [])
