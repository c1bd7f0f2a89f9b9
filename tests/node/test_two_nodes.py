"""Two real nodes (tests/harness/node2.py): pods on each, traffic between them on a link we watch.

Node 1 is the session's node (the host), node 2 its own kubelet, containerd and kube-proxy in a
network and mount namespace of its own; every packet between the nodes crosses the veth
``mtnode2h``, where an AF_PACKET capture sees it. In order, on one ``meshctl install --profile
ambient`` (the default profile plus the node proxy: sidecar injection and ambient both):
- without the mesh, a pod on each node reaches a pod on the other, and the capture on the link
  shows the request and the answer in plain text (the capture sees cross-node traffic);
- the CNI DaemonSet and the node proxy run Ready on both nodes, each node's agent put our entry
  into *its own* node's CNI config, and ``meshctl verify`` is all green counting two nodes;
- an ambient client on node 1 reaches a server on node 2, and a sidecar client on node 1 a
  sidecar server on node 2: on the link only HBONE to :15008, every byte inside TLS records, no
  byte of the request or the answer; the proxies count the connection as mutual TLS;
- the CA's node check with two real node proxies: each gets the certificate of a pod on its own
  node and is refused that of a pod on the other node (the refusal names its node);
- draining node 2 (cordon, its server pod deleted with a grace period) loses at most the one
  request in flight of an ambient client on node 1 asking a Service backed by both nodes;
- node 2 stops without a trace, node 1 running on.
"""

from __future__ import annotations

import asyncio
import json
import secrets
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s

from meshctl import rpc
from meshctl.core.k8s import ambient
from meshctl.core.k8s.cni.spec import PLUGIN_TYPE
from tests.harness import controlplane as cp
from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.mesh_install import Mesh, failing, installed
from tests.harness.node import (
    CNI_CONF_DIR,
    CONFLIST_NAME,
    NODE_IP,
    NODE_NAME,
    TestNode,
    report_namespace,
)
from tests.harness.node2 import (
    CGROUP_PARENT,
    GUARD_COMMENT,
    LINK_HOST,
    NODE2_NETWORK,
    PRIVATE_PATHS,
    WORKDIR2,
    SecondNode,
    private_dir,
)
from tests.netns.ztunnel_harness import Segment, Sniffer
from tests.node.test_webhook_on_node import tls_records

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"
APP_PORT = 8080
HBONE_PORT = 15008
CNI_CHECK = "meshctl-cni: our entry is in every node's CNI config"
NODE_PROXY_CHECK = "meshctl-ztunnel: node proxy is ready on every node"


@pytest.fixture(scope="module")
def two_nodes(kube_node: TestNode) -> Iterator[SecondNode]:
    second = SecondNode(kube_node).start()
    print(f"node 2 Ready and its kube-proxy serving {second.start_seconds:.1f} s after its start")
    try:
        yield second
    finally:
        second.stop()


@pytest.fixture(scope="module")
def mesh(kube_node: TestNode, two_nodes: SecondNode) -> Iterator[Mesh]:
    # Both nodes' containerd pin pod netns at this path (node 2's directory is bound there).
    netns_dir = nodehost.WORKDIR / "containerd" / "state"
    values = ["--set", f"components.cni.netnsDir={netns_dir}"]
    with installed(Mesh(kube_node, "ambient", values)) as installed_mesh:
        yield installed_mesh


def echo_server(name: str, image: str, node: str, **spec: Any) -> dict[str, Any]:
    """Answers one line with ``served-<line> by <pod>`` (nc hands the connection to sh)."""
    command = [
        "nc",
        "-ll",
        "-p",
        str(APP_PORT),
        "-e",
        "sh",
        "-c",
        "read l; echo served-$l by $HOSTNAME",
    ]
    return wl.busybox_pod(name, image, command, nodeName=node, **spec)


def client(name: str, image: str, node: str, **spec: Any) -> dict[str, Any]:
    return wl.busybox_pod(name, image, ["sleep", "3600"], nodeName=node, **spec)


def ask(api: Any, namespace: str, pod: str, ip: str, token: str, container: str = "main") -> str:
    argv = ["sh", "-c", f"echo {token} | nc -w 3 {ip} {APP_PORT}"]
    return str(wl.pod_exec(api, namespace, pod, argv, container=container, timeout=20).stdout)


