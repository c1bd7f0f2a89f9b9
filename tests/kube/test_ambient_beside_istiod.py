"""meshctl's node proxy as the ``ambient-istiod`` profile renders it, against a stand-in named as
istiod (real kube-apiserver, real CNI chain, the node agent and the node proxy on one node).

The stand-in is meshctl's control plane with istiod's names and the istiod chart's values the
docs say to set (``trustedZtunnelNamespace``/``trustedZtunnelName`` for our node proxy's
account, the root published as ``istio-ca-root-cert``, ``istiod.istio-system.svc`` in its
certificate). The node proxy takes what the rendered DaemonSet gives it: the root from the
ConfigMap its volume names, a token of its service account for the rendered audience, the CA
and discovery checked by the host of the rendered address. Only the address is translated (no
cluster DNS here): the node's 127.0.0.1:15012 forwards to the stand-in, and the name the proxy
checks is that host's (``ALT_CA_HOSTNAME``), as when it dials the name.
"""

from __future__ import annotations

import contextlib
import secrets
from pathlib import Path
from typing import Any

import pytest
from cryptography import x509
from kubernetes import client as k8s

from meshctl import components
from meshctl.core.k8s.install.manifest import render
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
from tests.kube.ambient_support import agent_rbac, pod, prepare_nodes, proxy_of

pytestmark = [pytest.mark.kube, pytest.mark.netns]

PORT = 15012


def rendered_proxy(namespace: str) -> tuple[dict[str, str], dict[str, Any]]:
    """The node proxy's env and pod spec as ``--profile ambient-istiod`` renders them."""
    registry = components.load()
    values = registry.resolve(profile="ambient-istiod", namespace=namespace)
    objects = [item.object for item in render(registry, values)]
    assert not any(o["kind"] == "Deployment" for o in objects)  # no control plane of ours
    daemonset = next(
        o
        for o in objects
        if o["kind"] == "DaemonSet" and o["metadata"]["name"] == "meshctl-ztunnel"
    )
    spec = daemonset["spec"]["template"]["spec"]
    env = {e["name"]: e["value"] for e in spec["containers"][0]["env"] if "value" in e}
    return env, spec


def istiod_stand_in_env(proxy_account: str) -> dict[str, str]:
    """What the stand-in renders with istiod's names and the istiod chart's values for us."""
    registry = components.load()
    sets = [
        "components.controlplane.rootConfigMapAliases=istio-ca-root-cert",
        "components.controlplane.istiodServiceNamespace=istio-system",
        *(f"components.controlplane.trustedZtunnel{k}={v}" for k, v in zip(
            ("Namespace", "Name"), proxy_account.split("/"), strict=True
        )),
    ]  # fmt: skip
    values = registry.resolve(profile="minimal", assignments=sets)
    deployment = next(
        i.object for i in render(registry, values) if i.object["kind"] == "Deployment"
    )
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    wanted = ("CA_TRUSTED_NODE_ACCOUNTS", "MESHCTL_ROOT_CONFIGMAP_ALIASES", "MESHCTL_SERVING_NAMES")
    return {e["name"]: e["value"] for e in container["env"] if e["name"] in wanted}


