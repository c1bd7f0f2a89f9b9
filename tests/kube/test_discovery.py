"""Workload discovery of ``meshctl controlplane run`` against the real kube-apiserver.

A test client written from the protos alone (tests/harness/xds_client.py) subscribes the way
Istio's ztunnel does, with a real TokenRequest token checked by a real TokenReview, and watches
what arrives as pods, services and AuthorizationPolicies change through the API.
"""

from __future__ import annotations

import asyncio
import ipaddress
import secrets
from collections.abc import Iterator
from typing import Any

import grpc
import pytest
from kubernetes import client as k8s

from tests.harness import controlplane as cp
from tests.harness import xds_client as tc
from tests.harness.kube import KubeCluster, create_namespace, delete_namespace

pytestmark = pytest.mark.kube

NODE = "node-a"


@pytest.fixture(scope="module")
def mesh(kube_cluster: KubeCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A control plane, its root, a namespace for workloads and a node proxy's token."""
    system = f"dsys-{secrets.token_hex(3)}"
    apps = f"dapp-{secrets.token_hex(3)}"
    with kube_cluster.api_client() as api:
        create_namespace(api, system)
        create_namespace(api, apps)
        try:
            with cp.running(
                kube_cluster,
                system,
                tmp_path_factory.mktemp("discovery"),
                "--trusted-node-accounts",
                f"{system}/meshctl-ztunnel",
            ) as plane:
                token = cp.pod_token(
                    kube_cluster, system, "meshctl-ztunnel", "ztunnel-a", node=NODE
                )
                yield Mesh(kube_cluster, plane, cp.root_pem(api, system), token, apps)
        finally:
            delete_namespace(api, apps)
            delete_namespace(api, system)


class Mesh:
    def __init__(self, cluster, plane, root, token, apps):
        self.cluster, self.plane, self.root, self.token, self.apps = (
            cluster,
            plane,
            root,
            token,
            apps,
        )

    async def stream(self, token=None):
        return await tc.open_stream(
            f"127.0.0.1:{self.plane.grpc_port}",
            root_pem=self.root,
            token=self.token if token is None else token,
            server_name=self.plane.server_name,
        )

    def uid(self, pod):
        return f"Kubernetes//Pod/{self.apps}/{pod}"

    def core(self):
        return k8s.CoreV1Api(self.cluster.api_client())

    def pod(self, name, ip, *, node=NODE, labels=None, ready=True):
        """A running pod as a kubelet would report it: created, then its status written."""
        core = self.core()
        body = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {"name": name, "labels": labels or {"app": name}},
            "spec": {
                "nodeName": node,
                "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
            },
        }
        core.create_namespaced_pod(self.apps, body)
        self.status(name, ip, ready=ready)

    def status(self, name, ip, *, ready=True):
        status = {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "conditions": [{"type": "Ready", "status": "True" if ready else "False"}],
        }
        core = self.core()
        pod = core.read_namespaced_pod(name, self.apps)  # replaced whole: a patch merges podIPs
        pod.status = status
        core.replace_namespaced_pod_status(name, self.apps, pod)

    def delete_pod(self, name):
        self.core().delete_namespaced_pod(name, self.apps, grace_period_seconds=0)

    def policy(self, name, spec, *, replace=False):
        api = k8s.CustomObjectsApi(self.cluster.api_client())
        body = {
            "apiVersion": "security.istio.io/v1",
            "kind": "AuthorizationPolicy",
            "metadata": {"name": name, "namespace": self.apps},
            "spec": spec,
        }
        args = ("security.istio.io", "v1", self.apps, "authorizationpolicies")
        if replace:
            current = api.get_namespaced_custom_object(*args, name)
            body["metadata"]["resourceVersion"] = current["metadata"]["resourceVersion"]
            api.replace_namespaced_custom_object(*args, name, body)
        else:
            api.create_namespaced_custom_object(*args, body)


def run(coro):
    return asyncio.run(coro)


