"""The gateway controller and a real ``meshctl gateway run`` together: the control plane
(controller, CA, xDS) against the real kube-apiserver, the proxy as a subprocess configured
with the env the controller renders into its Deployment (addresses pointed at the test's control
plane, the mounts as files). The proxy and its backend share a network namespace of the test's
(an EndpointSlice may not name a loopback address, so the backend listens on an address of that
namespace's ``lo``); the control plane's port is relayed into it, and the test talks to the
proxy through sockets made in it (HTTP, and HTTPS with the listener's Secret sent over xDS).
"""

from __future__ import annotations

import base64
import contextlib
import http.client
import http.server
import os
import secrets
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes.client.exceptions import ApiException

from meshctl import components
from tests.harness import controlplane as cp
from tests.harness.kube import CertificateAuthority, KubeCluster, forward_into, request_token
from tests.harness.netns import Netns, random_subnet
from tests.kube.test_gateway_controller import (  # noqa: F401 -- fixtures, registered by import
    GROUP,
    VERSION,
    create,
    custom,
    gateway_class,
    gateway_crds,
    home,
    wait_for,
)

pytestmark = [pytest.mark.kube, pytest.mark.netns]  # the proxy and its backend in a netns

PAYLOAD = bytes(range(256)) * 9 + b"\r\n\x00end"  # every byte value, CRLF and NUL included


class Backend:
    """An HTTP/1.1 server on ``address`` in ``ns``: answers ``PAYLOAD`` + the path asked for."""

    def __init__(self, ns: Netns, address: str) -> None:
        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                body = PAYLOAD + self.path.encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(
            (address, 0), Handler, bind_and_activate=False
        )
        self.server.socket.close()
        self.server.socket = ns.socket()  # keeps the namespace; served from this thread
        self.server.server_bind()
        self.server.server_activate()
        self.server.daemon_threads = True
        self.address = address
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def pod_netns(netns: Netns) -> Netns:
    """The namespace of the proxy and its backend, its ``lo`` with a non-loopback address."""
    address = str(random_subnet().network_address + 2)
    with netns.ipr() as ipr:
        ipr.addr("add", index=ipr.link_lookup(ifname="lo")[0], address=address, prefixlen=32)
    return netns


@pytest.fixture
def backend(pod_netns: Netns) -> Iterator[Backend]:
    with pod_netns.ipr() as ipr:
        (address,) = [
            a.get_attr("IFA_ADDRESS")
            for a in ipr.get_addr(index=ipr.link_lookup(ifname="lo")[0], family=socket.AF_INET)
            if a.get_attr("IFA_ADDRESS") != "127.0.0.1"
        ]
    server = Backend(pod_netns, address)
    try:
        yield server
    finally:
        server.close()


OFFSET = 10000  # the namespace is the test's own: every port is free


@dataclass
class GatewayProcess:
    process: subprocess.Popen[bytes]
    log: Path
    ns: Netns
    offset: int = OFFSET

    def log_tail(self, lines: int = 60) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""

    def request(
        self, port: int, path: str, host: str, *, tls: ssl.SSLContext | None = None
    ) -> tuple[int, bytes, dict[str, str]]:
        """GET over HTTP/1.1 (TLS with SNI ``host`` when ``tls`` is given)."""
        conn = http.client.HTTPConnection("127.0.0.1", port + self.offset, timeout=10)
        sock = self.ns.socket()
        sock.settimeout(10)
        try:
            sock.connect(("127.0.0.1", port + self.offset))
            if tls is not None:
                sock = tls.wrap_socket(sock, server_hostname=host)
        except OSError:
            sock.close()
            raise
        conn.sock = sock
        try:
            conn.request("GET", path, headers={"Host": host})
            response = conn.getresponse()
            return response.status, response.read(), dict(response.getheaders())
        finally:
            conn.close()

    def ready(self) -> bool:
        try:
            return self.request(15021, "/healthz/ready", "localhost")[0] == 200
        except OSError:
            return False

    def stop(self, grace: float = 15.0) -> int:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=grace)
        finally:
            if self.process.poll() is None:
                self.process.kill()
                self.process.wait()


