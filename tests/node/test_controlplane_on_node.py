"""``meshctl controlplane run`` on the real node: the manifest's 2-replica Deployment from our
image injects two pods through the API server, the kubelet projects their tokens and mounts the
mesh root the leader published, their sidecars get identities from the CA and workloads from
discovery with no files of their own, carry mTLS traffic, keep serving while the control plane is
gone, and rotate at a short TTL during a transfer without losing a byte.

Capture comes from the CNI DaemonSet (CNI mode: the image carries no iptables libraries for an
init container). The short TTL reaches the sidecars through the pods' ``proxy.istio.io/config``
proxyMetadata (the webhook URL path cannot carry it: the API server allows only lower-case
segments there, and Istio's path keys are env names). The control plane is reached at its
Service's ClusterIP (the node runs no cluster DNS), which ``--serving-names`` puts in its
certificate.
"""

from __future__ import annotations

import contextlib
import json
import secrets
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import yaml
from kubernetes import client as k8s
from meshctl_plugins.controlplane import crds
from meshctl_plugins.controlplane.manifest import ControlPlaneValues
from meshctl_plugins.controlplane.manifest import objects as controlplane_objects

from meshctl.core.k8s.install.components import InstallValues
from tests.harness import workloads as wl
from tests.harness.controlplane import remove_published_roots
from tests.harness.node import TestNode, report_namespace

pytestmark = pytest.mark.node

TTL = "30s"  # renewal every ~15 s
BIG = 96 * 1024 * 1024


def _env(container: dict[str, Any], **values: str) -> None:
    container["env"] = [
        *container.get("env", []),
        *({"name": k, "value": v} for k, v in values.items()),
    ]


@contextlib.contextmanager
def control_plane(
    kube_node: TestNode, home: str, revision: str
) -> Iterator[tuple[str, list[dict[str, Any]]]]:
    """The manifest, applied (ClusterIP named in the serving certificate); yields the ClusterIP."""
    image = kube_node.image("meshctl")
    install = InstallValues(namespace=home, image=image, revision=revision, image_pull_policy="")
    items = controlplane_objects(install, ControlPlaneValues(replicas=2))
    with kube_node.cluster.api_client() as api:
        service = next(i for i in items if i["kind"] == "Service")
        try:
            wl.apply(api, [service], home)
            name = service["metadata"]["name"]
            ip = k8s.CoreV1Api(api).read_namespaced_service(name, home).spec.cluster_ip
            for item in items:
                if item["kind"] == "Deployment":
                    (container,) = item["spec"]["template"]["spec"]["containers"]
                    _env(
                        container,
                        MESHCTL_SERVING_NAMES=ip,
                        MESHCTL_CA_ADDRESS=f"{ip}:15012",  # what the injector tells sidecars
                        MESHCTL_INJECT_IMAGE=image,
                        MESHCTL_INJECT_CNI="true",
                    )
            wl.apply(api, crds.objects())  # discovery is not ready without its CRD
            wl.apply(api, [i for i in items if i is not service], home)
            try:
                wl.wait_rollout(api, "Deployment", home, name, timeout=240)
            except TimeoutError as exc:
                pytest.fail(f"{exc}\n{wl.describe_namespace(api, home)}")
            yield ip, items
        finally:
            wl.delete(api, items, home)
            remove_published_roots(api)


def _wait(what: str, check: Any, timeout: float = 120.0) -> Any:
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        with contextlib.suppress(k8s.ApiException):
            last = check()
            if last:
                return last
        time.sleep(0.5)
    raise TimeoutError(f"{what}: not within {timeout:.0f}s (last: {last!r})")


def _exec(api: k8s.ApiClient, ns: str, pod: str, script: str, timeout: float = 60) -> wl.ExecResult:
    return wl.pod_exec(api, ns, pod, ["sh", "-c", script], timeout=timeout)


def _get(api: k8s.ApiClient, ns: str, pod: str, url: str) -> wl.ExecResult:
    # No ``-T``: Debian's static busybox wget segfaults with it (exit 139, nothing fetched);
    # the exec itself has a deadline.
    return _exec(api, ns, pod, f"wget -q -O - {url}")