async def opened(mesh, **kw):
    """ztunnel's opening: a wildcard request per type, each answered at once, then ACKed."""
    channel, stream = await mesh.stream(**kw)
    node = tc.ztunnel_node()
    await stream.subscribe(tc.ADDRESS, node=node)
    await stream.subscribe(tc.AUTHORIZATION, node=node)
    first = {}
    for _ in range(2):
        response = await stream.recv(timeout=15)
        first[response.type_url] = response
        await stream.ack(response)
    return channel, stream, first


async def next_of(stream, type_url, *, timeout=15.0):
    """The next response of ``type_url`` (ACKing every response on the way)."""
    while True:
        response = await stream.recv(timeout=timeout)
        await stream.ack(response)
        if response.type_url == type_url:
            return response


def ip_of(workload):
    return str(ipaddress.ip_address(bytes(workload.addresses[0])))


def test_pod_lifecycle_arrives_as_incremental_pushes(mesh):
    async def scenario():
        channel, stream, first = await opened(mesh)
        assert set(first) == {tc.ADDRESS, tc.AUTHORIZATION}
        mesh.pod("web-1", "10.20.0.11")
        push = await next_of(stream, tc.ADDRESS)
        assert list(tc.decode(push)) == [mesh.uid("web-1")]
        workload = tc.decode(push)[mesh.uid("web-1")]
        assert (workload.name, workload.namespace, workload.node, ip_of(workload)) == (
            "web-1",
            mesh.apps,
            NODE,
            "10.20.0.11",
        )
        # Another pod changing IP: only that pod is pushed, at its new address.
        mesh.status("web-1", "10.20.0.12")
        push = await next_of(stream, tc.ADDRESS)
        assert list(tc.decode(push)) == [mesh.uid("web-1")]
        assert ip_of(tc.decode(push)[mesh.uid("web-1")]) == "10.20.0.12"
        mesh.delete_pod("web-1")
        push = await next_of(stream, tc.ADDRESS)
        if push.resources:  # first it is terminating: no longer a healthy endpoint
            assert tc.decode(push)[mesh.uid("web-1")].status == 1  # UNHEALTHY
            push = await next_of(stream, tc.ADDRESS)
        assert (list(push.resources), list(push.removed_resources)) == ([], [mesh.uid("web-1")])
        await stream.close()
        await channel.close()

    run(scenario())