def answered(api: Any, namespace: str, pod: str, ip: str, token: str, **kw: Any) -> bool:
    return f"served-{token}" in ask(api, namespace, pod, ip, token, **kw)


def between(segments: list[Segment], a: str, b: str) -> list[Segment]:
    return [s for s in segments if {s.src[0], s.dst[0]} == {a, b} and s.payload]


def start_pods(api: Any, namespace: str, pods: list[dict[str, Any]]) -> dict[str, Any]:
    core = k8s.CoreV1Api(api)
    for pod in pods:
        core.create_namespaced_pod(namespace, pod)
    names = [p["metadata"]["name"] for p in pods]
    return {n: wl.wait_pod_ready(api, namespace, n, timeout=180) for n in names}


def test_pods_on_both_nodes_talk_across_the_link_in_plain_text(
    kube_node: TestNode, two_nodes: SecondNode, node_namespace: str
):
    image = kube_node.image("busybox")
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        nodes = {n.metadata.name: n for n in core.list_node().items}
        assert set(nodes) == {NODE_NAME, two_nodes.name}
        for name, ip in ((NODE_NAME, NODE_IP), (two_nodes.name, two_nodes.ip)):
            addresses = {a.type: a.address for a in nodes[name].status.addresses}
            assert addresses["InternalIP"] == ip, addresses
        running = start_pods(
            api,
            node_namespace,
            [
                echo_server("server-1", image, NODE_NAME),
                echo_server("server-2", image, two_nodes.name),
                client("client-1", image, NODE_NAME),
                client("client-2", image, two_nodes.name),
            ],
        )
        ip = {n: p.status.pod_ip for n, p in running.items()}
        for name, pod in running.items():
            on_two = name.endswith("-2")
            assert pod.spec.node_name == (two_nodes.name if on_two else NODE_NAME)
            assert pod.status.host_ip == (two_nodes.ip if on_two else NODE_IP)
            assert (ip[name] in [str(a) for a in NODE2_NETWORK]) == on_two, ip
        token_12, token_21 = secrets.token_hex(8), secrets.token_hex(8)
        sniffer = Sniffer(None, LINK_HOST)
        try:
            assert answered(api, node_namespace, "client-1", ip["server-2"], token_12)
            assert answered(api, node_namespace, "client-2", ip["server-1"], token_21)
        finally:
            segments = sniffer.stop()
    wire = b"".join(s.payload for s in between(segments, ip["client-1"], ip["server-2"]))
    assert token_12.encode() in wire
    assert f"served-{token_12}".encode() in wire
    wire = b"".join(s.payload for s in between(segments, ip["client-2"], ip["server-1"]))
    assert token_21.encode() in wire
    assert f"served-{token_21}".encode() in wire


def test_cni_agent_and_node_proxy_run_on_both_nodes_and_verify_counts_both(
    kube_node: TestNode, two_nodes: SecondNode, mesh: Mesh
):
    with kube_node.cluster.api_client() as api:
        system = wl.pods(api, SYSTEM_NS)
    for selector in ("app.kubernetes.io/name=meshctl-cni-node",
                     "app.kubernetes.io/name=meshctl-ztunnel"):  # fmt: skip
        name = selector.split("=")[1]
        on = sorted(
            p.spec.node_name
            for p in system
            if (p.metadata.labels or {}).get("app.kubernetes.io/name") == name and wl.pod_ready(p)
        )
        assert on == sorted([NODE_NAME, two_nodes.name]), (selector, on)
    # Each node's agent wrote into its own node's conflist (node 2's is private to node 2).
    for conflist in (CNI_CONF_DIR / CONFLIST_NAME, private_dir("/etc/cni/net.d") / CONFLIST_NAME):
        plugins = json.loads(conflist.read_text())["plugins"]
        assert [p["type"] for p in plugins][-1] == PLUGIN_TYPE, (conflist, plugins)
    bridges = {
        path: json.loads(path.read_text())["plugins"][0]["bridge"]
        for path in (CNI_CONF_DIR / CONFLIST_NAME, private_dir("/etc/cni/net.d") / CONFLIST_NAME)
    }
    assert len(set(bridges.values())) == 2, bridges
    code, checks, printed = mesh.verify()
    assert code == 0, printed
    assert not failing(checks), printed
    assert checks[CNI_CHECK]["result"] == "success", printed
    assert checks[CNI_CHECK]["message"] == "2 nodes", checks[CNI_CHECK]
    assert checks[NODE_PROXY_CHECK]["result"] == "success", printed


