"""The ingress gateway into the mesh, on the real node, after ``meshctl install --profile ambient``.

One Gateway of class ``meshctl`` (HTTP listener on 80, routes from every namespace) in its own
namespace, provisioned by the controller (``gw-meshctl``: Deployment, Service, ServiceAccount);
three backends, each a busybox httpd behind a Service and an HTTPRoute for its own path: (a) a
pod in a namespace enrolled in ambient, (b) a pod injected with the sidecar, (c) an unmeshed pod.
From this machine, requests to the Gateway's address (``status.addresses``: the Service's
ClusterIP through kube-proxy) reach each backend. A capture on the node's bridge shows the
gateway's traffic to (a) and (b) on their HBONE port, TLS records only, none of the page, and its
traffic to (c) in plaintext on the app port (so the capture would see plaintext if there were
any); the destinations' proxies count the connections as mutual TLS from the gateway's identity.
A DENY AuthorizationPolicy for that identity at (a) turns its route into 503 and leaves the
others alone; ``verify`` is all ✔ with its gateway checks passing; uninstall leaves nothing. The
tests run in order on one install.
"""

from __future__ import annotations

import functools
import http.client
import json
import secrets
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s

from meshctl.core.k8s import ambient
from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.ambient_pods import mtls_opened, node_proxy_metrics
from tests.harness.mesh_install import Mesh, failing, installed, ours
from tests.harness.node import TestNode, report_namespace
from tests.netns.ztunnel_harness import Segment, Sniffer

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"
GATEWAY = "gw"
PROVISIONED = f"{GATEWAY}-meshctl"  # Deployment, Service and ServiceAccount of the Gateway
APP_PORT = 8080
HBONE_PORT = 15008
BACKENDS = ("ambient", "sidecar", "plain")  # (a), (b), (c): also each one's route path
GATEWAY_CHECKS = (
    "meshctl-gateway: every Gateway of meshctl's classes is Programmed",
    "meshctl-gateway: every HTTPRoute is attached to its Gateways",
    "meshctl-gateway: each Gateway listener answers a request",
)
# TLS record content types and legacy versions (RFC 8446 section 5.1).
TLS_CONTENT_TYPES = {20, 21, 22, 23}
TLS_VERSIONS = {b"\x03\x01", b"\x03\x03"}


@dataclass(frozen=True)
class Backend:
    kind: str  # one of BACKENDS
    namespace: str
    page: str  # the body it serves: the plaintext marker on the wire
    pod_ip: str
    identity: str  # its SPIFFE identity (meaningful when meshed)

    @property
    def path(self) -> str:
        return f"/{self.kind}/page.txt"


@dataclass(frozen=True)
class Scene:
    gateway_ns: str
    address: str  # the Gateway's status address
    gateway_pod_ip: str
    gateway_identity: str
    backends: dict[str, Backend]


@pytest.fixture(scope="module")
def mesh(kube_node: TestNode) -> Iterator[Mesh]:
    # This node's containerd pins pod netns under its own state directory, not /var/run/netns.
    netns_dir = nodehost.WORKDIR / "containerd" / "state"
    values = ["--set", f"components.cni.netnsDir={netns_dir}"]
    with installed(Mesh(kube_node, "ambient", values)) as mesh:
        yield mesh


@pytest.fixture(scope="module")
def scene(kube_node: TestNode, mesh: Mesh) -> Iterator[Scene]:
    tag = secrets.token_hex(3)
    names = {kind: f"gwmesh-{kind}-{tag}" for kind in ("gateway", *BACKENDS)}
    labels = {
        "ambient": {ambient.DATAPLANE_MODE: ambient.MODE_AMBIENT},
        "sidecar": {"istio-injection": "enabled"},
    }
    busybox = kube_node.image("busybox")
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        try:
            for kind, ns in names.items():
                core.create_namespace({"metadata": {"name": ns, "labels": labels.get(kind, {})}})
                wl.wait_service_account(api, ns)
            backends = {
                kind: start_backend(api, kind, names[kind], busybox, names["gateway"])
                for kind in BACKENDS
            }
            wl.apply(api, [gateway_object()], names["gateway"])
            gateway_ns = names["gateway"]
            try:
                wl.wait_rollout(api, "Deployment", gateway_ns, PROVISIONED, timeout=180)
                address = wl.retry(
                    functools.partial(gateway_address, api, gateway_ns), bool, timeout=60
                )
                assert address, "the Gateway got no address in its status"
            except (TimeoutError, AssertionError) as exc:
                pytest.fail(f"{exc}\n{wl.describe_namespace(api, gateway_ns)}")
            (gateway_pod,) = wl.pods(
                api, gateway_ns, f"gateway.networking.k8s.io/gateway-name={GATEWAY}"
            )
            account = gateway_pod.spec.service_account_name
            yield Scene(
                gateway_ns=gateway_ns,
                address=address,
                gateway_pod_ip=gateway_pod.status.pod_ip,
                gateway_identity=f"spiffe://cluster.local/ns/{gateway_ns}/sa/{account}",
                backends=backends,
            )
        finally:
            for ns in names.values():
                wl.delete_namespace_now(api, ns, wait=False)


