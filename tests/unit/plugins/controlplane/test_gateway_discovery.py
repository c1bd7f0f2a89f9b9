"""Gateway configs over the control plane's Delta ADS, end to end on loopback TLS: the gateway
proxy's own client (plugins/gateway/xds_source.py) against the product's server, with the
stand-in authentication of test_discovery_server."""

from __future__ import annotations

import asyncio
from pathlib import Path

from meshctl_plugins.controlplane.gateway_configs import GatewayConfigs, may_read
from meshctl_plugins.controlplane.xds_server import DiscoveryServer
from meshctl_plugins.gateway import xds_source

from meshctl import gateway_wire, rpc
from meshctl.core.gateway.config import BackendKey, Endpoint, GatewayConfig, KeyPair
from meshctl.core.gateway.model import SecretRef
from meshctl.core.pki.callers import Caller
from meshctl.core.pki.identity import SpiffeId
from meshctl.proto import xds_pb2
from meshctl.proxy.xds_client import NodeInfo, XdsConfig

from .test_discovery_server import Harness, StandInCallers


def caller(namespace: str, account: str = "gw") -> Caller:
    return Caller(
        namespace=namespace,
        service_account=account,
        identity=SpiffeId("cluster.local", namespace, account),
        pod_name=f"{account}-1",
    )


def config(name: str = "infra/gw", chain: bytes = b"CHAIN", endpoints: int = 1) -> GatewayConfig:
    return GatewayConfig(
        name=name,
        certificates={SecretRef("infra", "cert"): KeyPair(chain_pem=chain, key_pem=b"KEY")},
        endpoints={
            BackendKey("infra", "svc", 80): tuple(
                Endpoint(address=f"10.0.0.{i}", port=8080) for i in range(1, endpoints + 1)
            )
        },
    )


class GatewayHarness(Harness):
    def __init__(self) -> None:
        super().__init__({"gw": caller("infra"), "other": caller("elsewhere")})
        self.configs = GatewayConfigs()
        self.discovery = DiscoveryServer(
            self.store,
            callers=StandInCallers({"gw": caller("infra"), "other": caller("elsewhere")}),
            metrics=self.metrics,
            gateways=self.configs,
            ingress_namespace="meshctl-system",
        )

    def client(self, tmp_path: Path, token: str = "gw") -> XdsConfig:
        roots = tmp_path / "root-cert.pem"
        roots.write_bytes(self.ca.cert_pem)
        return XdsConfig(
            address=f"127.0.0.1:{self.port}",
            roots=roots,
            auth=rpc.CallAuth(token=token),
            node=NodeInfo(pod_name="gw-1", pod_namespace="infra"),
        )


async def wait_for(predicate, timeout: float = 10.0) -> None:
    for _ in range(int(timeout / 0.05)):
        if predicate():
            return
        await asyncio.sleep(0.05)
    raise AssertionError("condition not reached")


def test_the_gateway_proxy_receives_its_config_with_certificates_then_only_real_changes(
    tmp_path: Path,
):
    async def scenario():
        h = GatewayHarness()
        h.configs.publish([config(), config("other/gw")])
        await h.start()
        got: list[GatewayConfig] = []
        stop = asyncio.Event()
        state = xds_source.SourceState(gateway="infra/gw")
        task = asyncio.ensure_future(
            xds_source.follow(h.client(tmp_path), "infra/gw", got.append, stop, state)
        )
        await wait_for(lambda: len(got) == 1)
        first = got[0]
        assert first.name == "infra/gw"
        assert first.certificates[SecretRef("infra", "cert")].chain_pem == b"CHAIN"
        assert first.version == h.configs.current["infra/gw"].version != ""
        # Republishing the same content sends nothing; a changed certificate is sent.
        h.configs.publish([config(), config("other/gw", endpoints=2)])
        h.configs.publish([config(chain=b"NEW"), config("other/gw", endpoints=2)])
        await wait_for(lambda: len(got) == 2)
        assert got[1].certificates[SecretRef("infra", "cert")].chain_pem == b"NEW"
        await asyncio.sleep(0.2)
        assert len(got) == 2
        # The server restarts: the client reconnects naming its version, and is sent nothing.
        await h.stop()
        await h.start(h.port)
        await wait_for(lambda: state.connections >= 2 and state.connected)
        await asyncio.sleep(0.2)
        assert len(got) == 2
        # The Gateway goes away: nothing is delivered, the last config stays in force.
        h.configs.publish([])
        await asyncio.sleep(0.3)
        assert len(got) == 2
        assert state.version == got[1].version
        stop.set()
        await asyncio.wait_for(task, 5)
        await h.stop()

    asyncio.run(scenario())


