"""``meshctl stat``, ``top`` and ``verify --proxy`` on the real node, against meshed pods.

One install of the ambient profile (the default one plus the node proxy; the CLI from this
checkout, the mesh from the meshctl image); in a namespace labelled for injection (sidecars), then
in one labelled ambient (the node proxy serves both pods), a server Deployment (busybox httpd on
8080) and a client Deployment. While
``meshctl stat deploy -o json --window 20s`` is between its two scrapes, the client opens a known
number of connections to the server's 8080 and a known number to 9090, where nothing listens
(the server's sidecar cannot reach the app: a failed connection, as its metrics count it). The
server's row shows exactly those counts, the success share they make, a rate over the window and
mTLS for all of them (from the sidecar's own metrics, or from the node proxy's by the
destination workload's labels); ``verify --proxy`` is all green for the namespace's two pods.
"""

from __future__ import annotations

import json
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from kubernetes import client as k8s

from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.cli import MESHCTL
from tests.harness.mesh_install import Mesh, installed
from tests.harness.node import TestNode, report_namespace

pytestmark = pytest.mark.node

SYSTEM_NS = "meshctl-system"
APP_PORT = 8080
CLOSED_PORT = 9090
GOOD, BAD = 20, 5
WINDOW = 20.0


@pytest.fixture(scope="module")
def mesh(kube_node: TestNode) -> Iterator[Mesh]:
    netns_dir = nodehost.WORKDIR / "containerd" / "state"
    with installed(
        Mesh(kube_node, "ambient", extra=["--set", f"components.cni.netnsDir={netns_dir}"])
    ) as mesh:
        yield mesh


def deployment(name: str, image: str, script: str) -> dict[str, Any]:
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name},
        "spec": {
            "replicas": 1,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "terminationGracePeriodSeconds": 0,
                    "containers": [
                        {
                            "name": "main",
                            "image": image,
                            "imagePullPolicy": "Never",
                            "command": ["sh", "-c", script],
                        }
                    ],
                },
            },
        },
    }


def nc_loop(ip: str, port: int, count: int, request: bool) -> str:
    send = "printf 'GET / HTTP/1.0\\r\\n\\r\\n'" if request else "true"
    return f"for i in $(seq {count}); do {send} | nc -w 3 {ip} {port} >/dev/null 2>&1; done"