def gateway_object() -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": GATEWAY},
        "spec": {
            "gatewayClassName": "meshctl",
            "listeners": [
                {
                    "name": "http",
                    "protocol": "HTTP",
                    "port": 80,
                    "allowedRoutes": {"namespaces": {"from": "All"}},
                }
            ],
        },
    }


def start_backend(api: Any, kind: str, ns: str, image: str, gateway_ns: str) -> Backend:
    """A busybox httpd serving one page at ``/<kind>/page.txt`` as ServiceAccount ``backend``,
    its Service (80 -> 8080) and an HTTPRoute for ``/<kind>`` on the Gateway; the pod Ready (and,
    meshed, with its proxy: the ambient agent's redirection, the injected sidecar)."""
    core = k8s.CoreV1Api(api)
    core.create_namespaced_service_account(ns, {"metadata": {"name": "backend"}})
    page = f"served-by-{kind}-{secrets.token_hex(8)}"
    serve = (
        f"mkdir -p /tmp/www/{kind} && echo {page} > /tmp/www/{kind}/page.txt"
        f" && exec httpd -f -p {APP_PORT} -h /tmp/www"
    )
    pod = wl.busybox_pod(
        "backend", image, ["sh", "-c", serve], serviceAccountName="backend",
    )  # fmt: skip
    pod["metadata"].setdefault("labels", {})["app"] = "backend"
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": APP_PORT, "name": "http"}]
    service = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "backend"},
        "spec": {
            "selector": {"app": "backend"},
            "ports": [{"name": "http", "port": 80, "targetPort": APP_PORT}],
        },
    }
    route = {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": "backend"},
        "spec": {
            "parentRefs": [{"name": GATEWAY, "namespace": gateway_ns}],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": f"/{kind}"}}],
                    "backendRefs": [{"name": "backend", "port": 80}],
                }
            ],
        },
    }
    core.create_namespaced_pod(ns, pod)
    wl.apply(api, [service, route], ns)
    try:
        running = wl.wait_pod_ready(api, ns, "backend", timeout=180)
    except TimeoutError as exc:
        pytest.fail(f"{exc}\n{wl.describe_namespace(api, ns)}")
    if kind == "ambient":
        enrolled = wl.retry(
            functools.partial(core.read_namespaced_pod, "backend", ns),
            lambda p: (p.metadata.annotations or {}).get(ambient.REDIRECTION) == "enabled",
            timeout=60,
        )
        assert enrolled.metadata.annotations[ambient.REDIRECTION] == "enabled"
    if kind == "sidecar":
        names = [c.name for c in [*(running.spec.init_containers or []), *running.spec.containers]]
        assert "istio-proxy" in names, f"the sidecar backend was not injected: {names}"
    return Backend(
        kind=kind,
        namespace=ns,
        page=page,
        pod_ip=running.status.pod_ip,
        identity=f"spiffe://cluster.local/ns/{ns}/sa/backend",
    )


def gateway_address(api: Any, ns: str) -> str:
    gateway = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", ns, "gateways", GATEWAY
    )
    addresses = (gateway.get("status") or {}).get("addresses") or []
    return str(addresses[0]["value"]) if addresses else ""


def get(address: str, path: str) -> tuple[int, str, dict[str, str]]:
    """One request from this machine to the Gateway's address (a new connection)."""
    conn = http.client.HTTPConnection(address, 80, timeout=10)
    try:
        conn.request("GET", path, headers={"Host": "gw.example.com"})
        answer = conn.getresponse()
        return answer.status, answer.read().decode(errors="replace"), dict(answer.getheaders())
    finally:
        conn.close()