@pytest.fixture
def beside_istiod(
    kube_cluster: KubeCluster, kube_api, netns_factory, tmp_path: Path, kube_namespace
):
    home = f"amb-{secrets.token_hex(3)}"  # the install's namespace (the proxy's account)
    plane_ns = f"istiod-{secrets.token_hex(3)}"
    env, spec = rendered_proxy(home)
    volumes = {v["name"]: v for v in spec["volumes"]}
    root_map = volumes["istiod-ca-cert"]["configMap"]["name"]
    audience = volumes["istio-token"]["projected"]["sources"][0]["serviceAccountToken"]["audience"]
    account = spec["serviceAccountName"]
    host, _, port = env["CA_ADDRESS"].rpartition(":")
    assert (env["XDS_ADDRESS"], port) == (env["CA_ADDRESS"], str(PORT))
    for namespace in (home, plane_ns):
        create_namespace(kube_api, namespace)
    with contextlib.ExitStack() as stack:
        for namespace in (home, plane_ns):
            stack.callback(delete_namespace, kube_api, namespace)
        stack.callback(cp.remove_published_roots, kube_api)
        stack.callback(remove_istio_roots, kube_api)
        kubelet = stack.enter_context(kubelet_node(kube_cluster, kube_api, netns_factory))
        plane_env = istiod_stand_in_env(f"{home}/{account}")
        names = ",".join(["127.0.0.1", plane_env.pop("MESHCTL_SERVING_NAMES")])
        plane = cp.start(
            kube_cluster, plane_ns, tmp_path, "--serving-names", names, revision="default",
            env=plane_env,
        )  # fmt: skip
        stack.callback(plane.stop)

        def published() -> bytes | None:
            with contextlib.suppress(k8s.ApiException):
                found = k8s.CoreV1Api(kube_api).read_namespaced_config_map(root_map, home)
                return (found.data or {}).get("root-cert.pem", "").encode() or None
            return None

        eventually(f"{root_map} in {home}", lambda: published() is not None, 30)
        root = tmp_path / "root-cert.pem"  # what the istiod-ca-cert volume holds
        root.write_bytes(published() or b"")
        token = cp.pod_token(
            kube_cluster, home, account, f"ztunnel-{secrets.token_hex(3)}",
            audience=audience, node=kubelet.node_name,
        )  # fmt: skip
        token_file = tmp_path / "istio-token"
        token_file.write_text(token)
        stack.enter_context(forward_into(kubelet.node, plane.grpc_port, ("127.0.0.1", PORT)))
        stack.enter_context(agent_rbac(kube_api, kube_namespace))
        (node,) = prepare_nodes(kube_cluster, [kubelet], tmp_path, kube_namespace)
        node.start_agent()
        node.read_conflist()
        stack.callback(node.stop_agent)
        address = f"127.0.0.1:{PORT}"
        node.start_proxy(
            extra=(
                *("--ca-address", address, "--ca-root", str(root)),
                *("--xds-address", address, "--xds-root-ca", str(root)),
                *("--token-file", str(token_file), "--secret-ttl", "1h"),
            ),
            env={"ALT_CA_HOSTNAME": host, "ALT_XDS_HOSTNAME": host},
            discovery=True,
        )
        stack.callback(proxy_of(node).stop)

        def pods_first() -> None:
            with contextlib.suppress(CniError):
                node.kubelet.close()  # sandboxes first: their CNI DEL needs the installed plugin

        stack.callback(pods_first)
        yield node, root, host


def remove_istio_roots(api: k8s.ApiClient) -> None:
    core = k8s.CoreV1Api(api)
    for cm in core.list_config_map_for_all_namespaces(
        field_selector="metadata.name=istio-ca-root-cert"
    ).items:
        with contextlib.suppress(k8s.ApiException):
            core.delete_namespaced_config_map(cm.metadata.name, cm.metadata.namespace)


def test_the_rendered_node_proxy_gets_pod_identities_and_workloads_from_an_istiod(
    beside_istiod: Any, kube_api, mesh_namespace: str
) -> None:
    node, root, host = beside_istiod
    assert host == "istiod.istio-system.svc"
    ns = mesh_namespace
    core = k8s.CoreV1Api(kube_api)
    core.create_namespaced_pod(ns, pod("client", sa="client"))
    client = node.run_pod(ns, "client")
    proxy = proxy_of(node)

    def discovered() -> bool:
        found = {w["name"]: w for w in proxy.config_dump()["workloads"]}
        return found.get("client", {}).get("protocol") == "HBONE"

    eventually("the pod from discovery", discovered, 30)

    def issued() -> bool:
        state = proxy.config_dump()["workloadState"]
        return state.get(client.uid, {}).get("certificate", {}).get("state") == "Available"

    eventually("the pod's certificate from the CA", issued, 20)
    certificate = proxy.config_dump()["workloadState"][client.uid]["certificate"]
    assert certificate["certChain"][0]["uriSans"] == [f"spiffe://cluster.local/ns/{ns}/sa/client"]
    # Signed by the stand-in, whose root came from the ConfigMap the DaemonSet mounts.
    mesh_root = x509.load_pem_x509_certificate(root.read_bytes())
    assert certificate["rootCerts"][0]["serialNumber"] == str(mesh_root.serial_number)
