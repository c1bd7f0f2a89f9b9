"""The proxy's workloads: the local config its certificate feed sends and discovery's records
land in one store (``WorkloadFeed.store``), and a removal by one source leaves the other's."""

from __future__ import annotations

import ipaddress

from google.protobuf import any_pb2

from meshctl import rpc, xds
from meshctl.core.mesh.localconfig import LocalConfig, parse_local_config
from meshctl.core.mesh.records import Workload
from meshctl.core.mesh.render import render
from meshctl.core.wire import channel
from meshctl.core.xds.resources import ADDRESS_TYPE, AUTHORIZATION_TYPE
from meshctl.process import Feed
from meshctl.proto import xds_pb2
from meshctl.proxy.workload_feed import WorkloadFeed
from meshctl.proxy.xds_client import NodeInfo, XdsClient, XdsConfig


def _workload(name: str, ip: str) -> Workload:
    return Workload(
        uid=f"Kubernetes//Pod/ns/{name}",
        name=name,
        namespace="ns",
        workload_ips=(ipaddress.ip_address(ip),),
    )


class _LocalConfig(Feed):
    """A certificate feed's workloads part: the local config document, re-sent when edited."""

    def __init__(self, *workloads: Workload) -> None:
        self.document: LocalConfig = {"workloads": [render(w) for w in workloads]}
        self.edited = False

    def current(self) -> list[channel.Message]:
        return [channel.Workloads(document=self.document, generation=0)]

    def changes(self) -> list[channel.Message]:
        if not self.edited:
            return []
        self.edited = False
        return [channel.Workloads(document=self.document, generation=1)]


def _feed(local: Feed) -> WorkloadFeed:
    config = XdsConfig(address="cp:15012", roots=b"", auth=rpc.CallAuth(), node=NodeInfo())
    return WorkloadFeed(certs=local, client_config=config)


def _response(
    nonce: str, type_url: str, *workloads: Workload, removed: tuple[str, ...] = ()
) -> xds_pb2.DeltaDiscoveryResponse:
    resources = []
    for w in workloads:
        body = any_pb2.Any()
        body.Pack(xds.address_to_proto(w))
        resources.append(xds_pb2.Resource(name=w.uid, version="v1", resource=body))
    return xds_pb2.DeltaDiscoveryResponse(
        type_url=type_url, nonce=nonce, resources=resources, removed_resources=removed
    )


def _client(feed: WorkloadFeed) -> XdsClient:
    assert feed.client is not None
    return feed.client


def _names(message: channel.Message) -> list[str]:
    assert isinstance(message, channel.Workloads)
    return sorted(w.name for w in parse_local_config(message.document).workloads)


def test_local_config_and_discovery_feed_one_store_and_one_snapshot() -> None:
    feed = _feed(_LocalConfig(_workload("file", "10.0.0.1")))
    feed.current()  # the certificate feed's local config goes into the store
    _client(feed).handle(_response("1", ADDRESS_TYPE, _workload("discovered", "10.0.0.2")))
    _client(feed).handle(_response("2", AUTHORIZATION_TYPE))
    assert sorted(w.name for w in feed.store.current.workloads) == ["discovered", "file"]
    (snapshot,) = [m for m in feed.changes() if isinstance(m, channel.Workloads)]
    assert _names(snapshot) == ["discovered", "file"]


def test_a_discovery_removal_leaves_the_local_configs_records() -> None:
    local = _LocalConfig(_workload("file", "10.0.0.1"))
    feed = _feed(local)
    feed.current()
    discovered = _workload("discovered", "10.0.0.2")
    _client(feed).handle(_response("1", ADDRESS_TYPE, discovered))
    _client(feed).handle(_response("2", AUTHORIZATION_TYPE))
    feed.changes()  # the snapshot went out
    _client(feed).handle(_response("3", ADDRESS_TYPE, removed=(discovered.uid,)))
    (update,) = [m for m in feed.changes() if isinstance(m, channel.WorkloadUpdates)]
    assert [u["key"] for u in update.updates] == [discovered.uid]
    assert [w.name for w in feed.store.current.workloads] == ["file"]


def test_an_edited_local_config_leaves_discoverys_records() -> None:
    local = _LocalConfig(_workload("file", "10.0.0.1"))
    feed = _feed(local)
    feed.current()
    _client(feed).handle(_response("1", ADDRESS_TYPE, _workload("discovered", "10.0.0.2")))
    _client(feed).handle(_response("2", AUTHORIZATION_TYPE))
    feed.changes()
    local.document, local.edited = {}, True  # the file emptied
    (update,) = [m for m in feed.changes() if isinstance(m, channel.WorkloadUpdates)]
    assert [u["key"] for u in update.updates] == ["Kubernetes//Pod/ns/file"]
    assert [w.name for w in feed.store.current.workloads] == ["discovered"]


def test_without_discovery_the_local_config_is_the_stores_one_source() -> None:
    local = _LocalConfig(_workload("a", "10.0.0.1"), _workload("b", "10.0.0.2"))
    feed = WorkloadFeed(certs=local)
    assert feed.client is None
    (snapshot,) = [m for m in feed.current() if isinstance(m, channel.Workloads)]
    assert _names(snapshot) == ["a", "b"]  # every data plane has the store from the start
    assert feed.changes() == []
    local.document, local.edited = {"workloads": [render(_workload("a", "10.0.0.1"))]}, True
    (update,) = feed.changes()  # an edit reaches the data plane as what changed
    assert isinstance(update, channel.WorkloadUpdates)
    assert [(u["key"], u["record"]) for u in update.updates] == [("Kubernetes//Pod/ns/b", None)]
    assert update.generation > snapshot.generation
    assert [w.name for w in feed.store.current.workloads] == ["a"]