def until_answered(scene: Scene, kind: str, status: int, timeout: float = 90) -> str:
    """Ask for ``kind``'s page until the gateway answers ``status``; the body."""
    last: list[Any] = []

    def asked() -> bool:
        try:
            last[:] = [get(scene.address, scene.backends[kind].path)]
        except OSError as exc:
            last[:] = [exc]
            return False
        return bool(last[0][0] == status)

    deadline = time.monotonic() + timeout
    while not asked():
        assert time.monotonic() < deadline, f"{kind}: never {status}, last: {last}"
        time.sleep(1)
    return str(last[0][1])


def tls_records(stream: bytes) -> list[int]:
    """The content types of the TLS records ``stream`` consists of; AssertionError if any byte
    of it is not part of a well-formed record."""
    types, at = [], 0
    while at < len(stream):
        header = stream[at : at + 5]
        assert len(header) == 5, f"a partial TLS record header at byte {at}: {header!r}"
        assert header[0] in TLS_CONTENT_TYPES, f"not a TLS record at byte {at}: {header!r}"
        assert header[1:3] in TLS_VERSIONS, f"not a TLS record at byte {at}: {header!r}"
        length = int.from_bytes(header[3:5], "big")
        assert at + 5 + length <= len(stream), f"a TLS record cut short at byte {at}"
        types.append(header[0])
        at += 5 + length
    return types


def connections(segments: list[Segment], a: str, b: str) -> dict[tuple[Any, Any], bytes]:
    """Payload per direction of each TCP connection between ``a`` and ``b`` (keyed src, dst)."""
    streams: dict[tuple[Any, Any], bytes] = {}
    for s in segments:
        if {s.src[0], s.dst[0]} == {a, b} and s.payload:
            streams[(s.src, s.dst)] = streams.get((s.src, s.dst), b"") + s.payload
    return streams


def assert_mtls_on_the_wire(segments: list[Segment], gateway_ip: str, backend: Backend) -> None:
    """Gateway to backend: only the backend's HBONE port, every byte both ways of every
    connection a TLS record (handshake first, then application data), none of the page."""
    streams = connections(segments, gateway_ip, backend.pod_ip)
    assert streams, f"{backend.kind}: the capture saw nothing between gateway and backend"
    for (src, dst), data in streams.items():
        assert backend.page.encode() not in data, f"{backend.kind}: the page in plaintext"
        assert backend.path.encode() not in data, f"{backend.kind}: the path in plaintext"
        towards = dst if src[0] == gateway_ip else src
        assert towards == (backend.pod_ip, HBONE_PORT), (backend.kind, src, dst)
        types = tls_records(data)
        assert types[0] == 22, (backend.kind, src, dst, types)
        assert 23 in types, (backend.kind, src, dst, types)


def sidecar_metrics(api: Any, backend: Backend) -> str:
    text = k8s.CoreV1Api(api).connect_get_namespaced_pod_proxy_with_path(
        "backend:15020", backend.namespace, "stats/prometheus"
    )
    return str(text)


def mtls_from(metrics: str, source: str) -> bool:
    return any(
        line.startswith("istio_tcp_connections_opened_total")
        and f'source_principal="{source}"' in line
        and 'connection_security_policy="mutual_tls"' in line
        for line in metrics.splitlines()
    )


