"""Benchmark: discovery's push latency to 50 proxies, and the store's memory per 1,000 workloads.

Run from the repository root (root, kube binaries built by tests/kube/build.sh):
    python -m tests.bench.bench_discovery [--proxies 50] [--pods 200] [--changes 40]
    python -m tests.bench.bench_discovery --smoke      # CI: tiny, asserts only that figures came

Push latency, end to end: a real kube-apiserver, ``meshctl controlplane run`` as a subprocess
and ``--proxies`` node-proxy streams (the proto-only test client, subscribing and ACKing as
ztunnel does, each authenticated by a real TokenReview). Each change rewrites one pod's status
(a new IP) through the API; the figure is the time from just before that write to each proxy
receiving the pushed workload with the new IP (p50/p99 over changes x proxies). Baseline in the
same run: the same change seen by a plain Kubernetes watch of the namespace's pods from this
process (what any controller waits for before it can act). Target: p99 <= 100 ms.

Memory: ``--workloads`` realistic Pods (with Services selecting them and policies) go through
the same path as in the control plane (``ClusterIndex`` -> ``Store.apply``); tracemalloc measures
what the store retains (records and indexes), and the cluster index's slim facts, per 1,000
workloads. Baseline: the same Pods as the JSON objects a watch cache holds. Target: store <=
5 MB per 1,000 workloads. Not part of the test suite: figures, not a gate.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import ipaddress
import json
import secrets
import statistics
import sys
import tempfile
import threading
import time
import tracemalloc
from pathlib import Path
from typing import Any

from kubernetes import client as k8s
from kubernetes import watch as k8s_watch

from meshctl.core.k8s.cluster.index import ClusterIndex, Resource
from meshctl.core.k8s.cluster.settings import ClusterSettings
from meshctl.core.mesh.store import Store
from tests.harness import controlplane as cp
from tests.harness import xds_client as tc
from tests.harness.kube import create_namespace, locate_binaries, running_cluster

P99_TARGET_MS = 100.0
STORE_TARGET_MB = 5.0


# -- memory -------------------------------------------------------------------------------------


def pod_object(i: int, ns: str = "bench") -> dict[str, Any]:
    """A Pod as the API serves it to a watch (managed fields included: they are in the cache)."""
    app = f"svc-{i // 10:03d}"
    name = f"{app}-7d9f8c6b5-{i:05d}"
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "uid": f"5f0c{i:08d}-aaaa-bbbb-cccc-0123456789ab",
            "resourceVersion": str(10_000 + i),
            "generateName": f"{app}-7d9f8c6b5-",
            "labels": {"app": app, "version": "v1", "pod-template-hash": "7d9f8c6b5"},
            "annotations": {"sidecar.istio.io/status": '{"initContainers":["istio-init"]}'},
            "ownerReferences": [
                {
                    "apiVersion": "apps/v1",
                    "kind": "ReplicaSet",
                    "name": f"{app}-7d9f8c6b5",
                    "uid": "0000-1111",
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
            "managedFields": [
                {
                    "manager": "kube-controller-manager",
                    "operation": "Update",
                    "apiVersion": "v1",
                    "fieldsType": "FieldsV1",
                    "fieldsV1": {"f:metadata": {"f:labels": {"f:app": {}, "f:version": {}}}},
                }
            ],
        },
        "spec": {
            "serviceAccountName": app,
            "nodeName": f"node-{i % 20}",
            "containers": [
                {
                    "name": "app",
                    "image": f"registry.example/{app}:1.0",
                    "ports": [{"name": "http", "containerPort": 8080, "protocol": "TCP"}],
                    "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                },
                {"name": "istio-proxy", "image": "meshctl:dev", "args": ["ztunnel", "run"]},
            ],
        },
        "status": {
            "phase": "Running",
            "podIP": str(ipaddress.ip_address("10.64.0.0") + i),
            "podIPs": [{"ip": str(ipaddress.ip_address("10.64.0.0") + i)}],
            "hostIP": "192.168.0.10",
            "conditions": [{"type": "Ready", "status": "True"}],
        },
    }


def service_object(j: int, ns: str = "bench") -> dict[str, Any]:
    return {
        "metadata": {"name": f"svc-{j:03d}", "namespace": ns},
        "spec": {
            "selector": {"app": f"svc-{j:03d}"},
            "clusterIP": str(ipaddress.ip_address("10.96.0.10") + j),
            "ports": [{"name": "http", "port": 80, "targetPort": "http"}],
        },
    }


def measure_memory(workloads: int) -> dict[str, float]:
    pods = [pod_object(i) for i in range(workloads)]
    services = [service_object(j) for j in range((workloads + 9) // 10)]
    policies = [
        {
            "metadata": {"name": f"p{k}", "namespace": "bench"},
            "spec": {
                "selector": {"matchLabels": {"app": f"svc-{k:03d}"}},
                "rules": [{"from": [{"source": {"namespaces": ["bench"]}}]}],
            },
        }
        for k in range(20)
    ]
    # Baseline: the watch cache's objects, decoded from JSON as the API sends them.
    text = json.dumps(pods)
    gc.collect()
    tracemalloc.start()
    before = tracemalloc.get_traced_memory()[0]
    cached = json.loads(text)
    raw = tracemalloc.get_traced_memory()[0] - before
    del cached
    gc.collect()
    # The control plane's path: facts in the index, records in the store. The store holds the
    # records and its indexes: what stays once the index and the update lists are gone.
    before = tracemalloc.get_traced_memory()[0]
    index = ClusterIndex(ClusterSettings(root_namespace="mesh-root"))
    updates = []
    for svc in services:
        updates += index.upsert(Resource.SERVICE, svc)
    for policy in policies:
        updates += index.upsert(Resource.AUTHORIZATION_POLICY, policy)
    for pod in pods:
        updates += index.upsert(Resource.POD, pod)
    store = Store().apply(updates)
    gc.collect()
    both = tracemalloc.get_traced_memory()[0] - before
    del index, updates
    gc.collect()
    stored = tracemalloc.get_traced_memory()[0] - before
    tracemalloc.stop()
    assert len(store.workloads) == workloads
    per = 1000 / workloads / 1e6
    return {
        "store MB/1000": stored * per,
        "store + cluster index MB/1000": both * per,
        "baseline: Pod JSON MB/1000": raw * per,
    }


# -- push latency ---------------------------------------------------------------------------------


class Proxy:
    """One node-proxy stream: ACKs everything, stamps each Address response on arrival."""

    def __init__(self, stream: tc.TestStream) -> None:
        self.stream = stream
        self.arrivals: list[tuple[float, Any]] = []

    async def run(self) -> None:
        while True:
            try:
                response = await self.stream.recv(timeout=3600)
            except (EOFError, TimeoutError, Exception):  # noqa: BLE001 (the stream ended)
                return
            self.arrivals.append((time.monotonic(), response))
            await self.stream.ack(response)


def seen(proxy: Proxy, uid: str, ip: str, since: float) -> float | None:
    """When ``proxy`` first received ``uid`` at ``ip`` after ``since``."""
    packed = ipaddress.ip_address(ip).packed
    for at, response in proxy.arrivals:
        if at < since or response.type_url != tc.ADDRESS:
            continue
        body = tc.decode(response).get(uid)
        if body is not None and bytes(body.addresses[0]) == packed:
            return at
    return None


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def measure_latency(proxies: int, pods: int, changes: int) -> dict[str, float]:
    binaries = locate_binaries()
    if isinstance(binaries, str):
        raise SystemExit(binaries)
    with running_cluster(binaries) as cluster, tempfile.TemporaryDirectory() as tmp:
        system, apps = f"bsys-{secrets.token_hex(2)}", f"bapp-{secrets.token_hex(2)}"
        with cluster.api_client() as api:
            create_namespace(api, system)
            create_namespace(api, apps)
            core = k8s.CoreV1Api(api)
            for i in range(pods):
                obj = pod_object(i, apps)
                body = {
                    "metadata": {
                        "name": obj["metadata"]["name"],
                        "labels": obj["metadata"]["labels"],
                    },
                    "spec": {"nodeName": "node-1", "containers": [{"name": "a", "image": "x"}]},
                }
                core.create_namespaced_pod(apps, body)
                pod = core.read_namespaced_pod(obj["metadata"]["name"], apps)
                pod.status = running_status(obj["status"]["podIP"])
                core.replace_namespaced_pod_status(obj["metadata"]["name"], apps, pod)
            plane = cp.start(
                cluster,
                system,
                Path(tmp),
                "--trusted-node-accounts",
                f"{system}/meshctl-ztunnel",
                env={"MESHCTL_LOG_LEVEL": "warning"},
            )
            try:
                token = cp.pod_token(cluster, system, "meshctl-ztunnel", "ztunnel-b", node="node-1")
                root = cp.root_pem(api, system)
                return asyncio.run(
                    _latency(cluster, plane, root, token, apps, proxies, pods, changes)
                )
            finally:
                plane.stop()


async def _open_fleet(plane, root, token, proxies) -> tuple[list[Any], list[Proxy]]:
    channels, fleet = [], []
    for _ in range(proxies):
        channel, stream = await tc.open_stream(
            f"127.0.0.1:{plane.grpc_port}",
            root_pem=root,
            token=token,
            server_name=plane.server_name,
        )
        await stream.subscribe(tc.ADDRESS, node=tc.ztunnel_node())
        await stream.subscribe(tc.AUTHORIZATION, node=tc.ztunnel_node())
        channels.append(channel)
        fleet.append(Proxy(stream))
    return channels, fleet


class PodWatch:
    """The baseline: a plain watch of the namespace's pods in a thread, stamping arrivals."""

    def __init__(self, cluster, namespace) -> None:
        self.seen: list[tuple[float, str, str]] = []
        self._started = threading.Event()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, args=(cluster, namespace), daemon=True)
        self._thread.start()
        self._started.wait(30)

    def _run(self, cluster, namespace) -> None:
        with contextlib.suppress(Exception):  # the API server goes away at the end of the run
            self._watch(cluster, namespace)

    def _watch(self, cluster, namespace) -> None:
        with cluster.api_client() as api:
            core = k8s.CoreV1Api(api)
            version = core.list_namespaced_pod(namespace).metadata.resource_version
            w = k8s_watch.Watch()
            self._started.set()
            for event in w.stream(
                core.list_namespaced_pod, namespace, resource_version=version, timeout_seconds=600
            ):
                pod = event["object"]
                self.seen.append((time.monotonic(), pod.metadata.name, pod.status.pod_ip or ""))
                if self._stop.is_set():
                    w.stop()

    def first(self, name: str, ip: str, since: float) -> float | None:
        return next((at for at, n, p in self.seen if n == name and p == ip and at >= since), None)

    def stop(self) -> None:
        self._stop.set()


