"""The objects of a large cluster, written fast, for the control-plane scale benchmark.

Owns: a pool of HTTPS connections to the real kube-apiserver (admin client certificate, one
keep-alive connection per thread: the Python client's model layer would make the writes, not
the API server, the bottleneck), creating N Pods with ``status.podIP`` (create, then the status
subresource: the API ignores status on create, and no kubelet writes it here), M Services each
with an EndpointSlice of its pods, P AuthorizationPolicies, and moving pods to new IPs (a
rollout's status writes). Also the control plane's process facts from ``/proc`` (RSS, CPU).
Invariant: every call's status is checked; a failed write raises with the API's message.
"""

from __future__ import annotations

import http.client
import ipaddress
import json
import os
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from tests.harness.kube import KubeCluster

APP_LABEL = "app"
POD_BASE = ipaddress.ip_address("10.64.0.0")
MOVED_BASE = ipaddress.ip_address("10.128.0.0")


def pod_name(i: int) -> str:
    return f"w-{i:05d}"


def pod_ip(i: int) -> str:
    return str(POD_BASE + i)


def moved_ip(round_: int, i: int) -> str:
    """Pod ``i``'s IP after move ``round_`` (distinct for every round and pod)."""
    return str(MOVED_BASE + round_ * 16_384 + i)


def workload_uid(namespace: str, i: int) -> str:
    return f"Kubernetes//Pod/{namespace}/{pod_name(i)}"


class Api:
    """Raw JSON calls on thread-local keep-alive connections."""

    def __init__(self, cluster: KubeCluster) -> None:
        host, _, port = cluster.server.removeprefix("https://").rpartition(":")
        self._host, self._port = host, int(port)
        self._ctx = cluster.ssl_context()
        self._local = threading.local()

    def _conn(self) -> http.client.HTTPSConnection:
        conn = getattr(self._local, "conn", None)
        if conn is None:
            conn = http.client.HTTPSConnection(self._host, self._port, context=self._ctx)
            self._local.conn = conn
        return conn

    def call(
        self, method: str, path: str, body: Any = None, content_type: str = "application/json"
    ) -> Any:
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": content_type, "Accept": "application/json"}
        for attempt in range(3):
            conn = self._conn()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                payload = response.read()
                break
            except (OSError, http.client.HTTPException):
                conn.close()
                self._local.conn = None
                if attempt == 2:
                    raise
        if response.status >= 300:
            raise RuntimeError(f"{method} {path}: {response.status} {payload[:300]!r}")
        return json.loads(payload) if payload else None


def parallel(calls: Iterable[Callable[[], Any]], threads: int = 16) -> None:
    with ThreadPoolExecutor(threads) as pool:
        for future in [pool.submit(c) for c in calls]:
            future.result()


def _pod(i: int, services: int) -> dict[str, Any]:
    app = f"svc-{i % services:04d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": pod_name(i),
            "labels": {APP_LABEL: app, "version": "v1"},
        },
        "spec": {
            "nodeName": f"node-{i % 20}",
            "containers": [
                {
                    "name": "app",
                    "image": "registry.invalid/app:1",
                    "ports": [{"name": "http", "containerPort": 8080}],
                }
            ],
        },
    }


def _status(ip: str) -> dict[str, Any]:
    return {
        "status": {
            "phase": "Running",
            "podIP": ip,
            "podIPs": [{"ip": ip}],
            "hostIP": "192.168.0.10",
            "conditions": [{"type": "Ready", "status": "True"}],
        }
    }


def set_ip(api: Api, namespace: str, i: int, ip: str) -> None:
    api.call(
        "PATCH",
        f"/api/v1/namespaces/{namespace}/pods/{pod_name(i)}/status",
        _status(ip),
        "application/merge-patch+json",
    )


def _slice(namespace: str, j: int, pods: int, services: int) -> dict[str, Any]:
    name = f"svc-{j:04d}"
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {"name": f"{name}-abcde", "labels": {"kubernetes.io/service-name": name}},
        "addressType": "IPv4",
        "ports": [{"name": "http", "port": 8080, "protocol": "TCP"}],
        "endpoints": [
            {
                "addresses": [pod_ip(i)],
                "conditions": {"ready": True},
                "targetRef": {"kind": "Pod", "namespace": namespace, "name": pod_name(i)},
            }
            for i in range(j, pods, services)
        ],
    }


def _policy(k: int, services: int) -> dict[str, Any]:
    return {
        "apiVersion": "security.istio.io/v1",
        "kind": "AuthorizationPolicy",
        "metadata": {"name": f"allow-{k:03d}"},
        "spec": {
            "selector": {"matchLabels": {APP_LABEL: f"svc-{k % services:04d}"}},
            "action": "ALLOW",
            "rules": [{"from": [{"source": {"principals": [f"cluster.local/ns/x/sa/c{k}"]}}]}],
        },
    }


