"""Two ambient pods on the real node talking through the node proxy, checked in its metrics.

Shared by the ambient node tests (the manifests applied one by one) and the ambient install
test (``meshctl install --profile ambient``): the same proof whichever way the mesh got there.
"""

from __future__ import annotations

import functools
import time
import urllib.request
from typing import Any

from kubernetes import client as k8s

from meshctl.core.k8s import ambient

from . import workloads as wl

APP_PORT = 8080
NODE_PROXY_SELECTOR = "app.kubernetes.io/name=meshctl-ztunnel"


def talk_mtls_through_node_proxy(api: Any, namespace: str, image: str, system_ns: str) -> None:
    """Label ``namespace`` ambient, start a server and a client pod there (each its own service
    account), wait until the agent enrolled both, until the client reaches the server, and
    assert the node proxy counted that connection as mutual TLS between the two identities."""
    core = k8s.CoreV1Api(api)
    labels = {"metadata": {"labels": {ambient.DATAPLANE_MODE: ambient.MODE_AMBIENT}}}
    core.patch_namespace(namespace, labels)
    for sa in ("client", "server"):
        core.create_namespaced_service_account(namespace, {"metadata": {"name": sa}})
    server = wl.busybox_pod(
        "server", image, ["nc", "-ll", "-p", str(APP_PORT), "-e", "/bin/echo", "served"],
        serviceAccountName="server",
    )  # fmt: skip
    client = wl.busybox_pod("client", image, ["sleep", "3600"], serviceAccountName="client")
    core.create_namespaced_pod(namespace, server)
    core.create_namespaced_pod(namespace, client)
    running = {n: wl.wait_pod_ready(api, namespace, n, timeout=120) for n in ("server", "client")}
    for name in running:
        stored = wl.retry(
            functools.partial(core.read_namespaced_pod, name, namespace),
            lambda p: (p.metadata.annotations or {}).get(ambient.REDIRECTION) == "enabled",
            timeout=60,
        )
        assert stored.metadata.annotations[ambient.REDIRECTION] == "enabled"
    server_ip = running["server"].status.pod_ip

    def talked() -> bool:
        out = wl.pod_exec(
            api, namespace, "client", ["nc", "-w", "3", server_ip, str(APP_PORT)], timeout=20
        )
        return "served" in out.stdout

    deadline = time.monotonic() + 60  # until discovery carries both pods as HBONE
    while not talked():
        assert time.monotonic() < deadline, "the client never reached the server"
        time.sleep(1)
    client_id = f"spiffe://cluster.local/ns/{namespace}/sa/client"
    server_id = f"spiffe://cluster.local/ns/{namespace}/sa/server"
    assert mtls_opened(api, system_ns, client_id, server_id) > 0, node_proxy_metrics(
        api, system_ns
    )[-3000:]


def node_proxy_metrics(api: Any, system_ns: str) -> str:
    proxies = wl.pods(api, system_ns, NODE_PROXY_SELECTOR)
    assert proxies, "no node proxy pod"
    ip = proxies[0].status.pod_ip
    with urllib.request.urlopen(f"http://{ip}:15020/stats/prometheus", timeout=10) as answer:
        return str(answer.read().decode())


def mtls_opened(api: Any, system_ns: str, client_id: str, server_id: str) -> float:
    """Connections the node proxy opened with mutual TLS from ``client_id`` to ``server_id``
    (both reporters summed)."""
    total = 0.0
    for line in node_proxy_metrics(api, system_ns).splitlines():
        if (
            line.startswith("istio_tcp_connections_opened_total")
            and f'source_principal="{client_id}"' in line
            and f'destination_principal="{server_id}"' in line
            and 'connection_security_policy="mutual_tls"' in line
        ):
            total += float(line.rsplit(" ", 1)[1])
    return total