def _config_dump(api: k8s.ApiClient, ns: str, pod: str) -> dict[str, Any]:
    """The pod's sidecar ``/config_dump`` (fetched from the app container; retried a while:
    on a loaded machine a dump can take longer than one wget's patience)."""
    got = wl.retry(
        lambda: _get(api, ns, pod, "http://127.0.0.1:15000/config_dump"),
        lambda r: r.returncode == 0 and r.stdout.startswith("{"),
        timeout=60,
    )
    assert got.returncode == 0, f"{pod}: /config_dump: {got}"
    dump: dict[str, Any] = json.loads(got.stdout)
    return dump


def _certificate(api: k8s.ApiClient, ns: str, pod: str) -> dict[str, Any]:
    """``certificates[0]`` of the pod's sidecar ``/config_dump``."""
    cert: dict[str, Any] = _config_dump(api, ns, pod)["certificates"][0]
    return cert


def _wait_mesh_root(api: k8s.ApiClient, app: str, items: list[dict[str, Any]]) -> None:
    """The leader's writes the pods need: the root ConfigMap they mount, the caBundle the API
    server checks the webhook with."""
    core = k8s.CoreV1Api(api)
    _wait(
        "root ConfigMap",
        lambda: (core.read_namespaced_config_map("meshctl-ca-root-cert", app).data or {}).get(
            "root-cert.pem"
        ),
    )
    name = next(i for i in items if i["kind"] == "MutatingWebhookConfiguration")["metadata"]["name"]
    admission = k8s.AdmissionregistrationV1Api(api)
    _wait(
        "caBundle patched",
        lambda: all(
            w.client_config.ca_bundle
            for w in admission.read_mutating_webhook_configuration(name).webhooks
        ),
    )


def _start_pods(api: k8s.ApiClient, app: str, busybox: str) -> str:
    """Two plain pods the API server sends to the webhook; returns the server's IP."""
    core = k8s.CoreV1Api(api)
    serve = (
        f"head -c {BIG} /dev/zero | tr '\\0' 'm' > /tmp/big && mkdir -p /tmp/www && "
        "mv /tmp/big /tmp/www/big && echo hello > /tmp/www/index.html && "
        "exec httpd -f -p 8080 -h /tmp/www"
    )
    for name, command in (("server", serve), ("client", "exec sleep 3600")):
        core.create_namespaced_service_account(app, {"metadata": {"name": name}})
        pod = wl.busybox_pod(name, busybox, ["sh", "-c", command])
        pod["spec"]["serviceAccountName"] = name
        # The short lifetime the sidecar asks for, as Istio's proxyMetadata sets proxy env.
        config = yaml.safe_dump({"proxyMetadata": {"SECRET_TTL": TTL}})
        pod["metadata"]["annotations"] = {"proxy.istio.io/config": config}
        created = core.create_namespaced_pod(app, pod)
        names = [c.name for c in (created.spec.init_containers or [])]
        assert "istio-proxy" in names, f"{name} not injected: {names}"
    server = wl.wait_pod_ready(api, app, "server", timeout=240)
    wl.wait_pod_ready(api, app, "client", timeout=240)
    ip: str = server.status.pod_ip
    return ip


def _fetch(api: k8s.ApiClient, app: str, server_ip: str, timeout: float = 30) -> str:
    got = wl.retry(
        lambda: _get(api, app, "client", f"http://{server_ip}:8080/index.html"),
        lambda r: r.returncode == 0,
        timeout=timeout,
    )
    return got.stdout


def _check_identities_and_mtls(api: k8s.ApiClient, app: str, ca_ip: str, server_ip: str) -> None:
    # Identities from the CA (no files mounted), asked for with the kubelet's projected tokens;
    # workloads from discovery: both pods, with their addresses and accounts, as HBONE.
    for name in ("client", "server"):
        dump = _config_dump(api, app, name)
        cert = dump["certificates"][0]
        assert cert["source"]["kind"] == "ca", cert
        assert cert["source"]["caAddress"] == f"{ca_ip}:15012"
        assert cert["certChain"][0]["uriSans"] == [f"spiffe://cluster.local/ns/{app}/sa/{name}"]
        assert dump["xds"]["address"] == f"{ca_ip}:15012", dump["xds"]
        assert dump["xds"]["synced"], dump["xds"]
    seen = _wait(
        "the server's workload from discovery",
        lambda: [
            w
            for w in _config_dump(api, app, "client")["workloads"]
            if w["namespace"] == app and w["name"] == "server" and server_ip in w["workloadIps"]
        ],
        timeout=30,
    )
    assert seen[0]["serviceAccount"] == "server", seen
    assert seen[0]["protocol"] == "HBONE", seen
    assert _fetch(api, app, server_ip) == "hello\n"
    # mTLS: the server's sidecar saw the client's identity on an HBONE connection.
    metrics = _get(api, app, "server", "http://127.0.0.1:15020/metrics").stdout
    opened = [
        line
        for line in metrics.splitlines()
        if line.startswith("istio_tcp_connections_opened_total")
        and 'connection_security_policy="mutual_tls"' in line
        and f'source_principal="spiffe://cluster.local/ns/{app}/sa/client"' in line
    ]
    assert opened, metrics[-2000:]


