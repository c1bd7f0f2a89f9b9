"""The Delta ADS server over real TLS on loopback, driven by the proto-only test client and by
the proxies' own client. Authentication here is a stand-in (the real TokenReview path is tested
against the kube-apiserver in tests/kube); everything else is the product."""

from __future__ import annotations

import asyncio
import ipaddress
from pathlib import Path

import grpc
import pytest
from meshctl_plugins.controlplane.metrics import Metrics
from meshctl_plugins.controlplane.xds_server import DiscoveryServer

from meshctl import rpc
from meshctl.core.mesh.records import Action, Kind, Policy, Protocol, Scope, Workload
from meshctl.core.mesh.store import LiveStore, Update
from meshctl.core.pki.callers import Caller, CallerError
from meshctl.core.pki.identity import SpiffeId
from meshctl.proto import xds_pb2, xds_pb2_grpc
from tests.harness import xds_client as tc
from tests.harness.kube import CertificateAuthority

NODE_PROXY = Caller(
    namespace="meshctl-system",
    service_account="ztunnel",
    identity=SpiffeId("cluster.local", "meshctl-system", "ztunnel"),
    pod_name="ztunnel-1",
    node_name="n1",
)


def wl(name, ip, node="n1", ns="prod", policies=()):
    return Workload(
        uid=f"Kubernetes//Pod/{ns}/{name}",
        name=name,
        namespace=ns,
        workload_ips=(ipaddress.ip_address(ip),),
        node=node,
        protocol=Protocol.HBONE,
        authorization_policies=policies,
    )


def put(record):
    kind = Kind.WORKLOAD if isinstance(record, Workload) else Kind.POLICY
    key = record.uid if isinstance(record, Workload) else record.key
    return Update(kind=kind, key=key, record=record)


def deny(name, ns="prod", scope=Scope.NAMESPACE):
    return Policy(name=name, namespace=ns, scope=scope, action=Action.DENY, rules=((),))


class StandInCallers:
    """Tokens are looked up in a dict (the TokenReview path is tested in tests/kube)."""

    def __init__(self, callers: dict[str, Caller]) -> None:
        self.callers = callers

    async def authenticate(self, metadata) -> Caller:
        token = dict(metadata).get("authorization", "")
        caller = self.callers.get(token.removeprefix("Bearer "))
        if caller is None:
            raise CallerError("UNAUTHENTICATED", "unknown token")
        return caller

    def is_node_proxy(self, caller: Caller) -> bool:
        return caller.service_account == "ztunnel"

    async def node_of(self, caller: Caller) -> str:
        return caller.node_name


class Harness:
    def __init__(self, callers: dict[str, Caller]) -> None:
        self.ca = CertificateAuthority("xds-test")
        pair = self.ca.issue("cp", ip_sans=["127.0.0.1"], server=True)
        self.pair = rpc.KeyPair(cert_chain_pem=pair.cert_pem, key_pem=pair.key_pem)
        self.metrics = Metrics()
        self.registry = self.metrics.registry
        self.store = LiveStore()  # the source's: the servicer only reads it
        self.discovery = DiscoveryServer(
            self.store, callers=StandInCallers(callers), metrics=self.metrics
        )
        self.server: rpc.Server | None = None
        self.port = 0

    async def start(self, port: int = 0) -> None:
        self.server = rpc.Server(self.pair)
        self.server.add(
            xds_pb2_grpc.add_AggregatedDiscoveryServiceServicer_to_server, self.discovery
        )
        self.port = self.server.listen(f"127.0.0.1:{port}")
        await self.server.start()

    async def stop(self) -> None:
        assert self.server is not None
        await self.server.stop(0)

    async def stream(self, token="node"):
        return await tc.open_stream(
            f"127.0.0.1:{self.port}", root_pem=self.ca.cert_pem, token=token
        )

    def metric(self, name, **labels):
        return self.registry.get_sample_value(name, labels) or 0.0


def run(coro):
    return asyncio.run(coro)


async def subscribe_both(stream, **kw):
    """ztunnel's opening: one wildcard request per type, each answered, then ACKed."""
    node = tc.ztunnel_node()
    await stream.subscribe(tc.ADDRESS, node=node, **kw)
    await stream.subscribe(tc.AUTHORIZATION, node=node)
    first = {}
    for _ in range(2):
        response = await stream.recv()
        first[response.type_url] = response
        await stream.ack(response)
    return first


