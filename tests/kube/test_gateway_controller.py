"""The gateway controller in ``meshctl controlplane run`` against a real kube-apiserver with the
Gateway API v1.6.3 standard CRDs: status written through the status subresource (Accepted,
ResolvedRefs, attachedRoutes, observedGeneration, stale parents removed), the Gateway's proxy
provisioned and owned by it, and its config (certificate included) over discovery."""

from __future__ import annotations

import asyncio
import base64
import secrets
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from meshctl import rpc
from meshctl.core.gateway.config import BackendKey, GatewayConfig
from meshctl.core.gateway.model import SecretRef
from meshctl.proxy.xds_client import NodeInfo, XdsConfig
from tests.harness import controlplane as cp
from tests.harness import gateway_conformance as gc
from tests.harness.kube import (
    BUILD_HINT,
    CertificateAuthority,
    KubeCluster,
    cache_root,
    create_namespace,
    delete_namespace,
    request_token,
)

pytestmark = pytest.mark.kube

GROUP, VERSION = "gateway.networking.k8s.io", "v1"


@pytest.fixture(scope="module")
def gateway_crds(kube_cluster: KubeCluster) -> None:
    version = gc.pinned_version()
    suite = gc.Suite(version, cache_root() / "gateway-api" / version)
    if not any(suite.crd_dir.glob("*.yaml")):
        pytest.skip(f"Gateway API {version} CRDs not extracted: {BUILD_HINT}")
    with kube_cluster.api_client() as api:
        gc.install_crds(api, suite)


@pytest.fixture
def home(kube_api: k8s.ApiClient) -> Iterator[str]:
    name = f"cp-{secrets.token_hex(3)}"
    create_namespace(kube_api, name)
    try:
        yield name
    finally:
        delete_namespace(kube_api, name)


def wait_for(what: str, check: Callable[[], Any], timeout: float = 30.0) -> Any:
    deadline = time.monotonic() + timeout
    last: Any = None
    while time.monotonic() < deadline:
        try:
            last = check()
        except ApiException as exc:
            if exc.status != 404:
                raise
            last = None
        if last:
            return last
        time.sleep(0.2)
    raise TimeoutError(f"{what}: not after {timeout}s (last: {last!r})")


def custom(api: k8s.ApiClient) -> k8s.CustomObjectsApi:
    return k8s.CustomObjectsApi(api)


def create(api: k8s.ApiClient, ns: str, plural: str, body: dict[str, Any]) -> None:
    custom(api).create_namespaced_custom_object(GROUP, VERSION, ns, plural, body)


def get(api: k8s.ApiClient, ns: str, plural: str, name: str) -> dict[str, Any]:
    obj: dict[str, Any] = custom(api).get_namespaced_custom_object(GROUP, VERSION, ns, plural, name)
    return obj


def condition(conditions: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    return next((c for c in conditions if c["type"] == kind), {})


def gateway_class(api: k8s.ApiClient) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "GatewayClass",
        "metadata": {"name": "meshctl"},
        "spec": {"controllerName": "meshctl.io/gateway-controller"},
    }
    try:
        custom(api).create_cluster_custom_object(GROUP, VERSION, "gatewayclasses", body)
    except ApiException as exc:
        if exc.status != 409:
            raise


def gateway(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name},
        "spec": {
            "gatewayClassName": "meshctl",
            "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP"},
                {
                    "name": "https",
                    "port": 443,
                    "protocol": "HTTPS",
                    "tls": {"mode": "Terminate", "certificateRefs": [{"name": "cert"}]},
                },
            ],
        },
    }


def route(parent: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HTTPRoute",
        "metadata": {"name": "web"},
        "spec": {
            "parentRefs": [{"name": parent}],
            "rules": [{"backendRefs": [{"name": "web", "port": 80}]}],
        },
    }