def stat_around(
    node: TestNode, namespace: str, proxies: int, traffic: Callable[[], None]
) -> list[Any]:
    """``meshctl stat deploy -o json`` whose window holds ``traffic`` (run once the first scrape
    is done, and over before the second): its rows."""
    stat = subprocess.Popen(
        [*MESHCTL, "--kubeconfig", str(node.cluster.kubeconfig), "stat", "deploy",
         "-n", namespace, "-o", "json", "--window", f"{WINDOW:g}s"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert stat.stderr is not None
        first = stat.stderr.readline()  # "scraped N proxies; again in 20s"
        assert first.startswith(f"scraped {proxies} proxies"), first + stat.stderr.read()
        rest: list[str] = []
        drain = threading.Thread(target=lambda: rest.extend(stat.stderr or ()), daemon=True)
        drain.start()
        began = time.monotonic()
        traffic()
        assert time.monotonic() - began < WINDOW, "the traffic outlasted the window"
        out, _ = stat.communicate(timeout=WINDOW + 60)
    finally:
        if stat.poll() is None:
            stat.kill()
    assert stat.returncode == 0, "".join(rest)
    rows: list[Any] = json.loads(out)
    return rows


MODES = {
    "sidecar": ({"istio-injection": "enabled"}, 2),  # labels, proxies scraped: one per pod
    "ambient": ({"istio.io/dataplane-mode": "ambient"}, 1),  # both pods on the node's proxy
}


@pytest.mark.parametrize("mode", list(MODES))
def test_stat_counts_the_connections_a_client_made_and_verify_proxy_is_green(
    kube_node: TestNode, mesh: Mesh, node_namespace: str, request: pytest.FixtureRequest, mode: str
):
    report_namespace(request.node, SYSTEM_NS)
    labels, proxies = MODES[mode]
    busybox = kube_node.image("busybox")
    serve = (
        "mkdir -p /tmp/www && echo served > /tmp/www/index.html"
        f" && exec httpd -f -p {APP_PORT} -h /tmp/www"
    )
    with kube_node.cluster.api_client() as api:
        k8s.CoreV1Api(api).patch_namespace(node_namespace, {"metadata": {"labels": labels}})
        wl.apply(
            api,
            [deployment("web", busybox, serve), deployment("client", busybox, "exec sleep 1d")],
            node_namespace,
        )
        wl.wait_rollout(api, "Deployment", node_namespace, "web", timeout=180)
        wl.wait_rollout(api, "Deployment", node_namespace, "client", timeout=180)
        [server] = wl.pods(api, node_namespace, "app=web")
        [client] = wl.pods(api, node_namespace, "app=client")
        ip = server.status.pod_ip

        def sh(script: str, timeout: float = 60) -> Any:
            return wl.pod_exec(
                api, node_namespace, client.metadata.name, ["sh", "-c", script],
                container="main", timeout=timeout,
            )  # fmt: skip

        fetch = f"printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 5 {ip} {APP_PORT}"
        deadline = time.monotonic() + 90  # until enrolled and discovery carries both as meshed
        while "served" not in sh(fetch).stdout or not meshed(api, node_namespace, mode):
            assert time.monotonic() < deadline, "the client never reached the server meshed"
            time.sleep(1)

        def traffic() -> None:
            done = sh(
                f"{nc_loop(ip, APP_PORT, GOOD, True)}; {nc_loop(ip, CLOSED_PORT, BAD, False)};"
                " echo finished",
                timeout=WINDOW,
            )
            assert done.stdout.strip().endswith("finished"), done

        rows = {r["name"]: r for r in stat_around(kube_node, node_namespace, proxies, traffic)}
        web = rows["web"]
        assert web["meshed"] == "1/1", web
        assert web["reason"] is None, web
        assert web["connections"] == GOOD, web
        assert web["failedConnections"] == BAD, web
        assert web["success"] == round(GOOD / (GOOD + BAD), 4), web
        assert web["successOf"] == "connections"
        assert web["mtls"] == 1.0, web
        assert WINDOW <= web["windowSeconds"] < WINDOW + 10, web
        assert web["cps"] == pytest.approx(GOOD / WINDOW, rel=0.35), web
        assert web["bytesOutPerSecond"] > 0, web  # "served" and the headers, back to the client
        assert rows["client"]["meshed"] == "1/1"
        assert rows["client"]["connections"] == 0  # the client's outbound is not its inbound

    verified = mesh.run(
        "verify", "--proxy", "--proxy-namespace", node_namespace, "-o", "json", timeout=120
    )
    assert verified.returncode == 0, verified.stdout + verified.stderr
    records = json.loads(verified.stdout)
    assert sorted((r["name"].split("-")[0], r["mode"]) for r in records) == [
        ("client", mode),
        ("web", mode),
    ]
    assert all(r["result"] == "success" for r in records), records

    top = mesh.run("top", "-n", node_namespace, "--once", "-o", "json", "--interval", "1s")
    assert top.returncode == 0, top.stderr
    assert {r["name"] for r in json.loads(top.stdout)} == {
        server.metadata.name,
        client.metadata.name,
    }


def meshed(api: Any, namespace: str, mode: str) -> bool:
    """Both pods have their proxy: injected (sidecar), or enrolled by the node agent (ambient)."""
    if mode == "sidecar":
        return True  # injection happened at creation; the fetch above went through it
    pods = wl.pods(api, namespace)
    return len(pods) == 2 and all(
        (p.metadata.annotations or {}).get("ambient.istio.io/redirection") == "enabled"
        for p in pods
    )