def test_each_type_is_answered_at_once_even_when_empty_then_changes_arrive_one_by_one():
    async def scenario():
        h = Harness({"node": NODE_PROXY})
        await h.start()
        channel, stream = await h.stream()
        first = await subscribe_both(stream)
        assert [len(r.resources) for r in first.values()] == [0, 0]
        assert all(r.nonce for r in first.values())
        h.store.apply([put(wl("a", "10.1.0.1")), put(wl("b", "10.1.0.2"))])
        push = await stream.recv()
        assert sorted(tc.decode(push)) == ["Kubernetes//Pod/prod/a", "Kubernetes//Pod/prod/b"]
        await stream.ack(push)
        # One pod changes: only it is sent.
        h.store.apply([put(wl("a", "10.1.0.9"))])
        push = await stream.recv()
        (body,) = tc.decode(push).values()
        assert (push.type_url, list(tc.decode(push))) == (tc.ADDRESS, ["Kubernetes//Pod/prod/a"])
        assert bytes(body.addresses[0]) == ipaddress.ip_address("10.1.0.9").packed
        await stream.ack(push)
        h.store.apply([Update(kind=Kind.WORKLOAD, key="Kubernetes//Pod/prod/a")])
        gone = await stream.recv()
        assert (list(gone.resources), list(gone.removed_resources)) == (
            [],
            ["Kubernetes//Pod/prod/a"],
        )
        assert h.metric("pilot_xds") == 1
        assert h.metric("pilot_xds_pushes_total", type="Address") == 4
        await stream.close()
        await channel.close()
        await h.stop()

    run(scenario())


def test_a_nacked_version_is_not_resent_and_is_counted():
    async def scenario():
        h = Harness({"node": NODE_PROXY})
        await h.start()
        channel, stream = await h.stream()
        await subscribe_both(stream)
        # A namespace policy where this node runs nothing is none of its business...
        h.store.apply([put(deny("d1"))])
        with pytest.raises(TimeoutError):
            await stream.recv(timeout=0.3)
        # ...until a pod of that namespace lands on the node.
        h.store.apply([put(wl("a", "10.1.0.1"))])
        responses = [await stream.recv(), await stream.recv()]
        policy = next(r for r in responses if r.type_url == tc.AUTHORIZATION)
        assert list(tc.decode(policy)) == ["prod/d1"]
        await stream.nack(policy, "prod/d1: rejected by test")
        for r in responses:
            if r is not policy:
                await stream.ack(r)
        await asyncio.sleep(0.2)
        assert h.metric("pilot_total_xds_rejects_total", type="Authorization") == 1
        # An unrelated change to the policy's neighbourhood does not resend it...
        h.store.apply([put(wl("b", "10.1.0.2"))])
        push = await stream.recv()
        assert push.type_url == tc.ADDRESS
        with pytest.raises(TimeoutError):
            await stream.recv(timeout=0.5)
        # ...a new version is sent.
        changed = Policy(
            name="d1", namespace="prod", scope=Scope.NAMESPACE, action=Action.DENY, rules=()
        )
        h.store.apply([put(changed)])
        push = await stream.recv()
        assert list(tc.decode(push)) == ["prod/d1"]
        await stream.close()
        await channel.close()
        await h.stop()

    run(scenario())


def test_a_node_proxy_gets_every_workload_but_only_its_nodes_policies():
    async def scenario():
        h = Harness({"node": NODE_PROXY})
        h.store.apply(
            [
                put(wl("here", "10.1.0.1", node="n1", ns="a", policies=("a/sel",))),
                put(wl("there", "10.1.0.2", node="n2", ns="b")),
                put(deny("ns-a", ns="a")),
                put(deny("ns-b", ns="b")),
                put(deny("sel", ns="a", scope=Scope.WORKLOAD_SELECTOR)),
                put(deny("global", ns="meshctl-system", scope=Scope.GLOBAL)),
            ]
        )
        await h.start()
        channel, stream = await h.stream()
        first = await subscribe_both(stream)
        assert len(first[tc.ADDRESS].resources) == 2
        assert sorted(tc.decode(first[tc.AUTHORIZATION])) == [
            "a/ns-a",
            "a/sel",
            "meshctl-system/global",
        ]
        # A pod of namespace b lands on this node: b's policy now concerns it.
        h.store.apply([put(wl("new", "10.1.0.3", node="n1", ns="b"))])
        got = {}
        for _ in range(2):
            r = await stream.recv()
            got[r.type_url] = r
        assert list(tc.decode(got[tc.AUTHORIZATION])) == ["b/ns-b"]
        await stream.close()
        await channel.close()
        await h.stop()

    run(scenario())