def test_a_caller_of_another_namespace_is_never_sent_the_config(tmp_path: Path):
    async def scenario():
        h = GatewayHarness()
        h.configs.publish([config()])
        await h.start()
        got: list[GatewayConfig] = []
        stop = asyncio.Event()
        state = xds_source.SourceState(gateway="infra/gw")
        task = asyncio.ensure_future(
            xds_source.follow(h.client(tmp_path, "other"), "infra/gw", got.append, stop, state)
        )
        await wait_for(lambda: state.connected)
        await asyncio.sleep(0.3)
        assert got == []
        stop.set()
        await asyncio.wait_for(task, 5)
        await h.stop()

    asyncio.run(scenario())


def test_a_request_before_the_controllers_first_publish_waits_for_it(tmp_path: Path):
    async def scenario():
        h = GatewayHarness()
        await h.start()
        got: list[GatewayConfig] = []
        stop = asyncio.Event()
        state = xds_source.SourceState(gateway="infra/gw")
        task = asyncio.ensure_future(
            xds_source.follow(h.client(tmp_path), "infra/gw", got.append, stop, state)
        )
        await asyncio.sleep(0.5)
        assert not state.connected  # no response at all yet: not even a removal
        h.configs.publish([config()])
        await wait_for(lambda: len(got) == 1)
        stop.set()
        await asyncio.wait_for(task, 5)
        await h.stop()

    asyncio.run(scenario())


def test_a_config_that_does_not_decode_is_nacked_and_not_delivered():
    state = xds_source.SourceState(gateway="infra/gw")
    got: list[GatewayConfig] = []
    response = xds_pb2.DeltaDiscoveryResponse(type_url=gateway_wire.GATEWAY_TYPE, nonce="1")
    bad = response.resources.add(name="infra/gw", version="v1")
    bad.resource.type_url = gateway_wire.GATEWAY_TYPE
    bad.resource.value = b"\xff\xff"
    ack = xds_source.handle(state, response, got.append)
    assert got == []
    assert ack.response_nonce == "1"
    assert ack.error_detail.message.startswith("infra/gw: not a GatewayConfig")
    assert state.version == ""
    assert state.nacks == 1


def test_publish_reports_added_changed_and_removed_names_and_keeps_unchanged_versions():
    configs = GatewayConfigs()
    seen: list[set[str]] = []
    configs.subscribe(seen.append)
    assert configs.publish([config("a/g"), config("b/g")]) == {"a/g", "b/g"}
    version = configs.current["a/g"].version
    assert configs.publish([config("a/g"), config("c/g")]) == {"b/g", "c/g"}
    assert configs.current["a/g"].version == version
    assert configs.publish([config("a/g", chain=b"x"), config("c/g")]) == {"a/g"}
    assert configs.current["a/g"].version != version
    assert configs.publish([config("a/g", chain=b"x"), config("c/g")]) == set()
    assert seen == [{"a/g", "b/g"}, {"b/g", "c/g"}, {"a/g"}]


def test_only_the_gateways_namespace_reads_its_config_and_the_mesh_namespace_the_ingress():
    assert may_read(caller("infra"), "infra/gw", ingress_namespace="meshctl-system")
    assert not may_read(caller("other"), "infra/gw", ingress_namespace="meshctl-system")
    assert may_read(caller("meshctl-system"), "ingress", ingress_namespace="meshctl-system")
    assert not may_read(caller("infra"), "ingress", ingress_namespace="meshctl-system")
    assert not may_read(caller("infra"), "infra", ingress_namespace="meshctl-system")