def test_gateway_reaches_ambient_sidecar_and_unmeshed_backends_with_mtls_on_the_wire(
    kube_node: TestNode, scene: Scene, request
):
    report_namespace(request.node, SYSTEM_NS)
    report_namespace(request.node, scene.gateway_ns)
    ambient_b, sidecar_b, plain_b = (scene.backends[k] for k in BACKENDS)
    # From the first request on, so every connection the gateway opens is seen from its start.
    sniffer = Sniffer(None, nodehost.BRIDGE, promiscuous=True)
    try:
        bodies = {kind: until_answered(scene, kind, 200) for kind in BACKENDS}
        # A second round: kept connections (pooled HBONE) carry more requests, still TLS.
        again = {kind: get(scene.address, scene.backends[kind].path) for kind in BACKENDS}
    finally:
        segments = sniffer.stop()
    for kind, backend in scene.backends.items():
        assert bodies[kind] == backend.page + "\n", (kind, bodies[kind])
        assert again[kind][:2] == (200, backend.page + "\n"), (kind, again[kind])

    for meshed in (ambient_b, sidecar_b):
        assert_mtls_on_the_wire(segments, scene.gateway_pod_ip, meshed)
        streams = connections(segments, scene.gateway_pod_ip, meshed.pod_ip)
        records = sum(len(tls_records(data)) for data in streams.values())
        print(f"{meshed.kind}: {len(streams)} directions to :{HBONE_PORT}, {records} TLS records")
    # The unmeshed backend is reached in plaintext on its app port: the capture sees it.
    plain = connections(segments, scene.gateway_pod_ip, plain_b.pod_ip)
    assert plain, "the capture saw nothing between the gateway and the unmeshed backend"
    assert any(plain_b.page.encode() in data for data in plain.values())
    assert {dst for (src, dst) in plain if src[0] == scene.gateway_pod_ip} == {
        (plain_b.pod_ip, APP_PORT)
    }

    # The destinations saw the gateway's own identity, over mutual TLS.
    with kube_node.cluster.api_client() as api:
        opened = mtls_opened(api, SYSTEM_NS, scene.gateway_identity, ambient_b.identity)
        assert opened > 0, node_proxy_metrics(api, SYSTEM_NS)[-3000:]
        metrics = sidecar_metrics(api, sidecar_b)
        assert mtls_from(metrics, scene.gateway_identity), metrics[-3000:]


def test_verify_is_all_green_with_the_gateway_checks_passing(scene: Scene, mesh: Mesh):
    code, checks, printed = mesh.verify()
    assert code == 0, printed
    assert not failing(checks), printed
    for name in GATEWAY_CHECKS:
        assert checks[name]["result"] == "success", (name, printed)


def test_deny_policy_for_the_gateways_identity_refuses_only_that_backend(
    kube_node: TestNode, scene: Scene
):
    backend = scene.backends["ambient"]
    principal = scene.gateway_identity.removeprefix("spiffe://")
    policy = {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": "deny-gateway"},
        "spec": {
            "selector": {"matchLabels": {"app": "backend"}},
            "action": "DENY",
            "rules": [{"from": [{"source": {"principals": [principal]}}]}],
        },
    }
    with kube_node.cluster.api_client() as api:
        wl.apply(api, [policy], backend.namespace)
    until_answered(scene, "ambient", 503, timeout=60)
    status, _, headers = get(scene.address, backend.path)
    reason = {k.lower(): v for k, v in headers.items()}.get("x-meshctl-route", "")
    # The gateway's own answer: its only endpoint refused the tunnel (not a backend's 503).
    assert (status, reason.split(" ", 1)[0]) == (503, "no-healthy-upstream"), (status, headers)
    assert "HBONE CONNECT answered 401" in reason, reason  # the node proxy's policy refusal
    print(f"DENY at {backend.kind}: {status} x-meshctl-route: {reason}")
    for kind in ("sidecar", "plain"):
        status, body, _ = get(scene.address, scene.backends[kind].path)
        assert (status, body) == (200, scene.backends[kind].page + "\n"), kind
    # The policy was the cause: without it the backend answers again.
    with kube_node.cluster.api_client() as api:
        wl.delete(api, [policy], backend.namespace)
    assert until_answered(scene, "ambient", 200, timeout=60) == backend.page + "\n"


def test_uninstall_purge_leaves_nothing(kube_node: TestNode, scene: Scene, mesh: Mesh):
    removed = mesh.run("uninstall", "-y", "--purge", timeout=300)
    assert removed.returncode == 0, removed.stderr
    assert ours(kube_node) == []

    def provisioned() -> list[str]:
        listed = kube_node.cluster.kubectl_run(
            "get", "deployments,services,serviceaccounts", "-n", scene.gateway_ns,
            "--field-selector", f"metadata.name={PROVISIONED}", "-o", "name",
        )  # fmt: skip
        assert listed.returncode == 0, listed.stderr
        return listed.stdout.split()

    # The Gateway went with the CRDs; what was provisioned for it, with it (its owner).
    left = wl.retry(provisioned, lambda names: not names, timeout=60)
    assert left == [], json.dumps(left)