def _rotation_during_transfer(api: k8s.ApiClient, app: str, server_ip: str) -> None:
    # A reader that takes its time (128 KiB, a pause, until the end) spans several renewals.
    download = (
        f"rm -f /tmp/got; wget -q -O - http://{server_ip}:8080/big | {{ while :; do "
        "n=$(dd bs=131072 count=1 2>/dev/null | tee -a /tmp/got | wc -c); "
        '[ "$n" -eq 0 ] && break; sleep 0.02; done; }; '
        "wc -c < /tmp/got; tr -d m < /tmp/got | wc -c; rm -f /tmp/got"
    )
    result: dict[str, wl.ExecResult] = {}
    worker = threading.Thread(
        target=lambda: result.update(r=_exec(api, app, "client", download, timeout=300))
    )
    serials = set()
    started = time.monotonic()
    worker.start()
    while worker.is_alive():
        for name in ("client", "server"):
            serials.add(_certificate(api, app, name)["certChain"][0]["serialNumber"])
        time.sleep(2)
    worker.join()
    took = time.monotonic() - started
    assert result["r"].returncode == 0, result["r"]
    assert result["r"].stdout.split() == [str(BIG), "0"], "bytes lost or changed"
    assert took > 20, f"the transfer took {took:.0f}s: too short to span renewals"
    assert len(serials) >= 4, f"{len(serials)} certificates during {took:.0f}s"


def _ca_outage(
    api: k8s.ApiClient, app: str, home: str, items: list[dict[str, Any]], server_ip: str
) -> None:
    # Both replicas go: the sidecars keep serving on their certificates and say why renewal
    # fails; the replicas come back (same root, from its Secret) and renewal recovers.
    deployment = next(i for i in items if i["kind"] == "Deployment")["metadata"]["name"]
    apps = k8s.AppsV1Api(api)
    apps.patch_namespaced_deployment_scale(deployment, home, {"spec": {"replicas": 0}})

    def failing() -> bool:
        ready = _get(api, app, "client", "http://127.0.0.1:15021/healthz/ready")
        return "renewal failing" in ready.stdout

    _wait("renewal failure reported", failing, timeout=60)
    assert _fetch(api, app, server_ip, timeout=5) == "hello\n"
    apps.patch_namespaced_deployment_scale(deployment, home, {"spec": {"replicas": 2}})
    wl.wait_rollout(api, "Deployment", home, deployment, timeout=240)
    _wait("renewal recovered", lambda: _certificate(api, app, "client")["source"]["renewing"])
    assert _fetch(api, app, server_ip, timeout=60) == "hello\n"


def test_the_controlplane_deployment_gives_injected_pods_identities_and_mtls(
    kube_node: TestNode, cni_capture: None, node_namespace: str, request: pytest.FixtureRequest
) -> None:
    busybox = kube_node.image("busybox")
    revision = f"e2e{secrets.token_hex(2)}"
    app = f"app-{secrets.token_hex(3)}"
    with kube_node.cluster.api_client() as api, contextlib.ExitStack() as undo:
        report_namespace(request.node, app)
        ca_ip, items = undo.enter_context(control_plane(kube_node, node_namespace, revision))
        k8s.CoreV1Api(api).create_namespace(
            {"metadata": {"name": app, "labels": {"istio.io/rev": revision}}}
        )
        undo.callback(wl.delete_namespace_now, api, app)
        wl.wait_service_account(api, app)
        _wait_mesh_root(api, app, items)
        server_ip = _start_pods(api, app, busybox)
        _check_identities_and_mtls(api, app, ca_ip, server_ip)
        _rotation_during_transfer(api, app, server_ip)
        _ca_outage(api, app, node_namespace, items, server_ip)
