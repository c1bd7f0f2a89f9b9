"""The ingress gateway under faults, on the real node, after ``meshctl install --profile demo``.

One Gateway of class ``meshctl`` (HTTP on 80) provisioned by the controller (``gw-meshctl``), an
HTTPRoute for ``/app`` to a Service whose pods are a Deployment's (busybox httpd, unmeshed). The
proxies run hardened: the provisioned gateway's and the installed ``meshctl-ingressgateway``'s
containers have a read-only root filesystem, no privilege escalation, every capability dropped,
a non-root uid and resources, and still serve (the install waits for the installed one's
readiness: its config arrived and its listeners bound). The backend's pods gone (scaled to 0)
make the route 503 with the reason in the response header and the gateway's access log; back,
the route answers 200 again within a bound. Killed without grace under traffic, every answer
is a 200 or the gateway's own 503, never a hang or a broken connection. The control plane gone,
the gateway keeps serving the config it holds (and a route change waits for it); back, the
change applies. Through all of it the gateway's pod is the same one, never restarted. The tests
run in order on one install.
"""

from __future__ import annotations

import functools
import http.client
import secrets
import threading
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.harness import workloads as wl
from tests.harness.mesh_install import Mesh, installed
from tests.harness.node import TestNode, report_namespace

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"
GATEWAY = "gw"
PROVISIONED = f"{GATEWAY}-meshctl"  # the Gateway's Deployment, Service and ServiceAccount
INSTALLED = "meshctl-ingressgateway"
CONTROL_PLANE = "app.kubernetes.io/name=meshctl-controlplane"
BACKEND = "backend"
APP_PORT = 8080
HOST = "faults.example.com"
RECOVERY_BOUND = 30.0  # seconds from the backend's pod Ready to the route answering 200
RETURN_BOUND = 90.0  # seconds from the control plane Ready to a route change served
HARDENED = {
    "allow_privilege_escalation": False,
    "privileged": False,
    "read_only_root_filesystem": True,
    "run_as_non_root": True,
}


@dataclass(frozen=True)
class Scene:
    namespace: str
    address: str  # the Gateway's status address (its Service's ClusterIP)
    page: str  # what the backend serves at /app/page.txt
    gateway_pod: str  # the name of the gateway's one pod
    gateway_uid: str


@pytest.fixture(scope="module")
def mesh(kube_node: TestNode) -> Iterator[Mesh]:
    with installed(Mesh(kube_node, "demo")) as mesh:
        yield mesh


@pytest.fixture(scope="module")
def scene(kube_node: TestNode, mesh: Mesh) -> Iterator[Scene]:
    ns = f"gwfaults-{secrets.token_hex(3)}"
    page = f"served-{secrets.token_hex(8)}"
    with kube_node.cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        try:
            core.create_namespace({"metadata": {"name": ns}})
            wl.wait_service_account(api, ns)
            wl.apply(
                api,
                [backend(kube_node.image("busybox"), page), service(), gateway(), route("/app")],
                ns,
            )
            try:
                wl.wait_rollout(api, "Deployment", ns, BACKEND, timeout=180)
                wl.wait_rollout(api, "Deployment", ns, PROVISIONED, timeout=180)
                address = wl.retry(functools.partial(gateway_address, api, ns), bool, timeout=60)
                assert address, "the Gateway got no address in its status"
                until(address, "/app/page.txt", 200, timeout=90)
            except (TimeoutError, AssertionError) as exc:
                pytest.fail(f"{exc}\n{wl.describe_namespace(api, ns)}")
            pod = gateway_pod(api, ns)
            yield Scene(
                namespace=ns,
                address=address,
                page=page,
                gateway_pod=pod.metadata.name,
                gateway_uid=pod.metadata.uid,
            )
        finally:
            wl.delete_namespace_now(api, ns, wait=False)


def backend(image: str, page: str) -> dict[str, Any]:
    serve = (
        f"mkdir -p /tmp/www/app /tmp/www/v2 && echo {page} > /tmp/www/app/page.txt"
        f" && echo {page} > /tmp/www/v2/page.txt && exec httpd -f -p {APP_PORT} -h /tmp/www"
    )
    pod = wl.busybox_pod(BACKEND, image, ["sh", "-c", serve])
    pod["spec"]["containers"][0]["ports"] = [{"containerPort": APP_PORT, "name": "http"}]
    pod["spec"]["containers"][0]["readinessProbe"] = {
        "tcpSocket": {"port": APP_PORT},
        "periodSeconds": 1,
    }
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": BACKEND},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": BACKEND}},
            "template": {"metadata": pod["metadata"], "spec": pod["spec"]},
        },
    }


def service() -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": BACKEND},
        "spec": {
            "selector": {"app": BACKEND},
            "ports": [{"name": "http", "port": 80, "targetPort": APP_PORT}],
        },
    }


