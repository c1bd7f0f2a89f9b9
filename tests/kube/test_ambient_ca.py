"""The node proxy with no files at all: each enrolled pod's certificate from the mesh CA by
impersonation (its own token, bound to its own pod on the node; the pod's SPIFFE id as
``ImpersonatedIdentity``) and the workloads from discovery, both from ``meshctl controlplane
run``; the pods' tunnels carry the pods' identities, never the node proxy's. Real kube-apiserver,
real TokenReview, real CNI chain; the node agent's annotation is what makes discovery say HBONE.
"""

from __future__ import annotations

import contextlib
import secrets
from pathlib import Path

import pytest
from cryptography import x509
from kubernetes import client as k8s

from tests.harness import controlplane as cp
from tests.harness.kube import (
    CniError,
    KubeCluster,
    create_namespace,
    delete_namespace,
    forward_into,
    kubelet_node,
)
from tests.harness.wait import eventually
from tests.kube.ambient_support import (
    APP,
    AmbientKubeNode,
    agent_rbac,
    identities,
    opened,
    pod,
    prepare_nodes,
    proxy_of,
)
from tests.netns.ztunnel_harness import EchoServer, echo_roundtrip

pytestmark = [pytest.mark.kube, pytest.mark.netns]

CA_PORT = 15012
ZTUNNEL_SA = "meshctl-ztunnel"


@pytest.fixture
def ca_node(kube_cluster: KubeCluster, kube_api, netns_factory, tmp_path: Path, kube_namespace):
    """One ambient node whose proxy gets pod certificates from a running control plane."""
    # Short: the control plane's serving certificate names <service>.<namespace>.svc in its CN.
    home = f"cp-{secrets.token_hex(3)}"
    create_namespace(kube_api, home)
    with contextlib.ExitStack() as stack:
        stack.callback(delete_namespace, kube_api, home)
        kubelet = stack.enter_context(kubelet_node(kube_cluster, kube_api, netns_factory))
        plane = cp.start(
            kube_cluster, home, tmp_path, "--trusted-node-accounts", f"{home}/{ZTUNNEL_SA}"
        )
        stack.callback(plane.stop)
        root = tmp_path / "root-cert.pem"  # what the meshctl-ca-root-cert volume holds
        root.write_bytes(cp.root_pem(kube_api, home))
        # The node proxy's own pod and token: a ztunnel pod bound to this node.
        token = cp.pod_token(
            kube_cluster,
            home,
            ZTUNNEL_SA,
            f"ztunnel-{secrets.token_hex(3)}",
            node=kubelet.node_name,
        )
        token_file = tmp_path / "ztunnel.token"
        token_file.write_text(token)
        stack.enter_context(forward_into(kubelet.node, plane.grpc_port, ("127.0.0.1", CA_PORT)))
        stack.enter_context(agent_rbac(kube_api, kube_namespace))
        (node,) = prepare_nodes(kube_cluster, [kubelet], tmp_path, kube_namespace)
        node.start_agent()
        node.read_conflist()
        stack.callback(node.stop_agent)
        node.start_proxy(
            extra=(
                *("--ca-address", f"127.0.0.1:{CA_PORT}", "--ca-root", str(root)),
                *("--xds-address", f"127.0.0.1:{CA_PORT}", "--xds-root-ca", str(root)),
                *("--token-file", str(token_file), "--secret-ttl", "1h"),
            ),
            env={"ALT_CA_HOSTNAME": plane.server_name, "ALT_XDS_HOSTNAME": plane.server_name},
            discovery=True,
        )
        stack.callback(proxy_of(node).stop)

        def pods_first() -> None:
            with contextlib.suppress(CniError):
                kubelet.close()  # sandboxes first: their CNI DEL needs the installed plugin

        stack.callback(pods_first)
        yield node, plane, root


def test_pod_identities_from_the_ca_and_workloads_from_discovery(
    ca_node: tuple[AmbientKubeNode, cp.ControlPlaneProcess, Path], kube_api, mesh_namespace: str
):
    node, _plane, root = ca_node
    ns = mesh_namespace
    core = k8s.CoreV1Api(kube_api)
    core.create_namespaced_pod(ns, pod("client", sa="client"))
    core.create_namespaced_pod(ns, pod("server", sa="server"))
    client = node.run_pod(ns, "client")
    server = node.run_pod(ns, "server")
    proxy = proxy_of(node)

    def discovered() -> bool:  # both pods, as HBONE: the agent's annotation reached the API
        found = {w["name"]: w for w in proxy.config_dump()["workloads"]}
        return all(found.get(n, {}).get("protocol") == "HBONE" for n in ("client", "server"))

    eventually("workloads from discovery", discovered, 30)

    def issued() -> bool:
        state = proxy.config_dump()["workloadState"]
        return all(s["certificate"].get("state") == "Available" for s in state.values())

    eventually("certificates from the CA", issued, 20)
    state = proxy.config_dump()["workloadState"]
    mesh_root = x509.load_pem_x509_certificate(root.read_bytes())
    for uid, sa in ((client.uid, "client"), (server.uid, "server")):
        chain = state[uid]["certificate"]["certChain"]
        assert chain[0]["uriSans"] == [f"spiffe://cluster.local/ns/{ns}/sa/{sa}"]
        assert state[uid]["certificate"]["rootCerts"][0]["serialNumber"] == str(
            mesh_root.serial_number  # decimal, as ztunnel writes serial numbers
        )
    # Only the pods' identities: the proxy's own account signs nothing and carries nothing.
    assert f"sa/{ZTUNNEL_SA}" not in str(proxy.config_dump())
    echo = EchoServer(server.netns, server.ip, APP)
    try:
        assert echo_roundtrip(client.netns, (server.ip, APP), b"from the CA")[32:] == b"from the CA"
        ids = identities(ns)
        assert opened(node, "destination", ids) == 1  # the server saw the client pod's identity
        assert f"sa/{ZTUNNEL_SA}" not in proxy.metrics()
    finally:
        echo.close()