def pod_env(
    pod: dict[str, Any], plane: cp.ControlPlaneProcess, *, namespace: str
) -> tuple[list[str], dict[str, str]]:
    """The args and env of the pod template's gateway container as the kubelet would start it
    here: fieldRefs resolved, the control plane's Service address replaced by the test's (the
    projected token and root ConfigMap are files: ``start_gateway``)."""
    (container,) = pod["spec"]["containers"]
    fields = {
        "metadata.name": "gw-1",
        "metadata.namespace": namespace,
        "spec.serviceAccountName": pod["spec"]["serviceAccountName"],
        "status.podIP": "127.0.0.1",
        "spec.nodeName": "node-a",
    }
    env: dict[str, str] = {}
    for item in container["env"]:
        if "valueFrom" in item:
            env[item["name"]] = fields[item["valueFrom"]["fieldRef"]["fieldPath"]]
        else:
            env[item["name"]] = item.get("value") or ""
    address = f"127.0.0.1:{plane.grpc_port}"
    for name in ("CA_ADDRESS", "XDS_ADDRESS"):
        assert env[name], f"{name} not rendered"
        env[name] = address
    return list(container["args"]), env


def start_gateway(
    cluster: KubeCluster,
    plane: cp.ControlPlaneProcess,
    pod: tuple[list[str], dict[str, str]],
    workdir: Path,
    ns: Netns,
) -> GatewayProcess:
    """``meshctl <args>`` (``gateway run --gateway ...``) in ``ns`` with the pod's env, the
    mounted token and root as files, listeners on 127.0.0.1 behind ``OFFSET``; ready awaited."""
    args, env = pod
    assert args[:2] == ["gateway", "run"], args
    with cluster.api_client() as api:
        root = cp.root_pem(api, plane.namespace)
    token = request_token(cluster, env["POD_NAMESPACE"], env["SERVICE_ACCOUNT"], "istio-ca")
    secrets_dir = workdir / f"gw-{secrets.token_hex(2)}"
    secrets_dir.mkdir()
    (secrets_dir / "root-cert.pem").write_bytes(root)
    (secrets_dir / "istio-token").write_text(token)
    (secrets_dir / "certs").mkdir()
    log = secrets_dir / "gateway.log"
    child_env = {
        **os.environ,
        "MESHCTL_CONFIG": "",
        "KUBECONFIG": "",
        **env,
        # The mounts of the pod, as files here; the serving certificate names the Service.
        "AUTH_TOKEN": str(secrets_dir / "istio-token"),
        "XDS_ROOT_CA": str(secrets_dir / "root-cert.pem"),
        "CA_ROOT_CA": str(secrets_dir / "root-cert.pem"),
        "MESHCTL_CERT_DIR": str(secrets_dir / "certs"),
        "ALT_XDS_HOSTNAME": plane.server_name,
        "ALT_CA_HOSTNAME": plane.server_name,
    }
    argv = [
        *(sys.executable, "-c", "from meshctl.entry import run; run()"),
        *("--log-level", "info", *args),
        *("--bind-address", "127.0.0.1", "--port-offset", str(OFFSET)),
    ]
    with log.open("wb") as out:
        process = ns.popen(
            argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT, env=child_env
        )
    proxy = GatewayProcess(process, log, ns)
    deadline = time.monotonic() + 60
    while not proxy.ready():
        if process.poll() is not None or time.monotonic() > deadline:
            proxy.stop(grace=5)
            raise AssertionError(f"the gateway never got ready:\n{proxy.log_tail()}")
        time.sleep(0.2)
    return proxy


def service_and_endpoints(api: k8s.ApiClient, ns: str, backend: Backend) -> None:
    k8s.CoreV1Api(api).create_namespaced_service(
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
            "ports": [{"name": "", "port": backend.port, "protocol": "TCP"}],
            "endpoints": [{"addresses": [backend.address], "conditions": {"ready": True}}],
        },
    )


