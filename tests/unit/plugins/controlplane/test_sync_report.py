"""The discovery server's sync report (proxy-status): each stream's kind, node and per-type
sync facts, over real TLS on loopback with the proto-only test client (stand-in authentication:
the TokenReview path and the syncz request itself are in tests/kube/test_proxy_status.py)."""

from __future__ import annotations

import asyncio

from meshctl_plugins.controlplane.xds_server import DebugSettings, DiscoveryServer

from meshctl import gateway_wire
from meshctl.core.pki.callers import Caller
from meshctl.core.pki.identity import SpiffeId
from tests.harness import xds_client as tc
from tests.unit.plugins.controlplane.test_discovery_server import (
    NODE_PROXY,
    Harness,
    StandInCallers,
)

GATEWAY = Caller(
    namespace="meshctl-system",
    service_account="ingress",
    identity=SpiffeId("cluster.local", "meshctl-system", "ingress"),
    pod_name="ingress-1",
)


def test_the_report_names_node_proxies_and_gateways_and_a_stream_not_acked_yet():
    async def scenario():
        h = Harness({"node": NODE_PROXY, "gw": GATEWAY})
        h.discovery = DiscoveryServer(
            h.store,
            callers=StandInCallers({"node": NODE_PROXY, "gw": GATEWAY}),
            debug=DebugSettings(namespace="meshctl-system", replica="cp-0", stale_after=60.0),
        )
        await h.start()
        node_channel, node = await h.stream("node")
        await node.subscribe(tc.ADDRESS, node=tc.ztunnel_node(pod="ztunnel-1"))
        await node.ack(await node.recv())
        gw_channel, gw = await h.stream("gw")
        await gw.subscribe(gateway_wire.GATEWAY_TYPE)
        await gw.recv()  # answered, never ACKed: PENDING (under the threshold)
        for _ in range(50):
            report = h.discovery.sync_report()
            kinds = {p["requester"]: (p["kind"], p["status"]) for p in report["proxies"]}
            if kinds.get("meshctl-system/ztunnel-1") == ("node proxy", "SYNCED"):
                break
            await asyncio.sleep(0.05)
        for channel in (node_channel, gw_channel):
            await channel.close()
        await h.stop()
        return report

    report = asyncio.run(scenario())
    assert report["controlPlane"] == "cp-0"
    by = {p["requester"]: p for p in report["proxies"]}
    assert by["meshctl-system/ztunnel-1"]["kind"] == "node proxy"
    assert by["meshctl-system/ztunnel-1"]["node"] == "n1"  # the scope's node, from the API
    assert by["meshctl-system/ztunnel-1"]["status"] == "SYNCED"
    assert by["meshctl-system/ingress-1"]["kind"] == "gateway"
    assert by["meshctl-system/ingress-1"]["status"] == "PENDING"
    assert report["certificates"] == []