def assert_tls_only(segments: list[Segment], client_ip: str, server_ip: str, tokens: list[str]):
    wire = between(segments, client_ip, server_ip)
    assert wire, "the capture on the link saw nothing between the pods"
    for s in wire:
        assert HBONE_PORT in (s.src[1], s.dst[1]), f"not HBONE: {s.src} -> {s.dst}"
    up = tls_records(b"".join(s.payload for s in wire if s.src[0] == client_ip))
    down = tls_records(b"".join(s.payload for s in wire if s.src[0] == server_ip))
    assert 22 in up, up  # the handshake...
    assert 23 in up, up  # ...then application data, both ways
    assert 23 in down, down
    everything = b"".join(s.payload for s in segments)
    for token in tokens:
        assert token.encode() not in everything, f"{token} in plain text on the link"


def mtls_connections(api: Any, namespace: str, pod_port: str, client_id: str, server_id: str):
    """istio_tcp_connections_opened_total with mutual TLS between the two identities, summed
    over the metrics of ``pod_port`` (``<pod>:15020`` in ``namespace``)."""
    text = k8s.CoreV1Api(api).connect_get_namespaced_pod_proxy_with_path(
        pod_port, namespace, "stats/prometheus"
    )
    total = 0.0
    for line in str(text).splitlines():
        if (
            line.startswith("istio_tcp_connections_opened_total")
            and f'source_principal="{client_id}"' in line
            and f'destination_principal="{server_id}"' in line
            and 'connection_security_policy="mutual_tls"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total


def talk_across(api: Any, namespace: str, client_ip: str, server_ip: str, container: str) -> None:
    """The client asks until it is answered (discovery carries both pods as meshed), then once
    more; the capture spans all of it, so it holds the connection's TLS handshake (the proxies
    pool HBONE connections) and every request and answer."""
    tokens: list[str] = []
    sniffer = Sniffer(None, LINK_HOST)
    try:
        deadline = time.monotonic() + 90
        while True:
            tokens.append(secrets.token_hex(8))
            if answered(api, namespace, "client", server_ip, tokens[-1], container=container):
                break
            assert time.monotonic() < deadline, "the client on node 1 never reached node 2's server"
            time.sleep(1)
        tokens.append(secrets.token_hex(8))
        assert answered(api, namespace, "client", server_ip, tokens[-1], container=container)
    finally:
        segments = sniffer.stop()
    assert_tls_only(segments, client_ip, server_ip, [*tokens, *(f"served-{t}" for t in tokens)])


def test_ambient_pods_on_two_nodes_talk_only_mtls_on_the_link(
    kube_node: TestNode, two_nodes: SecondNode, mesh: Mesh, node_namespace: str, request
):
    report_namespace(request.node, SYSTEM_NS)
    image = kube_node.image("busybox")
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.patch_namespace(
            node_namespace, {"metadata": {"labels": {ambient.DATAPLANE_MODE: ambient.MODE_AMBIENT}}}
        )
        for sa in ("client", "server"):
            core.create_namespaced_service_account(node_namespace, {"metadata": {"name": sa}})
        running = start_pods(
            api,
            node_namespace,
            [
                echo_server("server", image, two_nodes.name, serviceAccountName="server"),
                client("client", image, NODE_NAME, serviceAccountName="client"),
            ],
        )
        for name in running:
            wl.retry(
                lambda n=name: core.read_namespaced_pod(n, node_namespace),
                lambda p: (p.metadata.annotations or {}).get(ambient.REDIRECTION) == "enabled",
                timeout=60,
            )
        client_ip, server_ip = (running[n].status.pod_ip for n in ("client", "server"))
        talk_across(api, node_namespace, client_ip, server_ip, "main")
        client_id = f"spiffe://cluster.local/ns/{node_namespace}/sa/client"
        server_id = f"spiffe://cluster.local/ns/{node_namespace}/sa/server"
        proxies = {
            p.spec.node_name: p.metadata.name
            for p in wl.pods(api, SYSTEM_NS, "app.kubernetes.io/name=meshctl-ztunnel")
        }
        # Node 1's proxy opened it, node 2's accepted it: both count it as mutual TLS.
        for node in (NODE_NAME, two_nodes.name):
            opened = mtls_connections(
                api, SYSTEM_NS, f"{proxies[node]}:15020", client_id, server_id
            )
            assert opened > 0, node


def test_sidecar_pods_on_two_nodes_talk_only_mtls_on_the_link(
    kube_node: TestNode, two_nodes: SecondNode, mesh: Mesh, node_namespace: str, request
):
    report_namespace(request.node, SYSTEM_NS)
    image = kube_node.image("busybox")
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.patch_namespace(
            node_namespace, {"metadata": {"labels": {"istio-injection": "enabled"}}}
        )
        for sa in ("client", "server"):
            core.create_namespaced_service_account(node_namespace, {"metadata": {"name": sa}})
        running = start_pods(
            api,
            node_namespace,
            [
                echo_server("server", image, two_nodes.name, serviceAccountName="server"),
                client("client", image, NODE_NAME, serviceAccountName="client"),
            ],
        )
        for pod in running.values():
            names = [c.name for c in [*(pod.spec.init_containers or []), *pod.spec.containers]]
            assert "istio-proxy" in names, names
        client_ip, server_ip = (running[n].status.pod_ip for n in ("client", "server"))
        talk_across(api, node_namespace, client_ip, server_ip, "main")
        client_id = f"spiffe://cluster.local/ns/{node_namespace}/sa/client"
        server_id = f"spiffe://cluster.local/ns/{node_namespace}/sa/server"
        opened = mtls_connections(api, node_namespace, "server:15020", client_id, server_id)
        assert opened > 0


def node_proxy_token(api: Any, pod: Any) -> str:
    """What the kubelet projects into the node proxy: a token of its ServiceAccount for the
    CA's audience, bound to that very pod (so the CA learns the pod's node)."""
    request = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {
            "audiences": ["istio-ca"],
            "expirationSeconds": 600,
            "boundObjectRef": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": pod.metadata.name,
                "uid": pod.metadata.uid,
            },
        },
    }
    answer = k8s.CoreV1Api(api).create_namespaced_service_account_token(
        pod.spec.service_account_name, SYSTEM_NS, request
    )
    return str(answer.status.token)