def gateway() -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "Gateway",
        "metadata": {"name": GATEWAY},
        "spec": {
            "gatewayClassName": "meshctl",
            "listeners": [{"name": "http", "protocol": "HTTP", "port": 80}],
        },
    }


def route(*prefixes: str) -> dict[str, Any]:
    return {
        "apiVersion": "gateway.networking.k8s.io/v1",
        "kind": "HTTPRoute",
        "metadata": {"name": BACKEND},
        "spec": {
            "parentRefs": [{"name": GATEWAY}],
            "rules": [
                {
                    "matches": [{"path": {"type": "PathPrefix", "value": prefix}}],
                    "backendRefs": [{"name": BACKEND, "port": 80}],
                }
                for prefix in prefixes
            ],
        },
    }


def gateway_address(api: Any, ns: str) -> str:
    found = k8s.CustomObjectsApi(api).get_namespaced_custom_object(
        "gateway.networking.k8s.io", "v1", ns, "gateways", GATEWAY
    )
    addresses = (found.get("status") or {}).get("addresses") or []
    return str(addresses[0]["value"]) if addresses else ""


def gateway_pod(api: Any, ns: str) -> Any:
    (pod,) = wl.pods(api, ns, f"gateway.networking.k8s.io/gateway-name={GATEWAY}")
    return pod


def get(address: str, path: str, timeout: float = 10) -> tuple[int, str, str]:
    """One request on a new connection: status, body and the ``x-meshctl-route`` header."""
    conn = http.client.HTTPConnection(address, 80, timeout=timeout)
    try:
        conn.request("GET", path, headers={"Host": HOST})
        answer = conn.getresponse()
        body = answer.read().decode(errors="replace")
        return answer.status, body, answer.getheader("x-meshctl-route") or ""
    finally:
        conn.close()


def until(address: str, path: str, status: int, timeout: float) -> tuple[float, tuple[Any, ...]]:
    """Asks for ``path`` until the gateway answers ``status``: seconds taken, the answer."""
    started = time.monotonic()
    last: Any = None
    while True:
        try:
            last = get(address, path)
        except OSError as exc:
            last = exc
        else:
            if last[0] == status:
                return time.monotonic() - started, last
        assert time.monotonic() - started < timeout, f"{path}: never {status}, last: {last!r}"
        time.sleep(0.25)


def scale(api: Any, ns: str, name: str, replicas: int) -> None:
    k8s.AppsV1Api(api).patch_namespaced_deployment_scale(name, ns, {"spec": {"replicas": replicas}})


def assert_same_gateway_never_restarted(api: Any, scene: Scene) -> None:
    pod = gateway_pod(api, scene.namespace)
    assert pod.metadata.uid == scene.gateway_uid, "the gateway's pod was replaced"
    (status,) = pod.status.container_statuses
    assert status.restart_count == 0, wl.describe_namespace(api, scene.namespace)
    assert wl.pod_ready(pod), wl.describe_namespace(api, scene.namespace)


def assert_hardened(container: Any) -> None:
    security = container.security_context
    for field, want in HARDENED.items():
        assert getattr(security, field) == want, (container.name, field, security)
    assert security.capabilities.drop == ["ALL"], security
    assert not security.capabilities.add, security
    assert (security.run_as_user or 0) > 0, security
    resources = container.resources
    assert {"cpu", "memory"} <= (resources.requests or {}).keys(), resources
    assert {"cpu", "memory"} <= (resources.limits or {}).keys(), resources


def test_both_gateways_run_read_only_unprivileged_and_bounded_and_serve(
    kube_node: TestNode, scene: Scene, request
):
    report_namespace(request.node, SYSTEM_NS)
    report_namespace(request.node, scene.namespace)
    with kube_node.cluster.api_client() as api:
        provisioned = gateway_pod(api, scene.namespace)
        (installed_pod,) = wl.pods(api, SYSTEM_NS, f"app={INSTALLED}")
        for pod in (provisioned, installed_pod):
            (container,) = pod.spec.containers
            assert_hardened(container)
            assert wl.pod_ready(pod), pod.metadata.name
    status, body, _ = get(scene.address, "/app/page.txt")
    assert (status, body) == (200, scene.page + "\n")


def test_backend_scaled_to_zero_is_503_saying_why_then_200_again_without_a_gateway_restart(
    kube_node: TestNode, scene: Scene
):
    with kube_node.cluster.api_client() as api:
        scale(api, scene.namespace, BACKEND, 0)
        waited, (_, _, reason) = until(scene.address, "/app/page.txt", 503, timeout=60)
        print(f"backend scaled to 0: 503 after {waited:.1f}s, x-meshctl-route: {reason}")
        want = f"no-endpoint ({scene.namespace}/{BACKEND}:80 has no ready endpoint)"
        assert reason == want, reason

        def logged() -> str:
            return wl.pod_logs(api, scene.namespace, scene.gateway_pod, tail=200)

        log = wl.retry(logged, lambda text: f'reason="{want}"' in text, timeout=10)
        line = next(t for t in log.splitlines() if f'reason="{want}"' in t)
        assert '"GET /app/page.txt HTTP/1.1" 503' in line, line

        scale(api, scene.namespace, BACKEND, 1)
        wl.wait_rollout(api, "Deployment", scene.namespace, BACKEND, timeout=120)
        waited, (_, body, _) = until(scene.address, "/app/page.txt", 200, RECOVERY_BOUND)
        print(f"backend back: 200 {waited:.1f}s after its pod was Ready")
        assert body == scene.page + "\n"
        assert_same_gateway_never_restarted(api, scene)


