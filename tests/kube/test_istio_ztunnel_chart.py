"""Istio's ztunnel chart, with its defaults, on meshctl's control plane (real kube-apiserver).

The chart's ztunnel asks ``istiod.istio-system.svc:15012``, checks that name in the serving
certificate against the root of ConfigMap ``istio-ca-root-cert`` (``root-cert.pem``), and sends
a token of ``istio-system/ztunnel`` with audience ``istio-ca`` to get the certificates of the pods
on its node. The control plane runs with the env ``meshctl install`` renders for
``components.controlplane.istioNames=true`` (and, to show the test can fail, without it); the
client is the suite's own CA and Delta xDS clients (tests/harness), written from the protos.
"""

from __future__ import annotations

import asyncio
import contextlib
import secrets
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from cryptography import x509
from kubernetes import client as k8s

from meshctl import components, rpc
from meshctl.core.k8s.install.checks import Outcome
from meshctl.core.k8s.install.manifest import render
from tests.harness import controlplane as cp
from tests.harness import xds_client as tc
from tests.harness.kube import (
    SA_ISSUER,
    KubeCluster,
    cache_root,
    create_namespace,
    delete_namespace,
    free_port,
    request_token,
)

pytestmark = pytest.mark.kube

ISTIO_NS = "istio-system"  # the chart's istioNamespace
ISTIOD = "istiod.istio-system.svc"  # what the chart's ztunnel dials and checks
ISTIO_ROOT = "istio-ca-root-cert"
ISTIO_NAMES = "components.controlplane.istioNames=true"
NODE = "node-a"
# The process settings the install renders (the rest is the harness's: ports, namespace).
RENDERED = ("CA_TRUSTED_NODE_ACCOUNTS", "MESHCTL_ROOT_CONFIGMAP_ALIASES", "MESHCTL_SERVING_NAMES")


def rendered(namespace: str, *assignments: str) -> tuple[dict[str, str], list[Any]]:
    """The control plane's env as ``meshctl install`` renders it, and the install's objects."""
    registry = components.load()
    values = registry.resolve(profile="minimal", namespace=namespace, assignments=assignments)
    objects = [item.object for item in render(registry, values)]
    deployment = next(o for o in objects if o["kind"] == "Deployment")
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    env = {e["name"]: e["value"] for e in container["env"] if e["name"] in RENDERED}
    return env, objects


def start_plane(
    cluster: KubeCluster,
    namespace: str,
    workdir: Path,
    env: dict[str, str],
    kubeconfig: Path | None = None,
) -> contextlib.AbstractContextManager[cp.ControlPlaneProcess]:
    """The default revision (the chart's ztunnel, without a revision, dials ``istiod``); the
    rendered serving names beside the harness's 127.0.0.1 (a flag wins over env)."""
    names = ",".join(["127.0.0.1", *filter(None, [env.pop("MESHCTL_SERVING_NAMES", "")])])
    extra = ("--serving-names", names)
    return cp.running(
        cluster, namespace, workdir, *extra, revision="default", env=env, kubeconfig=kubeconfig
    )


RBAC = ("ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding")


@contextlib.contextmanager
def rendered_rbac(
    cluster: KubeCluster, namespace: str, objects: list[Any], workdir: Path
) -> Iterator[Path]:
    """The install's RBAC for the control plane applied, and a kubeconfig of its ServiceAccount's
    token: the process then has exactly what the manifest grants (no admin)."""
    from kubernetes import utils

    from meshctl.core.k8s.cni import netconf

    rbac = [
        o for o in objects if o["kind"] in RBAC and "meshctl-controlplane" in o["metadata"]["name"]
    ]
    with cluster.api_client() as api:
        try:
            for body in rbac:
                utils.create_from_dict(api, dict(body), namespace=namespace)
            token = request_token(
                cluster, namespace, "meshctl-controlplane", SA_ISSUER, create=False
            )
            path = workdir / "controlplane.kubeconfig"
            path.write_bytes(netconf.kubeconfig(cluster.server, token, cluster.ca_pem))
            yield path
        finally:
            rbacv1 = k8s.RbacAuthorizationV1Api(api)
            with contextlib.suppress(k8s.ApiException):
                rbacv1.delete_cluster_role_binding("meshctl-controlplane")
            with contextlib.suppress(k8s.ApiException):
                rbacv1.delete_cluster_role("meshctl-controlplane")