def test_a_node_proxy_gets_certificates_only_for_pods_on_its_own_node(
    kube_node: TestNode, two_nodes: SecondNode, mesh: Mesh, node_namespace: str
):
    image = kube_node.image("busybox")
    nodes = {"one": NODE_NAME, "two": two_nodes.name}
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        for sa in nodes:
            core.create_namespaced_service_account(node_namespace, {"metadata": {"name": sa}})
        start_pods(
            api,
            node_namespace,
            [client(f"on-{sa}", image, node, serviceAccountName=sa) for sa, node in nodes.items()],
        )
        proxies = {
            p.spec.node_name: p
            for p in wl.pods(api, SYSTEM_NS, "app.kubernetes.io/name=meshctl-ztunnel")
        }
        tokens = {node: node_proxy_token(api, proxies[node]) for node in nodes.values()}
        (ca,) = wl.pods(api, SYSTEM_NS, "app.kubernetes.io/name=meshctl-controlplane")
        root = (
            core.read_namespaced_config_map("meshctl-ca-root-cert", SYSTEM_NS)
            .data["root-cert.pem"]
            .encode()
        )

    async def ask_ca(token: str, account: str) -> tuple[str, str]:
        identity = f"spiffe://cluster.local/ns/{node_namespace}/sa/{account}"
        csr_pem, _ = cp.csr(identity)
        auth = rpc.CallAuth(token=token, cluster_id="Kubernetes")
        channel = rpc.connect(
            f"{ca.status.pod_ip}:15012",
            root_pem=root,
            auth=auth,
            server_name=f"meshctl-controlplane.{SYSTEM_NS}.svc",
        )
        async with channel:
            return await cp.status_of(channel, csr_pem, impersonate=identity)

    for sa, node in nodes.items():
        # Its own node's pod: issued; the other node's pod: refused, naming the caller's node.
        assert asyncio.run(ask_ca(tokens[node], sa)) == ("OK", ""), (node, sa)
        other = "two" if sa == "one" else "one"
        code, message = asyncio.run(ask_ca(tokens[node], other))
        assert code == "UNAUTHENTICATED", (node, other, code, message)
        assert message.startswith("request impersonation authentication failure: "), message
        assert "no pod of service account" in message, message
        assert node in message, message