def test_a_policy_change_is_pushed_and_a_nack_is_not_answered_with_the_same_version(mesh):
    async def scenario():
        mesh.pod("db-1", "10.20.0.21")  # on this node: its namespace's policies concern us
        channel, stream, _ = await opened(mesh)
        before = mesh.plane.metric("pilot_total_xds_rejects_total", type="Authorization")
        mesh.policy(
            "deny-9999", {"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["9999"]}}]}]}
        )
        push = await next_of(stream, tc.AUTHORIZATION)
        policy = tc.decode(push)[f"{mesh.apps}/deny-9999"]
        assert (policy.action, list(policy.rules[0].clauses[0].matches[0].destination_ports)) == (
            1,
            [9999],
        )
        # Changed: pushed again, and refused by the client this time.
        mesh.policy(
            "deny-9999",
            {"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["8888"]}}]}]},
            replace=True,
        )
        while True:
            push = await stream.recv(timeout=15)
            if push.type_url == tc.AUTHORIZATION:
                break
            await stream.ack(push)
        await stream.nack(push, f"{mesh.apps}/deny-9999: refused by the test")
        # Something else changes: the refused version is not sent again.
        mesh.status("db-1", "10.20.0.22")
        address = await next_of(stream, tc.ADDRESS)
        assert list(tc.decode(address)) == [mesh.uid("db-1")]
        with pytest.raises(TimeoutError):
            await next_of(stream, tc.AUTHORIZATION, timeout=1.5)
        # A newer version is.
        mesh.policy(
            "deny-9999",
            {"action": "DENY", "rules": [{"to": [{"operation": {"ports": ["7777"]}}]}]},
            replace=True,
        )
        push = await next_of(stream, tc.AUTHORIZATION)
        ports = (
            tc.decode(push)[f"{mesh.apps}/deny-9999"]
            .rules[0]
            .clauses[0]
            .matches[0]
            .destination_ports
        )
        assert list(ports) == [7777]
        assert (
            mesh.plane.metric("pilot_total_xds_rejects_total", type="Authorization") == before + 1
        )
        await stream.close()
        await channel.close()

    run(scenario())


def test_a_reconnect_with_initial_versions_gets_only_the_difference(mesh):
    async def scenario():
        mesh.pod("r-1", "10.20.0.31")
        mesh.pod("r-2", "10.20.0.32")
        channel, stream, first = await opened(mesh)
        held = {r.name: r.version for r in first[tc.ADDRESS].resources}
        assert {mesh.uid("r-1"), mesh.uid("r-2")} <= set(held)
        await stream.close()
        await channel.close()
        mesh.status("r-1", "10.20.0.33")
        mesh.delete_pod("r-2")
        await asyncio.sleep(1.0)  # the control plane has seen both
        channel, stream = await mesh.stream()
        await stream.subscribe(tc.ADDRESS, node=tc.ztunnel_node(), initial=held)
        again = await stream.recv(timeout=15)
        assert list(tc.decode(again)) == [mesh.uid("r-1")]
        assert mesh.uid("r-2") in again.removed_resources
        await stream.close()
        await channel.close()

    run(scenario())


def test_on_demand_lookup_by_address(mesh):
    async def scenario():
        mesh.pod("od-1", "10.20.0.41", node="node-od")
        mesh.pod("od-local", "10.20.0.42")  # on the node proxy's node
        await asyncio.sleep(0.5)
        channel, stream = await mesh.stream()
        await stream.subscribe(tc.ADDRESS, ["*"], unsubscribe=["*"], node=tc.ztunnel_node())
        first = await stream.recv(timeout=15)
        # istiod's on-demand rule: the proxy's node's workloads come unasked (ztunnel waits for
        # its own and never asks), nothing else.
        local = set(tc.decode(first))
        assert mesh.uid("od-local") in local
        assert mesh.uid("od-1") not in local
        await stream.ack(first)
        await stream.subscribe(tc.ADDRESS, ["/10.20.0.41"])
        found = await stream.recv(timeout=15)
        assert sorted(tc.decode(found)) == sorted(["/10.20.0.41", mesh.uid("od-1")])
        await stream.subscribe(tc.ADDRESS, ["/10.20.0.49"])
        missing = await stream.recv(timeout=15)
        assert list(missing.removed_resources) == ["/10.20.0.49"]
        await stream.close()
        await channel.close()

    run(scenario())


def test_a_sidecar_gets_every_workload_but_only_its_own_pods_policies(mesh):
    async def scenario():
        token = cp.pod_token(mesh.cluster, mesh.apps, "client", "client-1", node="node-b")
        mesh.status("client-1", "10.20.0.51")
        mesh.pod("elsewhere", "10.20.0.52", node="node-c", labels={"app": "other"})
        mesh.policy("only-other", {"selector": {"matchLabels": {"app": "other"}}, "rules": [{}]})
        mesh.policy(
            "ns-wide", {"action": "DENY", "rules": [{"from": [{"source": {"namespaces": ["x"]}}]}]}
        )
        await asyncio.sleep(1.0)
        channel, stream, first = await opened(mesh, token=token)
        names = set(tc.decode(first[tc.AUTHORIZATION]))
        assert f"{mesh.apps}/ns-wide" in names
        assert f"{mesh.apps}/only-other" not in names
        assert {mesh.uid("client-1"), mesh.uid("elsewhere")} <= set(tc.decode(first[tc.ADDRESS]))
        await stream.close()
        await channel.close()

    run(scenario())


def test_a_caller_without_a_valid_token_is_refused(mesh):
    async def scenario():
        channel, stream = await mesh.stream(token="not-a-token")
        await stream.subscribe(tc.ADDRESS, node=tc.ztunnel_node())
        with pytest.raises(grpc.aio.AioRpcError) as refused:
            await stream.recv(timeout=15)
        assert refused.value.code() is grpc.StatusCode.UNAUTHENTICATED
        await channel.close()

    run(scenario())