def test_a_reconnecting_client_gets_only_what_it_lacks():
    async def scenario():
        h = Harness({"node": NODE_PROXY})
        h.store.apply(
            [put(wl("a", "10.1.0.1")), put(wl("b", "10.1.0.2")), put(wl("c", "10.1.0.3"))]
        )
        await h.start()
        channel, stream = await h.stream()
        first = await subscribe_both(stream)
        held = {r.name: r.version for r in first[tc.ADDRESS].resources}
        await stream.close()
        await channel.close()
        h.store.apply(
            [put(wl("b", "10.1.0.22")), Update(kind=Kind.WORKLOAD, key="Kubernetes//Pod/prod/c")]
        )
        channel, stream = await h.stream()
        await stream.subscribe(tc.ADDRESS, node=tc.ztunnel_node(), initial=held)
        again = await stream.recv()
        assert list(tc.decode(again)) == ["Kubernetes//Pod/prod/b"]
        assert list(again.removed_resources) == ["Kubernetes//Pod/prod/c"]
        await stream.close()
        await channel.close()
        await h.stop()

    run(scenario())


def test_on_demand_lookups_are_answered_with_the_resource_or_a_removal():
    async def scenario():
        h = Harness({"node": NODE_PROXY})
        h.store.apply([put(wl("a", "10.1.0.1", node="n2"))])
        await h.start()
        channel, stream = await h.stream()
        await stream.subscribe(tc.ADDRESS, ["*"], unsubscribe=["*"], node=tc.ztunnel_node())
        empty = await stream.recv()
        assert (list(empty.resources), list(empty.removed_resources)) == ([], [])
        await stream.ack(empty)
        await stream.subscribe(tc.ADDRESS, ["/10.1.0.1"])
        found = await stream.recv()
        assert sorted(tc.decode(found)) == ["/10.1.0.1", "Kubernetes//Pod/prod/a"]
        await stream.subscribe(tc.ADDRESS, ["/10.1.0.99"])
        missing = await stream.recv()
        assert list(missing.removed_resources) == ["/10.1.0.99"]
        # Not wildcard: an unrelated pod on another node is not pushed.
        h.store.apply([put(wl("other", "10.1.0.7", node="n2"))])
        with pytest.raises(TimeoutError):
            await stream.recv(timeout=0.5)
        await stream.close()
        await channel.close()
        await h.stop()

    run(scenario())


def test_on_demand_the_proxys_own_node_workloads_come_unasked():
    """ztunnel with XDS_ON_DEMAND=true never asks for its own workload: it waits for it (istiod
    sends every workload on the proxy's node to an on-demand stream)."""

    async def scenario():
        h = Harness({"node": NODE_PROXY})
        h.store.apply([put(wl("local", "10.1.0.1")), put(wl("far", "10.1.0.2", node="n2"))])
        await h.start()
        channel, stream = await h.stream()
        await stream.subscribe(tc.ADDRESS, ["*"], unsubscribe=["*"], node=tc.ztunnel_node())
        first = await stream.recv()
        assert list(tc.decode(first)) == ["Kubernetes//Pod/prod/local"]
        await stream.ack(first)
        h.store.apply([put(wl("arrived", "10.1.0.3")), put(wl("far-2", "10.1.0.4", node="n2"))])
        pushed = await stream.recv()
        assert list(tc.decode(pushed)) == ["Kubernetes//Pod/prod/arrived"]
        await stream.close()
        await channel.close()
        await h.stop()

    run(scenario())