def test_draining_node_2_loses_no_request_of_a_client_on_node_1(
    kube_node: TestNode, two_nodes: SecondNode, mesh: Mesh, node_namespace: str, request
):
    """An ambient client on node 1 asks a Service backed by a pod on each node, one request at
    a time, while node 2 is drained (cordoned, its pod deleted with a grace period in which it
    still serves, as a preStop hook would have it): at most the one request in flight fails,
    and only node 1's pod answers after the drain (both answered before it)."""
    report_namespace(request.node, SYSTEM_NS)
    image = kube_node.image("busybox")
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        core.patch_namespace(
            node_namespace, {"metadata": {"labels": {ambient.DATAPLANE_MODE: ambient.MODE_AMBIENT}}}
        )
        core.create_namespaced_service_account(node_namespace, {"metadata": {"name": "web"}})
        servers = [
            echo_server(f"web-{n}", image, node, serviceAccountName="web",
                        terminationGracePeriodSeconds=10)
            for n, node in (("1", NODE_NAME), ("2", two_nodes.name))
        ]  # fmt: skip
        for server in servers:
            server["metadata"]["labels"] = {"app": "web"}
        start_pods(api, node_namespace, [*servers, client("client", image, NODE_NAME)])
        service = {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": APP_PORT}]},
        }
        vip = core.create_namespaced_service(node_namespace, service).spec.cluster_ip
        seen: set[str] = set()
        deadline = time.monotonic() + 90  # until discovery carries the Service and both pods
        while seen != {"web-1", "web-2"}:
            assert time.monotonic() < deadline, f"answers only from {seen}"
            answer = ask(api, node_namespace, "client", vip, secrets.token_hex(4))
            seen.update(w for w in ("web-1", "web-2") if answer.strip().endswith(f"by {w}"))
        loop = (
            "i=0; while [ $i -lt 80 ]; do"
            f' echo "$i $(echo $i | nc -w 2 {vip} {APP_PORT})"; i=$((i+1)); sleep 0.1; done'
        )
        answers: list[str] = []

        def ask_in_a_loop() -> None:
            done = wl.pod_exec(api, node_namespace, "client", ["sh", "-c", loop], timeout=180)
            answers.extend(done.stdout.splitlines())

        asker = threading.Thread(target=ask_in_a_loop)
        asker.start()
        time.sleep(3)
        core.patch_node(two_nodes.name, {"spec": {"unschedulable": True}})
        try:
            core.delete_namespaced_pod("web-2", node_namespace)
            drained_while_asking = asker.is_alive()
            asker.join(200)
        finally:
            core.patch_node(two_nodes.name, {"spec": {"unschedulable": False}})
    assert len(answers) == 80, answers
    by = [line.split(" by ")[-1] if " by " in line else "" for line in answers]
    failed = [a for a, b in zip(answers, by, strict=True) if not b]
    print(f"drain of node 2: {len(failed)} of {len(answers)} requests failed: {failed}")
    assert len(failed) <= 1, failed  # only the one in flight may be lost
    assert drained_while_asking, "the client's requests ended before node 2 was drained"
    # Once node 2's pod stopped answering, node 1's alone did (the last requests all of them).
    last_web2 = max((i for i, b in enumerate(by) if b == "web-2"), default=-1)
    assert set(by[last_web2 + 1 :]) <= {"web-1", ""}, by
    assert by[-20:] == ["web-1"] * 20, by


def test_node_2_stops_without_leaving_anything(kube_node: TestNode, two_nodes: SecondNode):
    """Node 2's mounts never reached the host; its stop (the fixture's, run early here) leaves
    no process, link, guard rule, cgroup, directory, pod or Node object of it; node 1 runs on."""
    assert nodehost.mounts_under([*PRIVATE_PATHS, str(WORKDIR2)]) == []
    assert two_nodes.ns is not None
    holder = two_nodes.ns.pid
    two_nodes.stop()
    assert not Path(f"/proc/{holder}").exists()
    assert not Path(f"/sys/class/net/{LINK_HOST}").exists()
    guard = nodehost._run(["nft", "list", "table", "inet", nodehost.GUARD_TABLE]).stdout
    assert GUARD_COMMENT not in guard, guard
    assert nodehost.guard_in_place()  # node 1's guard, as it was before node 2
    assert not WORKDIR2.exists()
    assert not any((h / CGROUP_PARENT).exists() for h in nodehost.hierarchies())
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        assert [n.metadata.name for n in core.list_node().items] == [NODE_NAME]
        left = core.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={two_nodes.name}")
        assert left.items == []