def fixtures(api: k8s.ApiClient, ns: str, cert: bytes, key: bytes) -> None:
    core = k8s.CoreV1Api(api)
    core.create_namespaced_secret(
        ns,
        {
            "metadata": {"name": "cert"},
            "type": "kubernetes.io/tls",
            "data": {
                "tls.crt": base64.b64encode(cert).decode(),
                "tls.key": base64.b64encode(key).decode(),
            },
        },
    )
    core.create_namespaced_service(
        ns,
        {
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    k8s.DiscoveryV1Api(api).create_namespaced_endpoint_slice(
        ns,
        {
            "metadata": {"name": "web-1", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {"addresses": ["10.9.0.1"], "conditions": {"ready": True}},
                {"addresses": ["10.9.0.2"], "conditions": {"ready": False}},
            ],
        },
    )


def test_gateway_and_route_status_the_provisioned_proxy_and_a_stale_parent_removed(
    gateway_crds: None,
    kube_cluster: KubeCluster,
    kube_api: k8s.ApiClient,
    kube_namespace: str,
    home: str,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    pair = CertificateAuthority("gw-test").issue("example.com", dns_sans=["example.com"])
    gateway_class(kube_api)
    fixtures(kube_api, ns, pair.cert_pem, pair.key_pem)
    create(kube_api, ns, "gateways", gateway("gw"))
    create(kube_api, ns, "gateways", gateway("gw-b"))
    create(kube_api, ns, "httproutes", route("gw"))
    plane = cp.start(kube_cluster, home, tmp_path)
    try:

        def gateway_accepted() -> dict[str, Any] | None:
            status = get(kube_api, ns, "gateways", "gw").get("status", {})
            accepted = condition(status.get("conditions", []), "Accepted")
            listeners = {item["name"]: item for item in status.get("listeners", [])}
            if (
                accepted.get("status") != "True"
                or listeners.get("http", {}).get("attachedRoutes") != 1
            ):
                return None
            return status

        status = wait_for("Gateway Accepted with the route attached", gateway_accepted)
        assert condition(status["conditions"], "Accepted")["observedGeneration"] == 1
        assert {item["name"]: item["attachedRoutes"] for item in status["listeners"]} == {
            "http": 1,
            "https": 1,
        }
        # No kubelet here: the proxy never gets ready, so not Programmed; the address is the
        # Service's ClusterIP (no LoadBalancer implementation answers).
        assert condition(status["conditions"], "Programmed")["status"] == "False"

        core = k8s.CoreV1Api(kube_api)
        uid = get(kube_api, ns, "gateways", "gw")["metadata"]["uid"]
        deployment = wait_for(
            "the proxy's Deployment",
            lambda: k8s.AppsV1Api(kube_api).read_namespaced_deployment("gw-meshctl", ns),
        )
        service = core.read_namespaced_service("gw-meshctl", ns)
        account = core.read_namespaced_service_account("gw-meshctl", ns)
        for obj in (deployment, service, account):
            (owner,) = obj.metadata.owner_references
            assert (owner.kind, owner.name, owner.uid, owner.controller) == (
                "Gateway",
                "gw",
                uid,
                True,
            )
        assert deployment.spec.template.spec.containers[0].args == [
            "gateway",
            "run",
            "--gateway",
            f"{ns}/gw",
        ]
        assert sorted(p.port for p in service.spec.ports) == [80, 443, 15021]
        addresses = wait_for(
            "status.addresses",
            lambda: get(kube_api, ns, "gateways", "gw").get("status", {}).get("addresses"),
        )
        assert addresses == [{"type": "IPAddress", "value": service.spec.cluster_ip}]

        (parent,) = get(kube_api, ns, "httproutes", "web")["status"]["parents"]
        assert parent["parentRef"]["name"] == "gw"
        assert parent["controllerName"] == "meshctl.io/gateway-controller"
        for kind in ("Accepted", "ResolvedRefs"):
            found = condition(parent["conditions"], kind)
            assert (found["status"], found["observedGeneration"]) == ("True", 1)

        # The route moves to gw-b: gw's entry goes, gw-b's comes, at the new generation.
        custom(kube_api).patch_namespaced_custom_object(
            GROUP, VERSION, ns, "httproutes", "web", {"spec": {"parentRefs": [{"name": "gw-b"}]}}
        )

        def moved() -> list[dict[str, Any]] | None:
            parents = get(kube_api, ns, "httproutes", "web").get("status", {}).get("parents", [])
            names = [p["parentRef"]["name"] for p in parents]
            return parents if names == ["gw-b"] else None

        (parent,) = wait_for("the stale parent removed", moved)
        assert condition(parent["conditions"], "Accepted")["observedGeneration"] == 2
    finally:
        assert plane.stop() == 0, plane.log_tail()
        for name in ("gw", "gw-b"):
            custom(kube_api).delete_namespaced_custom_object(GROUP, VERSION, ns, "gateways", name)


def test_a_replaced_secret_reaches_the_proxy_and_a_gateway_leaving_our_class_loses_its_proxy(
    gateway_crds: None,
    kube_cluster: KubeCluster,
    kube_api: k8s.ApiClient,
    kube_namespace: str,
    home: str,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    core = k8s.CoreV1Api(kube_api)
    pair = CertificateAuthority("gw-test").issue("example.com", dns_sans=["example.com"])
    gateway_class(kube_api)
    fixtures(kube_api, ns, pair.cert_pem, pair.key_pem)
    create(kube_api, ns, "gateways", gateway("gw"))
    create(kube_api, ns, "httproutes", route("gw"))
    plane = cp.start(kube_cluster, home, tmp_path)
    try:
        wait_for(
            "the proxy's Deployment",
            lambda: k8s.AppsV1Api(kube_api).read_namespaced_deployment("gw-meshctl", ns),
        )
        # The gateway proxy's own subscription gets its config, the Secret's certificate in it;
        # the Secret replaced, the next config carries the new certificate.
        token = request_token(kube_cluster, ns, "gw-meshctl", "istio-ca")
        renewed = CertificateAuthority("gw-test-2").issue("example.com", dns_sans=["example.com"])

        def replace_secret() -> None:
            core.patch_namespaced_secret(
                "cert",
                ns,
                {
                    "data": {
                        "tls.crt": base64.b64encode(renewed.cert_pem).decode(),
                        "tls.key": base64.b64encode(renewed.key_pem).decode(),
                    }
                },
            )

        first, second = asyncio.run(
            receive(
                plane,
                cp.root_pem(kube_api, home),
                token,
                f"{ns}/gw",
                count=2,
                between=replace_secret,
            )
        )
        assert first.certificates[SecretRef(ns, "cert")].chain_pem == pair.cert_pem
        assert [p.port for p in first.table.ports] == [80, 443]
        (endpoint,) = first.endpoints[BackendKey(ns, "web", 80)]
        assert (endpoint.address, endpoint.port, endpoint.hbone) == ("10.9.0.1", 8080, False)
        assert second.certificates[SecretRef(ns, "cert")].chain_pem == renewed.cert_pem
        assert second.version != first.version

        # gw leaves our class: its proxy is removed.
        custom(kube_api).patch_namespaced_custom_object(
            GROUP, VERSION, ns, "gateways", "gw", {"spec": {"gatewayClassName": "someone-else"}}
        )

        def removed() -> bool:
            try:
                k8s.AppsV1Api(kube_api).read_namespaced_deployment("gw-meshctl", ns)
            except ApiException as exc:
                if exc.status == 404:
                    return True
                raise
            return False

        wait_for("the proxy of a Gateway no longer ours removed", removed)
        with pytest.raises(ApiException) as gone:
            core.read_namespaced_service("gw-meshctl", ns)
        assert gone.value.status == 404
    finally:
        assert plane.stop() == 0, plane.log_tail()
        custom(kube_api).delete_namespaced_custom_object(GROUP, VERSION, ns, "gateways", "gw")


async def receive(
    plane: cp.ControlPlaneProcess,
    root: bytes,
    token: str,
    name: str,
    *,
    count: int = 1,
    between: Callable[[], None] | None = None,
    attempts: int = 150,
) -> list[GatewayConfig]:
    """The first ``count`` configs the proxy's own client delivers for ``name``; ``between``
    runs once the first is in."""
    from meshctl_plugins.gateway import xds_source

    node_namespace = name.split("/", maxsplit=1)[0] if "/" in name else plane.namespace
    got: list[GatewayConfig] = []
    stop = asyncio.Event()
    config = XdsConfig(
        address=f"127.0.0.1:{plane.grpc_port}",
        roots=root,
        auth=rpc.CallAuth(token=token),
        node=NodeInfo(pod_name="gw-1", pod_namespace=node_namespace),
        server_name=plane.server_name,
    )
    task = asyncio.ensure_future(xds_source.follow(config, name, got.append, stop))
    try:
        acted = False
        for _ in range(attempts):
            if got and between is not None and not acted:
                acted = True
                await asyncio.to_thread(between)
            if len(got) >= count:
                return got[:count]
            await asyncio.sleep(0.1)
        raise TimeoutError(f"{len(got)} of {count} configs for {name}")
    finally:
        stop.set()
        await asyncio.wait_for(task, 10)


def test_an_ingress_of_class_meshctl_gets_the_ingress_gateways_address_and_its_config(
    gateway_crds: None,
    kube_cluster: KubeCluster,
    kube_api: k8s.ApiClient,
    kube_namespace: str,
    home: str,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    pair = CertificateAuthority("ingress-test").issue("shop.example", dns_sans=["shop.example"])
    fixtures(kube_api, ns, pair.cert_pem, pair.key_pem)
    networking = k8s.NetworkingV1Api(kube_api)
    try:
        networking.create_ingress_class(
            {
                "metadata": {"name": "meshctl"},
                "spec": {"controller": "meshctl.io/gateway-controller"},
            }
        )
    except ApiException as exc:
        if exc.status != 409:
            raise
    core = k8s.CoreV1Api(kube_api)
    revision = f"t{secrets.token_hex(3)}"
    gateway_service = core.create_namespaced_service(
        home,
        {
            # The ingress gateway install renders for this revision.
            "metadata": {"name": f"meshctl-ingressgateway-{revision}"},
            "spec": {"selector": {"app": "meshctl-ingressgateway"}, "ports": [{"port": 80}]},
        },
    )
    networking.create_namespaced_ingress(
        ns,
        {
            "metadata": {"name": "shop"},
            "spec": {
                "ingressClassName": "meshctl",
                "tls": [{"hosts": ["shop.example"], "secretName": "cert"}],
                "rules": [
                    {
                        "host": "shop.example",
                        "http": {
                            "paths": [
                                {
                                    "path": "/",
                                    "pathType": "Prefix",
                                    "backend": {"service": {"name": "web", "port": {"number": 80}}},
                                }
                            ]
                        },
                    }
                ],
            },
        },
    )
    plane = cp.start(kube_cluster, home, tmp_path, revision=revision)
    try:
        ingress = wait_for(
            "Ingress status.loadBalancer",
            lambda: networking.read_namespaced_ingress("shop", ns).status.load_balancer.ingress,
        )
        assert [i.ip for i in ingress] == [gateway_service.spec.cluster_ip]
        # The ingress gateway (in the control plane's namespace) gets the Ingress's routes and
        # certificate; a caller from the Ingress's namespace gets nothing of it.
        token = request_token(kube_cluster, home, "meshctl-ingressgateway", "istio-ca")
        root = cp.root_pem(kube_api, home)
        (config,) = asyncio.run(receive(plane, root, token, "ingress"))
        assert config.certificates[SecretRef(ns, "cert")].chain_pem == pair.cert_pem
        assert [p.port for p in config.table.ports] == [
            8080,
            8443,
        ]  # the installed Service targets these
        outsider = request_token(kube_cluster, ns, "web", "istio-ca")
        with pytest.raises(TimeoutError):
            asyncio.run(receive(plane, root, outsider, "ingress", attempts=20))
    finally:
        assert plane.stop() == 0, plane.log_tail()


def test_an_ambient_endpoint_is_sent_as_hbone_with_its_identity_and_a_plain_one_is_not(
    gateway_crds: None,
    kube_cluster: KubeCluster,
    kube_api: k8s.ApiClient,
    kube_namespace: str,
    home: str,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    core = k8s.CoreV1Api(kube_api)
    pair = CertificateAuthority("gw-test").issue("example.com", dns_sans=["example.com"])
    gateway_class(kube_api)
    fixtures(kube_api, ns, pair.cert_pem, pair.key_pem)  # 10.9.0.1: an unmeshed endpoint
    # A pod enrolled in ambient, as a kubelet would report it running at 10.9.0.5.
    core.create_namespaced_pod(
        ns,
        {
            "metadata": {"name": "web-mesh", "labels": {"istio.io/dataplane-mode": "ambient"}},
            "spec": {
                "nodeName": "node-a",
                "containers": [{"name": "app", "image": "registry.invalid/app:1"}],
            },
        },
    )
    pod = core.read_namespaced_pod("web-mesh", ns)
    pod.status = {
        "phase": "Running",
        "podIP": "10.9.0.5",
        "podIPs": [{"ip": "10.9.0.5"}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }
    core.replace_namespaced_pod_status("web-mesh", ns, pod)
    k8s.DiscoveryV1Api(kube_api).create_namespaced_endpoint_slice(
        ns,
        {
            "metadata": {"name": "web-2", "labels": {"kubernetes.io/service-name": "web"}},
            "addressType": "IPv4",
            "ports": [{"name": "", "port": 8080, "protocol": "TCP"}],
            "endpoints": [
                {
                    "addresses": ["10.9.0.5"],
                    "conditions": {"ready": True},
                    "targetRef": {"kind": "Pod", "name": "web-mesh", "namespace": ns},
                }
            ],
        },
    )
    create(kube_api, ns, "gateways", gateway("gw"))
    create(kube_api, ns, "httproutes", route("gw"))
    plane = cp.start(kube_cluster, home, tmp_path)
    try:
        token = request_token(kube_cluster, ns, "gw-meshctl", "istio-ca")
        root = cp.root_pem(kube_api, home)
        (config,) = asyncio.run(receive(plane, root, token, f"{ns}/gw"))
        plain, meshed = config.endpoints[BackendKey(ns, "web", 80)]
        assert (plain.address, plain.hbone, plain.identity) == ("10.9.0.1", False, "")
        assert (meshed.address, meshed.port, meshed.hbone) == ("10.9.0.5", 8080, True)
        assert meshed.identity == f"spiffe://cluster.local/ns/{ns}/sa/default"
        assert meshed.workload == f"{ns}/web-mesh"
    finally:
        assert plane.stop() == 0, plane.log_tail()
        custom(kube_api).delete_namespaced_custom_object(GROUP, VERSION, ns, "gateways", "gw")


def l4_gateway(name: str) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "Gateway",
        "metadata": {"name": name},
        "spec": {
            "gatewayClassName": "meshctl",
            "listeners": [
                {"name": "http", "port": 80, "protocol": "HTTP"},
                {"name": "tls", "port": 443, "protocol": "TLS", "tls": {"mode": "Passthrough"}},
                {"name": "tcp", "port": 31400, "protocol": "TCP"},
            ],
        },
    }


def l4_route(
    kind: str, name: str, section: str, backend: str, hostnames: tuple[str, ...] = ()
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parentRefs": [{"name": "gw-l4", "sectionName": section}],
        "rules": [{"backendRefs": [{"name": backend, "port": 80}]}],
    }
    if hostnames:
        spec["hostnames"] = list(hostnames)
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": kind,
        "metadata": {"name": name},
        "spec": spec,
    }


def parent_conditions(api: k8s.ApiClient, ns: str, plural: str, name: str) -> list[Any] | None:
    """The route's status.parents[] as (sectionName, {type: (status, reason, generation)})."""
    parents = get(api, ns, plural, name).get("status", {}).get("parents", [])
    return [
        (
            p["parentRef"].get("sectionName"),
            {
                c["type"]: (c["status"], c["reason"], c["observedGeneration"])
                for c in p["conditions"]
            },
        )
        for p in parents
    ] or None


def test_tls_tcp_and_grpc_routes_attach_get_their_status_and_reach_the_proxys_config(
    gateway_crds: None,
    kube_cluster: KubeCluster,
    kube_api: k8s.ApiClient,
    kube_namespace: str,
    home: str,
    tmp_path: Path,
) -> None:
    ns = kube_namespace
    pair = CertificateAuthority("gw-test").issue("example.com", dns_sans=["example.com"])
    gateway_class(kube_api)
    fixtures(kube_api, ns, pair.cert_pem, pair.key_pem)
    create(kube_api, ns, "gateways", l4_gateway("gw-l4"))
    create(kube_api, ns, "tlsroutes", l4_route("TLSRoute", "tls", "tls", "web", ("tls.example",)))
    create(
        kube_api,
        ns,
        "tlsroutes",
        l4_route("TLSRoute", "tls-missing", "tls", "missing", ("missing.example",)),
    )
    create(kube_api, ns, "tcproutes", l4_route("TCPRoute", "tcp", "tcp", "web"))
    create(kube_api, ns, "tcproutes", l4_route("TCPRoute", "tcp-on-http", "http", "web"))
    create(kube_api, ns, "grpcroutes", l4_route("GRPCRoute", "grpc", "http", "web"))
    plane = cp.start(kube_cluster, home, tmp_path)
    try:

        def attached() -> dict[str, int] | None:
            status = get(kube_api, ns, "gateways", "gw-l4").get("status", {})
            counts = {i["name"]: i["attachedRoutes"] for i in status.get("listeners", [])}
            wanted = (counts.get("tls"), counts.get("tcp"), counts.get("http")) == (2, 1, 1)
            return counts if wanted else None

        assert wait_for("the TLS, TCP and gRPC routes attached", attached) == {
            "http": 1,
            "tls": 2,
            "tcp": 1,
        }
        ok = ("True", "Accepted", 1)
        assert wait_for(
            "TLSRoute status", lambda: parent_conditions(kube_api, ns, "tlsroutes", "tls")
        ) == [("tls", {"Accepted": ok, "ResolvedRefs": ("True", "ResolvedRefs", 1)})]
        assert wait_for(
            "TLSRoute status",
            lambda: parent_conditions(kube_api, ns, "tlsroutes", "tls-missing"),
        ) == [("tls", {"Accepted": ok, "ResolvedRefs": ("False", "BackendNotFound", 1)})]
        assert wait_for(
            "TCPRoute status", lambda: parent_conditions(kube_api, ns, "tcproutes", "tcp")
        ) == [("tcp", {"Accepted": ok, "ResolvedRefs": ("True", "ResolvedRefs", 1)})]
        (on_http,) = wait_for(
            "TCPRoute status", lambda: parent_conditions(kube_api, ns, "tcproutes", "tcp-on-http")
        )
        assert on_http[0] == "http"
        assert on_http[1]["Accepted"] == ("False", "NotAllowedByListeners", 1)
        assert wait_for(
            "GRPCRoute status", lambda: parent_conditions(kube_api, ns, "grpcroutes", "grpc")
        ) == [("http", {"Accepted": ok, "ResolvedRefs": ("True", "ResolvedRefs", 1)})]

        # The provisioned Service exposes the TLS and TCP listeners' ports like the HTTP one.
        service = wait_for(
            "the proxy's Service",
            lambda: k8s.CoreV1Api(kube_api).read_namespaced_service("gw-l4-meshctl", ns),
        )
        assert sorted((p.name, p.port) for p in service.spec.ports) == [
            ("http-80", 80),
            ("status-port", 15021),
            ("tcp-31400", 31400),
            ("tls-443", 443),
        ]

        # The proxy's config: the TLS listener's hosts by SNI, the TCP listener's one route,
        # the backend's ready endpoint.
        token = request_token(kube_cluster, ns, "gw-l4-meshctl", "istio-ca")
        root = cp.root_pem(kube_api, home)
        (config,) = asyncio.run(receive(plane, root, token, f"{ns}/gw-l4"))
        tables = {p.port: p for p in config.table.ports}
        assert {n: str(t.protocol) for n, t in tables.items()} == {
            80: "HTTP",
            443: "TLS",
            31400: "TCP",
        }
        (tls,) = tables[443].listeners
        assert [(vh.hostname, [str(e.route) for e in vh.entries]) for vh in tls.hosts] == [
            ("missing.example", [f"TLSRoute {ns}/tls-missing"]),
            ("tls.example", [f"TLSRoute {ns}/tls"]),
        ]
        (http,) = tables[80].listeners
        assert [str(e.route) for vh in http.hosts for e in vh.entries] == [f"GRPCRoute {ns}/grpc"]
        (tcp,) = tables[31400].listeners
        assert [str(e.route) for vh in tcp.hosts for e in vh.entries] == [f"TCPRoute {ns}/tcp"]
        (endpoint,) = config.endpoints[BackendKey(ns, "web", 80)]
        assert (endpoint.address, endpoint.port) == ("10.9.0.1", 8080)
        assert BackendKey(ns, "missing", 80) not in config.endpoints

        # Moved to the TCP listener: the stale http parent entry goes, the new one is Accepted
        # at the route's new generation.
        custom(kube_api).patch_namespaced_custom_object(
            GROUP,
            VERSION,
            ns,
            "tcproutes",
            "tcp-on-http",
            {"spec": {"parentRefs": [{"name": "gw-l4", "sectionName": "tcp"}]}},
        )

        def moved() -> list[Any] | None:
            parents = parent_conditions(kube_api, ns, "tcproutes", "tcp-on-http") or []
            return parents if [p[0] for p in parents] == ["tcp"] else None

        ((_, conditions),) = wait_for("the stale parent removed", moved)
        assert conditions["Accepted"] == ("True", "Accepted", 2)
    finally:
        assert plane.stop() == 0, plane.log_tail()
        custom(kube_api).delete_namespaced_custom_object(GROUP, VERSION, ns, "gateways", "gw-l4")