def test_refusals_and_protocol_errors_end_only_that_stream():
    async def scenario():
        h = Harness({"node": NODE_PROXY})
        await h.start()
        channel, stream = await h.stream(token="wrong")
        await stream.subscribe(tc.ADDRESS)
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stream.recv()
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        await channel.close()
        good_channel, good = await h.stream()
        await subscribe_both(good)
        bad_channel, bad = await h.stream()
        await bad.send(type_url="")  # no type: INVALID_ARGUMENT
        with pytest.raises(grpc.aio.AioRpcError) as invalid:
            await bad.recv()
        assert invalid.value.code() is grpc.StatusCode.INVALID_ARGUMENT
        await bad_channel.close()
        sotw = xds_pb2_grpc.AggregatedDiscoveryServiceStub(good_channel).StreamAggregatedResources()
        await sotw.write(xds_pb2.DiscoveryRequest(type_url=tc.ADDRESS))
        with pytest.raises(grpc.aio.AioRpcError) as unimplemented:
            await sotw.read()
        assert unimplemented.value.code() is grpc.StatusCode.UNIMPLEMENTED
        h.store.apply([put(wl("a", "10.1.0.1"))])
        assert list(tc.decode(await good.recv())) == ["Kubernetes//Pod/prod/a"]
        await good.close()
        await good_channel.close()
        await h.stop()

    run(scenario())


def test_the_proxys_client_syncs_reconnects_and_receives_removals(tmp_path: Path):
    from meshctl.proxy.xds_client import NodeInfo, XdsClient, XdsConfig

    async def scenario():
        h = Harness({"node": NODE_PROXY})
        h.store.apply([put(wl("a", "10.1.0.1")), put(deny("d", ns="prod"))])
        await h.start()
        port = h.port
        roots = tmp_path / "root-cert.pem"
        roots.write_bytes(h.ca.cert_pem)
        changes = []
        client = XdsClient(
            XdsConfig(
                address=f"127.0.0.1:{port}",
                roots=roots,
                auth=rpc.CallAuth(token="node"),
                node=NodeInfo(pod_name="z", pod_namespace="meshctl-system"),
            ),
            lambda store, updates: changes.append(updates),
            lambda: None,
        )
        stop = asyncio.Event()
        task = asyncio.ensure_future(client.run(stop))
        await asyncio.wait_for(client.synced.wait(), 10)
        assert [w.name for w in client.store.workloads] == ["a"]
        assert [p.key for p in client.store.policies] == ["prod/d"]
        # The server goes away and comes back with a change: the client reconnects on its own
        # and is told what it lacks.
        await h.stop()
        h.store.apply(
            [put(wl("b", "10.1.0.2")), Update(kind=Kind.WORKLOAD, key="Kubernetes//Pod/prod/a")]
        )
        await h.start(port)
        for _ in range(100):
            if [w.name for w in client.store.workloads] == ["b"]:
                break
            await asyncio.sleep(0.1)
        assert [w.name for w in client.store.workloads] == ["b"]
        assert client.connections >= 2
        assert client.state()["types"][tc.ADDRESS]["acked"]
        stop.set()
        await asyncio.wait_for(task, 5)
        await h.stop()

    run(scenario())


def test_a_full_state_sent_to_many_streams_is_encoded_once(monkeypatch: pytest.MonkeyPatch):
    from meshctl import xds

    encoded: list[int] = []
    original = xds.response_to_proto

    def counting(response, bodies, **kw):
        encoded.append(len(response.resources))
        return original(response, bodies, **kw)

    monkeypatch.setattr(xds, "response_to_proto", counting)

    async def scenario():
        h = Harness({"node": NODE_PROXY})
        h.store.apply([put(wl(f"w{i}", f"10.1.{i // 200}.{i % 200 + 1}")) for i in range(100)])
        await h.start()
        opened = [await h.stream() for _ in range(3)]
        firsts = [(await subscribe_both(stream))[tc.ADDRESS] for _, stream in opened]
        # Every stream got the whole state, decoded as the product's message.
        for first in firsts:
            assert len(tc.decode(first)) == 100
            assert first.SerializeToString() == firsts[0].SerializeToString()
        assert [n for n in encoded if n == 100] == [100]  # one encoding for the three
        # A change after that is each stream's own small response, still delivered.
        h.store.apply([put(wl("w0", "10.2.0.1"))])
        for _, stream in opened:
            changed = await stream.recv()
            body = tc.decode(changed)["Kubernetes//Pod/prod/w0"]
            assert bytes(body.addresses[0]) == ipaddress.ip_address("10.2.0.1").packed
        for channel, stream in opened:
            await stream.close()
            await channel.close()
        await h.stop()

    run(scenario())