def http_route(rules: list[dict[str, Any]]) -> dict[str, Any]:
    return {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "HTTPRoute",
        "metadata": {"name": "web"},
        "spec": {"parentRefs": [{"name": "gw"}], "hostnames": ["web.example"], "rules": rules},
    }


def prefix_rule(path: str) -> dict[str, Any]:
    return {
        "matches": [{"path": {"type": "PathPrefix", "value": path}}],
        "backendRefs": [{"name": "web", "port": 80}],
    }


def wait_status(proxy: GatewayProcess, port: int, path: str, host: str, status: int) -> bytes:
    deadline = time.monotonic() + 30
    last: Any = None
    while time.monotonic() < deadline:
        try:
            got, body, headers = proxy.request(port, path, host)
        except OSError as exc:
            last = exc
        else:
            if got == status:
                return body
            last = (got, headers.get("x-meshctl-route"), body[:200])
        time.sleep(0.2)
    raise AssertionError(f"{path} on {port}: not {status} (last: {last!r})\n{proxy.log_tail()}")


def test_a_gateway_fed_over_xds_serves_a_route_an_edit_live_and_its_config_without_the_plane(
    gateway_crds: None,  # noqa: F811
    kube_cluster: KubeCluster,
    kube_api: k8s.ApiClient,
    kube_namespace: str,
    home: str,  # noqa: F811
    tmp_path: Path,
    pod_netns: Netns,
    backend: Backend,
) -> None:
    ns = kube_namespace
    gateway_class(kube_api)
    service_and_endpoints(kube_api, ns, backend)
    authority = CertificateAuthority("gw-e2e")
    pair = authority.issue("web.example", dns_sans=["web.example"], server=True)
    k8s.CoreV1Api(kube_api).create_namespaced_secret(
        ns,
        {
            "metadata": {"name": "cert"},
            "type": "kubernetes.io/tls",
            "data": {
                "tls.crt": base64.b64encode(pair.cert_pem).decode(),
                "tls.key": base64.b64encode(pair.key_pem).decode(),
            },
        },
    )
    tls = ssl.create_default_context(cadata=authority.cert_pem.decode())
    create(
        kube_api,
        ns,
        "gateways",
        {
            "apiVersion": f"{GROUP}/{VERSION}",
            "kind": "Gateway",
            "metadata": {"name": "gw"},
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
        },
    )
    create(kube_api, ns, "httproutes", http_route([prefix_rule("/app")]))
    plane = cp.start(kube_cluster, home, tmp_path)
    relay = contextlib.ExitStack()
    relay.enter_context(forward_into(pod_netns, plane.grpc_port, ("127.0.0.1", plane.grpc_port)))
    proxy: GatewayProcess | None = None
    try:
        deployment = wait_for(
            "the proxy's Deployment",
            lambda: k8s.AppsV1Api(kube_api).read_namespaced_deployment("gw-meshctl", ns),
        )
        template = kube_api.sanitize_for_serialization(deployment)["spec"]["template"]
        pod = pod_env(template, plane, namespace=ns)
        assert pod[0] == ["gateway", "run", "--gateway", f"{ns}/gw"]
        proxy = start_gateway(kube_cluster, plane, pod, tmp_path, pod_netns)

        body = wait_status(proxy, 80, "/app/x?q=1", "web.example", 200)
        assert body == PAYLOAD + b"/app/x?q=1"
        # HTTPS with the Secret's certificate, sent over xDS.
        status, body, _ = proxy.request(443, "/app/s", "web.example", tls=tls)
        assert (status, body) == (200, PAYLOAD + b"/app/s")
        status, _, headers = proxy.request(80, "/new/y", "web.example")
        assert status == 404, headers

        # A new path in the route: served by the same process, no restart.
        custom(kube_api).patch_namespaced_custom_object(
            GROUP,
            VERSION,
            ns,
            "httproutes",
            "web",
            {"spec": {"rules": [prefix_rule("/app"), prefix_rule("/new")]}},
        )
        assert wait_status(proxy, 80, "/new/y", "web.example", 200) == PAYLOAD + b"/new/y"
        assert proxy.process.poll() is None

        # The control plane gone: the gateway keeps serving what it holds.
        assert plane.stop() == 0, plane.log_tail()
        time.sleep(1.0)
        for path in ("/app/x", "/new/y"):
            status, body, _ = proxy.request(80, path, "web.example")
            assert (status, body) == (200, PAYLOAD + path.encode()), proxy.log_tail()
            status, body, _ = proxy.request(443, path, "web.example", tls=tls)
            assert (status, body) == (200, PAYLOAD + path.encode()), proxy.log_tail()
        assert proxy.ready(), proxy.log_tail()
    finally:
        if proxy is not None:
            assert proxy.stop() == 0, proxy.log_tail()
        plane.stop()
        relay.close()
        try:
            custom(kube_api).delete_namespaced_custom_object(GROUP, VERSION, ns, "gateways", "gw")
        except ApiException as exc:
            if exc.status != 404:
                raise