def roots_check(cluster: KubeCluster, namespace: str, *assignments: str) -> Any:
    """``meshctl verify``'s "root ConfigMap is in every namespace" for these install values."""
    from meshctl.core.k8s.install.context import CheckContext
    from meshctl.kube.client import KubeSettings, connect
    from meshctl.kube.inventory import Inventory

    registry = components.load()
    values = registry.resolve(profile="minimal", namespace=namespace, assignments=assignments)
    kube = connect(KubeSettings(kubeconfig=str(cluster.kubeconfig)))
    context = CheckContext(
        kube=kube,
        cluster=Inventory(kube),
        registry=registry,
        values=values,
        rendered=render(registry, values),
    )
    (check,) = [
        c
        for c in registry.by_name["controlplane"].checks
        if c.description == "root ConfigMap is in every namespace"
    ]
    return check.run(context)


def passes(result: Any) -> bool | None:
    return True if result.outcome is Outcome.OK else None


def wait_for(what: str, probe: Any, timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    while (found := probe()) is None:
        if time.monotonic() > deadline:
            raise TimeoutError(f"{what} did not come within {timeout}s")
        time.sleep(0.2)
    return found


def root_of(api: k8s.ApiClient, name: str, namespace: str) -> bytes | None:
    try:
        found = k8s.CoreV1Api(api).read_namespaced_config_map(name, namespace)
    except k8s.ApiException as exc:
        if exc.status == 404:
            return None
        raise
    data = found.data or {}
    return data["root-cert.pem"].encode() if "root-cert.pem" in data else None


def running_pod(api: k8s.ApiClient, namespace: str, name: str, ip: str) -> None:
    """The pod's status as its kubelet would write it (Running, Ready, its IP)."""
    core = k8s.CoreV1Api(api)
    pod = core.read_namespaced_pod(name, namespace)
    pod.status = {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    core.replace_namespaced_pod_status(name, namespace, pod)


@pytest.fixture(scope="module")
def cluster_with_istio_ns(kube_cluster: KubeCluster) -> Iterator[KubeCluster]:
    with kube_cluster.api_client() as api:
        create_namespace(api, ISTIO_NS)
        try:
            yield kube_cluster
        finally:
            core = k8s.CoreV1Api(api)
            for service in core.list_namespaced_service(ISTIO_NS).items:
                core.delete_namespaced_service(service.metadata.name, ISTIO_NS)
            delete_namespace(api, ISTIO_NS)


@pytest.fixture
def system(cluster_with_istio_ns: KubeCluster) -> Iterator[str]:
    """The control plane's namespace; every root it published, and the alias, removed after."""
    name = f"zsys-{secrets.token_hex(3)}"
    with cluster_with_istio_ns.api_client() as api:
        create_namespace(api, name)
        try:
            yield name
        finally:
            cp.remove_published_roots(api)
            core = k8s.CoreV1Api(api)
            for service in core.list_namespaced_service(ISTIO_NS).items:  # the alias
                core.delete_namespaced_service(service.metadata.name, ISTIO_NS)
            for cm in core.list_config_map_for_all_namespaces(
                field_selector=f"metadata.name={ISTIO_ROOT}"
            ).items:
                core.delete_namespaced_config_map(cm.metadata.name, cm.metadata.namespace)
            delete_namespace(api, name)


class ChartZtunnel:
    """What Istio's ztunnel chart runs, as far as the control plane sees it: a pod of
    ``istio-system/ztunnel`` on NODE with a projected ``istio-ca`` token, dialling ``address``
    and checking ``server_name`` against ``root``."""

    def __init__(self, cluster: KubeCluster, address: str) -> None:
        self.pod = f"ztunnel-{secrets.token_hex(3)}"
        self.token = cp.pod_token(cluster, ISTIO_NS, "ztunnel", self.pod, node=NODE)
        self.address = address

    async def certificate(self, root: bytes, server_name: str, identity: str) -> Any:
        """The chain for ``identity`` (impersonated), or the refusal as (code, message)."""
        csr_pem, _key = cp.csr(identity)
        auth = rpc.CallAuth(token=self.token, cluster_id="Kubernetes")
        async with rpc.connect(
            self.address, root_pem=root, auth=auth, server_name=server_name
        ) as channel:
            try:
                return await cp.create_certificate(channel, csr_pem, impersonate=identity)
            except grpc.aio.AioRpcError as exc:  # the refusal is the answer here
                return exc.code().name, exc.details() or ""

    async def workloads(self, root: bytes, server_name: str, wanted: str) -> set[str]:
        """Delta xDS as ztunnel opens it (wildcard Address + Authorization); the workload names
        of the first Address response that holds ``wanted``."""
        channel, stream = await tc.open_stream(
            self.address, root_pem=root, token=self.token, server_name=server_name
        )
        try:
            node = tc.ztunnel_node(pod=self.pod, ns=ISTIO_NS)
            await stream.subscribe(tc.ADDRESS, node=node)
            await stream.subscribe(tc.AUTHORIZATION, node=node)
            deadline = time.monotonic() + 20
            while True:
                response = await stream.recv(timeout=max(0.1, deadline - time.monotonic()))
                await stream.ack(response)
                names = set(tc.decode(response)) if response.type_url == tc.ADDRESS else set()
                if wanted in names:
                    return names
        finally:
            await stream.close()
            await channel.close()


def spiffe(namespace: str, account: str) -> str:
    return f"spiffe://cluster.local/ns/{namespace}/sa/{account}"


def test_without_the_values_istios_ztunnel_chart_is_refused_on_all_three_counts(
    cluster_with_istio_ns: KubeCluster, system: str, kube_namespace: str, tmp_path: Path
) -> None:
    """With the default values: no ConfigMap by Istio's name, a certificate without istiod's
    name (TLS refuses), and the chart's account is no node proxy (impersonation refused)."""
    env, objects = rendered(system)
    assert env["CA_TRUSTED_NODE_ACCOUNTS"] == f"{system}/meshctl-ztunnel"
    assert not any(o["metadata"]["name"] == "istiod" for o in objects)
    with (
        cluster_with_istio_ns.api_client() as api,
        start_plane(cluster_with_istio_ns, system, tmp_path, env) as plane,
    ):
        ours = wait_for(
            "the root in istio-system", lambda: root_of(api, "meshctl-ca-root-cert", ISTIO_NS)
        )
        assert root_of(api, ISTIO_ROOT, ISTIO_NS) is None
        assert root_of(api, ISTIO_ROOT, kube_namespace) is None
        # verify, told the install has istioNames, names what is missing.
        wait_for("verify's root check", lambda: passes(roots_check(cluster_with_istio_ns, system)))
        found = roots_check(cluster_with_istio_ns, system, ISTIO_NAMES)
        assert found.outcome is Outcome.FAIL
        assert any(d.startswith(f"{ISTIO_ROOT}: missing in ") for d in found.details), found
        cp.pod_token(cluster_with_istio_ns, kube_namespace, "web", "web-1", node=NODE)
        web = spiffe(kube_namespace, "web")
        zt = ChartZtunnel(cluster_with_istio_ns, f"127.0.0.1:{plane.grpc_port}")

        code, message = asyncio.run(zt.certificate(ours, ISTIOD, web))
        assert code == "UNAVAILABLE", message  # the handshake: the name is not in the certificate
        code, message = asyncio.run(zt.certificate(ours, plane.server_name, web))
        assert code == "UNAUTHENTICATED", message
        assert message.startswith("request impersonation authentication failure: ")


def test_with_istio_names_the_charts_ztunnel_gets_pod_certificates_and_workloads(
    cluster_with_istio_ns: KubeCluster, system: str, kube_namespace: str, tmp_path: Path
) -> None:
    """``components.controlplane.istioNames=true``: the root under Istio's name everywhere, the
    serving certificate for istiod.istio-system.svc, istio-system/ztunnel trusted for the pods
    of its node; the alias Service is one the API server takes. The process runs with only the
    RBAC the install renders: the other node proxy's TokenReviews and pod lookups need no more."""
    env, objects = rendered(system, ISTIO_NAMES)
    alias = next(o for o in objects if o["kind"] == "Service" and o["metadata"]["name"] == "istiod")
    with (
        cluster_with_istio_ns.api_client() as api,
        rendered_rbac(cluster_with_istio_ns, system, objects, tmp_path) as kubeconfig,
        start_plane(cluster_with_istio_ns, system, tmp_path, env, kubeconfig) as plane,
    ):
        created = k8s.CoreV1Api(api).create_namespaced_service(ISTIO_NS, dict(alias))
        assert created.spec.type == "ExternalName"
        assert created.spec.external_name == f"meshctl-controlplane.{system}.svc.cluster.local"

        root = wait_for(
            "istio-ca-root-cert in istio-system", lambda: root_of(api, ISTIO_ROOT, ISTIO_NS)
        )
        assert root == cp.root_pem(api, system)
        in_apps = wait_for(
            "istio-ca-root-cert in the app namespace",
            lambda: root_of(api, ISTIO_ROOT, kube_namespace),
        )
        assert in_apps == root
        wait_for(
            "verify's root check with istioNames",
            lambda: passes(roots_check(cluster_with_istio_ns, system, ISTIO_NAMES)),
        )

        cp.pod_token(cluster_with_istio_ns, kube_namespace, "web", "web-1", node=NODE)
        running_pod(api, kube_namespace, "web-1", "10.30.0.7")
        cp.pod_token(cluster_with_istio_ns, kube_namespace, "db", "db-1", node="node-b")
        web, db = spiffe(kube_namespace, "web"), spiffe(kube_namespace, "db")
        zt = ChartZtunnel(cluster_with_istio_ns, f"127.0.0.1:{plane.grpc_port}")

        chain = asyncio.run(zt.certificate(root, ISTIOD, web))
        assert isinstance(chain, list), chain
        assert chain[-1].encode() == root
        leaf = x509.load_pem_x509_certificate(chain[0].encode())
        san = leaf.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        assert [str(n.value) for n in san] == [web]
        # Still only the pods of its own node.
        code, message = asyncio.run(zt.certificate(root, ISTIOD, db))
        assert code == "UNAUTHENTICATED", message
        assert "no pod of service account" in message

        uid = f"Kubernetes//Pod/{kube_namespace}/web-1"
        names = asyncio.run(zt.workloads(root, ISTIOD, uid))
        assert uid in names


def test_uninstall_removes_the_root_under_istios_name_and_leaves_ours_and_istiods(
    cluster_with_istio_ns: KubeCluster, system: str, kube_namespace: str
) -> None:
    """The revision's install record says istioNames: uninstall takes the alias ConfigMaps the
    control plane published (by our labels), not ours (kept, as Istio keeps its own) and not an
    unlabelled one of that name (istiod's)."""
    from meshctl_plugins.controlplane.roots import LABELS
    from meshctl_plugins.install import remove

    from meshctl.kube.client import KubeSettings, connect
    from meshctl.kube.inventory import Inventory

    registry = components.load()

    def record(*assignments: str) -> dict[str, Any]:
        values = registry.resolve(profile="minimal", namespace=system, assignments=assignments)
        items = render(registry, values)
        return next(
            dict(i.object) for i in items if i.object["metadata"]["name"] == "meshctl-install"
        )

    def config_map(namespace: str, name: str, labels: dict[str, str]) -> None:
        body = {"metadata": {"name": name, "labels": labels}, "data": {"root-cert.pem": "x"}}
        k8s.CoreV1Api(api).create_namespaced_config_map(namespace, body)

    def removed() -> set[tuple[str, str]]:
        kube = connect(KubeSettings(kubeconfig=str(cluster_with_istio_ns.kubeconfig)))
        values = registry.resolve(profile=None, namespace=system)  # as uninstall resolves them
        items = remove.targets(Inventory(kube), registry, values, purge=False)
        return {
            (str(o["metadata"].get("namespace")), str(o["metadata"]["name"]))
            for o in items
            if o.get("kind") == "ConfigMap"
        }

    with cluster_with_istio_ns.api_client() as api:
        core = k8s.CoreV1Api(api)
        config_map(kube_namespace, ISTIO_ROOT, dict(LABELS))
        config_map(kube_namespace, "meshctl-ca-root-cert", dict(LABELS))
        config_map(ISTIO_NS, ISTIO_ROOT, {})
        core.create_namespaced_config_map(system, record(ISTIO_NAMES))
        gone = removed()
        assert (kube_namespace, ISTIO_ROOT) in gone
        assert (ISTIO_NS, ISTIO_ROOT) not in gone
        assert (kube_namespace, "meshctl-ca-root-cert") not in gone
        core.replace_namespaced_config_map("meshctl-install", system, record())
        assert (kube_namespace, ISTIO_ROOT) not in removed()


# -- the alias through a real cluster DNS ------------------------------------------------------

COREDNS_MOD = Path(__file__).parent / "coredns" / "go.mod"


def coredns_binary() -> Path:
    """CoreDNS as tests/kube/build.sh builds it (for the Gateway API suite), at its pin."""
    import re

    found = re.search(r"^\s*github\.com/coredns/coredns (v\S+)", COREDNS_MOD.read_text(), re.M)
    assert found, f"no CoreDNS pin in {COREDNS_MOD}"
    binary = cache_root() / "coredns" / found.group(1) / "coredns"
    if not binary.is_file():
        pytest.skip(f"{binary} is not built: run 'bash tests/kube/build.sh --gateway-api'")
    return binary


def dns_a(port: int, name: str) -> list[tuple[str, str]]:
    """An A query to 127.0.0.1:port over UDP (RFC 1035 §4), the answers as (type, data):
    ("CNAME", target) and ("A", address)."""
    import socket
    import struct

    query = struct.pack(">HHHHHH", 0x5EED, 0x0100, 1, 0, 0, 0)
    query += b"".join(bytes([len(p)]) + p.encode() for p in name.rstrip(".").split(".")) + b"\0"
    query += struct.pack(">HH", 1, 1)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.settimeout(2)
        sock.sendto(query, ("127.0.0.1", port))
        reply, _ = sock.recvfrom(4096)

    def read_name(at: int) -> tuple[str, int]:
        labels, end = [], None
        while reply[at]:
            if reply[at] & 0xC0 == 0xC0:  # a pointer (RFC 1035 §4.1.4)
                end = end or at + 2
                at = struct.unpack(">H", reply[at : at + 2])[0] & 0x3FFF
                continue
            labels.append(reply[at + 1 : at + 1 + reply[at]].decode())
            at += 1 + reply[at]
        return ".".join(labels), end or at + 1

    _id, flags, _qd, answers, _ns, _ar = struct.unpack(">HHHHHH", reply[:12])
    assert flags & 0xF == 0, f"{name}: rcode {flags & 0xF}"
    at = read_name(12)[1] + 4
    out = []
    for _ in range(answers):
        at = read_name(at)[1]
        kind, _cls, _ttl, length = struct.unpack(">HHIH", reply[at : at + 10])
        at += 10
        if kind == 1:
            out.append(("A", socket.inet_ntoa(reply[at : at + 4])))
        elif kind == 5:
            out.append(("CNAME", read_name(at)[0]))
        at += length
    return out


def test_the_istiod_alias_resolves_to_the_control_planes_service_through_coredns(
    cluster_with_istio_ns: KubeCluster, system: str, tmp_path: Path
) -> None:
    """Istio's ztunnel resolves istiod.istio-system.svc with the cluster DNS: CoreDNS (the
    version the suite builds) answers the rendered ExternalName with the control plane's
    Service and its ClusterIP."""
    import subprocess

    binary = coredns_binary()
    _env, objects = rendered(system, ISTIO_NAMES)
    services = [o for o in objects if o["kind"] == "Service"]
    with cluster_with_istio_ns.api_client() as api:
        core = k8s.CoreV1Api(api)
        for service in services:
            core.create_namespaced_service(service["metadata"]["namespace"], dict(service))
        cluster_ip = core.read_namespaced_service("meshctl-controlplane", system).spec.cluster_ip
    port = free_port()
    corefile = tmp_path / "Corefile"
    corefile.write_text(
        f".:{port} {{\n  bind 127.0.0.1\n  kubernetes cluster.local {{\n"
        f"    kubeconfig {cluster_with_istio_ns.kubeconfig}\n  }}\n}}\n"
    )
    log = (tmp_path / "coredns.log").open("wb")
    process = subprocess.Popen(
        [str(binary), "-conf", str(corefile)], stdout=log, stderr=subprocess.STDOUT
    )
    try:
        target = f"meshctl-controlplane.{system}.svc.cluster.local"

        def answered() -> list[tuple[str, str]] | None:
            with contextlib.suppress(OSError, AssertionError):
                return dns_a(port, f"{ISTIOD}.cluster.local") or None
            return None

        answers = wait_for("CoreDNS's answer", answered)
        assert answers == [("CNAME", target), ("A", cluster_ip)], answers
    finally:
        process.terminate()
        process.wait(10)
        log.close()
        with cluster_with_istio_ns.api_client() as api:
            k8s.CoreV1Api(api).delete_namespaced_service("meshctl-controlplane", system)