def populate(
    cluster: KubeCluster, namespace: str, *, pods: int, services: int, policies: int
) -> dict[str, float]:
    """Creates the objects in ``namespace`` (created by the caller); returns timings."""
    api = Api(cluster)
    ns = f"/api/v1/namespaces/{namespace}"
    started = time.monotonic()
    parallel(
        lambda j=j: api.call(
            "POST",
            f"{ns}/services",
            {
                "metadata": {"name": f"svc-{j:04d}"},
                "spec": {
                    "selector": {APP_LABEL: f"svc-{j:04d}"},
                    "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
                },
            },
        )
        for j in range(services)
    )
    policies_path = f"/apis/security.istio.io/v1/namespaces/{namespace}/authorizationpolicies"
    parallel(
        lambda k=k: api.call("POST", policies_path, _policy(k, services)) for k in range(policies)
    )

    def pod(i: int) -> None:
        api.call("POST", f"{ns}/pods", _pod(i, services))
        set_ip(api, namespace, i, pod_ip(i))

    parallel((lambda i=i: pod(i)) for i in range(pods))
    slices = f"/apis/discovery.k8s.io/v1/namespaces/{namespace}/endpointslices"
    parallel(
        lambda j=j: api.call("POST", slices, _slice(namespace, j, pods, services))
        for j in range(services)
    )
    seconds = time.monotonic() - started
    writes = services * 2 + policies + pods * 2
    return {"populate s": seconds, "API writes/s": writes / seconds}


class PodIpWatch:
    """The baseline: a plain watch of the namespace's pods (raw JSON lines, in a thread),
    stamping when each (pod, IP) was first seen; re-watched from the last resourceVersion when
    the API server ends a watch (it does every few minutes), so a long run keeps its baseline."""

    def __init__(self, cluster: KubeCluster, namespace: str) -> None:
        self._api = Api(cluster)
        self._path = f"/api/v1/namespaces/{namespace}/pods"
        self._seen: dict[tuple[str, str], float] = {}
        self._stop = threading.Event()
        listed = self._api.call("GET", f"{self._path}?limit=1")
        self._version = listed["metadata"]["resourceVersion"]
        self._thread = threading.Thread(target=self._run, args=(cluster,), daemon=True)
        self._thread.start()

    def _run(self, cluster: KubeCluster) -> None:
        host, _, port = cluster.server.removeprefix("https://").rpartition(":")
        while not self._stop.is_set():
            conn = http.client.HTTPSConnection(host, int(port), context=cluster.ssl_context())
            try:
                query = f"watch=1&resourceVersion={self._version}&timeoutSeconds=300"
                conn.request("GET", f"{self._path}?{query}")
                response = conn.getresponse()
                for line in response:
                    event = json.loads(line)
                    obj = event["object"]
                    now = time.monotonic()
                    self._version = obj["metadata"].get("resourceVersion", self._version)
                    ip = obj.get("status", {}).get("podIP", "")
                    self._seen.setdefault((obj["metadata"]["name"], ip), now)
                    if self._stop.is_set():
                        break
            except (OSError, http.client.HTTPException, ValueError, KeyError):
                time.sleep(0.2)  # the API server went away (the end of a run) or ended the watch
            finally:
                conn.close()

    def first(self, name: str, ip: str, since: float, wait: float = 5.0) -> float | None:
        """When the watch first saw pod ``name`` at ``ip`` (None: not seen after ``since``
        within ``wait`` seconds from now: the watch's thread may still be reading it)."""
        deadline = time.monotonic() + wait
        while (at := self._seen.get((name, ip))) is None and time.monotonic() < deadline:
            time.sleep(0.01)
        return at if at is not None and at >= since else None

    def stop(self) -> None:
        self._stop.set()


# -- the control plane's process ------------------------------------------------------------------

_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """User + system CPU of ``pid`` so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    return (int(fields[11]) + int(fields[12])) / _TICK


def rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


class PeakRss:
    """Samples ``pid``'s RSS every 50 ms in a thread; ``peak`` is the highest seen."""

    def __init__(self, pid: int) -> None:
        self.peak = rss_mb(pid)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(pid,), daemon=True)
        self._thread.start()

    def _run(self, pid: int) -> None:
        while not self._stop.wait(0.05):
            try:
                self.peak = max(self.peak, rss_mb(pid))
            except OSError:
                return

    def stop(self) -> float:
        self._stop.set()
        self._thread.join()
        return self.peak