def test_an_ingress_of_class_meshctl_is_served_by_the_ingress_gateway(
    gateway_crds: None,  # noqa: F811
    kube_cluster: KubeCluster,
    kube_api: k8s.ApiClient,
    kube_namespace: str,
    home: str,  # noqa: F811
    tmp_path: Path,
    pod_netns: Netns,
    backend: Backend,
) -> None:
    ns = kube_namespace
    # Every Ingress of the class is in the one table: a host of this test's own (the API
    # server's objects outlive their namespace here: no namespace controller).
    host = f"shop-{secrets.token_hex(3)}.example"
    service_and_endpoints(kube_api, ns, backend)
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
    plane = cp.start(kube_cluster, home, tmp_path)
    relay = contextlib.ExitStack()
    relay.enter_context(forward_into(pod_netns, plane.grpc_port, ("127.0.0.1", plane.grpc_port)))
    proxy: GatewayProcess | None = None
    try:
        # The installed ingress gateway's pod (the demo profile's rendering), in the control
        # plane's namespace; its Service maps 80 -> 8080, where the Ingress table listens.
        registry = components.load()
        installed = registry.by_name["gateway"].objects(registry.resolve(profile="demo"))
        (deployment,) = [o for o in installed if o["kind"] == "Deployment"]
        (service,) = [o for o in installed if o["kind"] == "Service"]
        (port,) = [p["targetPort"] for p in service["spec"]["ports"] if p["port"] == 80]
        pod = pod_env(deployment["spec"]["template"], plane, namespace=home)
        # Ready before any Ingress of this test (a demo install's gateway must be); the
        # Ingress created then is served without a restart.
        proxy = start_gateway(kube_cluster, plane, pod, tmp_path, pod_netns)
        networking.create_namespaced_ingress(
            ns,
            {
                "metadata": {"name": "shop"},
                "spec": {
                    "ingressClassName": "meshctl",
                    "rules": [
                        {
                            "host": host,
                            "http": {
                                "paths": [
                                    {
                                        "path": "/cart",
                                        "pathType": "Prefix",
                                        "backend": {
                                            "service": {"name": "web", "port": {"number": 80}}
                                        },
                                    }
                                ]
                            },
                        }
                    ],
                },
            },
        )
        body = wait_status(proxy, port, "/cart/1", host, 200)
        assert body == PAYLOAD + b"/cart/1"
        status, _, headers = proxy.request(port, "/cartography", host)
        assert status == 404, headers
    finally:
        if proxy is not None:
            assert proxy.stop() == 0, proxy.log_tail()
        assert plane.stop() == 0, plane.log_tail()
        relay.close()
        with contextlib.suppress(ApiException):
            networking.delete_namespaced_ingress("shop", ns)