def test_backend_pods_killed_under_traffic_get_only_200_or_the_gateways_503_then_200(
    kube_node: TestNode, scene: Scene
):
    answers: list[tuple[float, int | str, str]] = []  # seconds, status or error, reason
    stop = threading.Event()

    def traffic() -> None:
        while not stop.is_set():
            at = time.monotonic()
            try:
                status, _, reason = get(scene.address, "/app/page.txt")
            except OSError as exc:
                answers.append((time.monotonic() - at, f"{type(exc).__name__}: {exc}", ""))
            else:
                answers.append((time.monotonic() - at, status, reason))
            time.sleep(0.05)

    worker = threading.Thread(target=traffic, daemon=True)
    worker.start()
    try:
        with kube_node.cluster.api_client() as api:
            time.sleep(1)
            core = k8s.CoreV1Api(api)
            killed = {p.metadata.name for p in wl.pods(api, scene.namespace, f"app={BACKEND}")}
            for name in killed:
                core.delete_namespaced_pod(name, scene.namespace, grace_period_seconds=0)
            wl.retry(
                lambda: {p.metadata.name for p in wl.pods(api, scene.namespace, f"app={BACKEND}")},
                lambda names: bool(names) and not names & killed,
                timeout=60,
            )
            wl.wait_rollout(api, "Deployment", scene.namespace, BACKEND, timeout=120)
            until(scene.address, "/app/page.txt", 200, RECOVERY_BOUND)
            time.sleep(2)  # more 200s on the new pod
    finally:
        stop.set()
        worker.join(timeout=30)
    counted = Counter(a[1] for a in answers)
    slowest = max(a[0] for a in answers)
    print(f"pods killed under traffic: {dict(counted)}, slowest answer {slowest:.2f}s")
    broken = [a for a in answers if not isinstance(a[1], int) or a[1] not in (200, 503)]
    assert not broken, broken[:5]
    # Each 503 is the gateway's own answer, saying why.
    for _, status, reason in answers:
        if status == 503:
            assert reason.startswith(("no-endpoint (", "no-healthy-upstream (")), reason
    assert answers[-1][1] == 200, answers[-5:]
    with kube_node.cluster.api_client() as api:
        assert_same_gateway_never_restarted(api, scene)


def test_control_plane_down_the_gateway_serves_its_config_and_a_change_applies_on_return(
    kube_node: TestNode, scene: Scene
):
    with kube_node.cluster.api_client() as api:
        (plane,) = (
            k8s.AppsV1Api(api)
            .list_namespaced_deployment(SYSTEM_NS, label_selector=CONTROL_PLANE)
            .items
        )
        name, replicas = plane.metadata.name, plane.spec.replicas
        scale(api, SYSTEM_NS, name, 0)
        try:
            wl.retry(lambda: wl.pods(api, SYSTEM_NS, CONTROL_PLANE), lambda p: not p, timeout=90)
            assert not wl.pods(api, SYSTEM_NS, CONTROL_PLANE), "the control plane did not stop"
            # A change made now has no one to send it: the gateway keeps what it holds.
            wl.apply(api, [route("/app", "/v2")], scene.namespace)
            ends = time.monotonic() + 20
            served = 0
            while time.monotonic() < ends:
                status, body, _ = get(scene.address, "/app/page.txt")
                assert (status, body) == (200, scene.page + "\n"), (status, body)
                served += 1
                time.sleep(0.5)
            status, _, reason = get(scene.address, "/v2/page.txt")
            assert (status, reason.split(" ", 1)[0]) == (404, "no-route"), (status, reason)
            assert wl.pod_ready(gateway_pod(api, scene.namespace))
            print(f"control plane down: {served} requests served over 20s")
        finally:
            scale(api, SYSTEM_NS, name, replicas)
        wl.wait_rollout(api, "Deployment", SYSTEM_NS, name, timeout=180)
        # Back: the gateway reconnects and gets the change (the same backend serves /v2).
        waited, (_, body, _) = until(scene.address, "/v2/page.txt", 200, RETURN_BOUND)
        print(f"control plane back: the route change served {waited:.1f}s after its rollout")
        assert body == scene.page + "\n"
        assert_same_gateway_never_restarted(api, scene)