def running_status(ip: str) -> dict[str, Any]:
    return {
        "phase": "Running",
        "podIP": ip,
        "podIPs": [{"ip": ip}],
        "conditions": [{"type": "Ready", "status": "True"}],
    }


async def _change(core, fleet, baseline_watch, apps, name, ip) -> tuple[list[float], float | None]:
    """Move pod ``name`` to ``ip``; when each proxy saw it, and when the plain watch did."""
    pod = await asyncio.to_thread(core.read_namespaced_pod, name, apps)
    pod.status = running_status(ip)
    t0 = time.monotonic()
    await asyncio.to_thread(core.replace_namespaced_pod_status, name, apps, pod)
    uid = f"Kubernetes//Pod/{apps}/{name}"
    end = time.monotonic() + 10
    while time.monotonic() < end:
        got = [seen(p, uid, ip, t0) for p in fleet]
        if all(g is not None for g in got):
            hit = baseline_watch.first(name, ip, t0)
            return [g - t0 for g in got if g is not None], None if hit is None else hit - t0
        await asyncio.sleep(0.01)
    raise SystemExit(f"the move of {name} to {ip} did not reach every proxy within 10 s")


async def _latency(cluster, plane, root, token, apps, proxies, pods, changes) -> dict[str, float]:
    channels, fleet = await _open_fleet(plane, root, token, proxies)
    readers = [asyncio.ensure_future(p.run()) for p in fleet]
    deadline = time.monotonic() + 60
    while any(len(p.arrivals) < 2 for p in fleet):  # each type answered once
        if time.monotonic() > deadline:
            raise SystemExit("proxies did not get their first responses within 60 s")
        await asyncio.sleep(0.05)
    baseline_watch = PodWatch(cluster, apps)
    await asyncio.sleep(0.5)
    pushed: list[float] = []
    baseline: list[float] = []
    with cluster.api_client() as api:
        core = k8s.CoreV1Api(api)
        for c in range(changes):
            name = pod_object(c % pods, apps)["metadata"]["name"]
            ip = str(ipaddress.ip_address("10.80.0.0") + c)
            arrived, watched = await _change(core, fleet, baseline_watch, apps, name, ip)
            pushed += arrived
            if watched is not None:
                baseline.append(watched)
            for p in fleet:  # keep the arrival lists short: only the next change's matter
                p.arrivals.clear()
            await asyncio.sleep(0.05)
    baseline_watch.stop()
    for p in fleet:
        await p.stream.close()
    for r in readers:
        r.cancel()
    for channel in channels:
        await channel.close()
    ms = 1000.0
    nan = float("nan")
    return {
        "push p50 ms": statistics.median(pushed) * ms,
        "push p99 ms": percentile(pushed, 0.99) * ms,
        "baseline: kube watch p50 ms": statistics.median(baseline) * ms if baseline else nan,
        "baseline: kube watch p99 ms": percentile(baseline, 0.99) * ms if baseline else nan,
        "samples": float(len(pushed)),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--proxies", type=int, default=50)
    parser.add_argument("--pods", type=int, default=200)
    parser.add_argument("--changes", type=int, default=40)
    parser.add_argument("--workloads", type=int, default=5000, help="for the memory figure")
    parser.add_argument("--smoke", action="store_true", help="tiny run; asserts figures only")
    args = parser.parse_args(argv)
    if args.smoke:
        args.proxies, args.pods, args.changes, args.workloads = 3, 3, 3, 200
    memory = measure_memory(args.workloads)
    print(f"memory, {args.workloads} workloads (target: store <= {STORE_TARGET_MB} MB/1000)")
    for key, value in memory.items():
        print(f"  {key:32} {value:8.2f}")
    latency = measure_latency(args.proxies, args.pods, args.changes)
    print(
        f"push latency, {args.proxies} proxies, {args.pods} pods, {args.changes} changes "
        f"(target: p99 <= {P99_TARGET_MS:.0f} ms)"
    )
    for key, value in latency.items():
        print(f"  {key:32} {value:8.1f}")
    if args.smoke:
        assert memory["store MB/1000"] > 0
        assert latency["samples"] == args.proxies * args.changes
    return 0


if __name__ == "__main__":
    sys.exit(main())
