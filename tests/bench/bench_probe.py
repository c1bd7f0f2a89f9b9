"""Benchmark: what the app-probe endpoint adds to a kubelet probe (HTTP, TCP, gRPC health).

Run (root) from the repository root: python -m tests.bench.bench_probe [--requests N] [--smoke]

One pod namespace runs the app (HTTP /healthz, a TCP port, gRPC health) and the proxy with the
probers the injector writes; the "kubelet" in the node namespace probes, one new connection per
probe as the kubelet does, sequentially: through the proxy (GET :15020/app-health/...) and, as
the baseline in the same run, the app directly (GET :8080/healthz; a TCP connect; the proxy's own
gRPC health client run from the node). Prints p50/p99 in ms of each and the p99 added by the
proxy. Target: <= 5 ms added. ``--smoke``: a few probes, asserts only that figures came out.
Loopback-free: all traffic stays on the test namespaces' bridge.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from meshctl_plugins.dataplane.app_probes import AppProbes

from meshctl.core.k8s.appprobes import parse_probers
from meshctl.core.pki.identity import SpiffeId
from tests.bench.smoke import figures_produced
from tests.harness.netns import Netns, node_with_pods
from tests.netns.ztunnel_harness import Ca, Sidecar, workload, write_local_config

TARGET_ADDED_P99_MS = 5.0
HTTP_PORT, TCP_PORT, GRPC_PORT = 8080, 6379, 50051
PROBERS = {
    "/app-health/app/readyz": {"httpGet": {"path": "/healthz", "port": HTTP_PORT}},
    "/app-health/app/livez": {"tcpSocket": {"port": TCP_PORT}},
    "/app-health/app/startupz": {"grpc": {"port": GRPC_PORT}},
}


def get(ns: Netns, ip: str, port: int, path: str) -> int:
    """One GET on a new connection, as the kubelet probes; the status code."""
    with ns.socket() as s:
        s.settimeout(5)
        s.connect((ip, port))
        head = f"GET {path} HTTP/1.1\r\nHost: {ip}:{port}\r\nUser-Agent: kube-probe/1.33\r\n\r\n"
        s.sendall(head.encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    return int(data.split(b" ", 2)[1])


def connect(ns: Netns, ip: str, port: int) -> int:
    with ns.socket() as s:
        s.settimeout(5)
        s.connect((ip, port))
    return 200


def timed(action: Callable[[], int], n: int) -> list[float]:
    action()  # warm-up
    out = []
    for _ in range(n):
        start = time.perf_counter()
        assert action() == 200
        out.append((time.perf_counter() - start) * 1000)
    return out


def p(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=1000)
    parser.add_argument("--smoke", action="store_true", help="a few probes; figures only")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("run as root: the benchmark creates network namespaces")
    n = 20 if args.smoke else args.requests
    root = Path(__file__).resolve().parents[2]
    with tempfile.TemporaryDirectory() as tmp, node_with_pods(1) as node:
        pod = node.pods[0]
        ca = Ca.create(Path(tmp))
        certs = ca.issue("app", SpiffeId("cluster.local", "bench", "app"))
        config = write_local_config(
            Path(tmp) / "local.yaml", workloads=[workload("app", "bench", pod.ip)]
        )
        app = pod.ns.popen(
            [
                sys.executable,
                "-m",
                "tests.netns.probe_app",
                str(HTTP_PORT),
                str(TCP_PORT),
                str(GRPC_PORT),
            ],
            stdout=subprocess.PIPE,
            cwd=root,
        )
        assert app.stdout is not None
        assert app.stdout.readline().strip() == b"ready"
        env = {"ISTIO_KUBE_APP_PROBERS": json.dumps(PROBERS), "INSTANCE_IP": pod.ip}
        car = Sidecar(pod.ns, "bench/app/app", certs, config, env=env)
        direct_grpc = AppProbes(
            parse_probers(json.dumps(PROBERS)),
            pod_ip=pod.ip,
            new_socket=lambda ip, **_: node.ns.socket(),
        )
        prober = direct_grpc.probers["/app-health/app/startupz"]

        def grpc_direct() -> int:
            asyncio.run(direct_grpc.run(prober, "kube-probe/1.33"))
            return 200

        try:
            car.start()
            rows = [
                (
                    "HTTP GET",
                    lambda: get(node.ns, pod.ip, HTTP_PORT, "/healthz"),
                    lambda: get(node.ns, pod.ip, 15020, "/app-health/app/readyz"),
                ),
                (
                    "TCP socket",
                    lambda: connect(node.ns, pod.ip, TCP_PORT),
                    lambda: get(node.ns, pod.ip, 15020, "/app-health/app/livez"),
                ),
                (
                    "gRPC health",
                    grpc_direct,
                    lambda: get(node.ns, pod.ip, 15020, "/app-health/app/startupz"),
                ),
            ]
            print(f"{n} sequential probes each, one connection per probe (ms)")
            print(
                f"{'probe':<12} {'direct p50':>10} {'direct p99':>10} {'proxy p50':>10} "
                f"{'proxy p99':>10} {'added p99':>10} (target <= {TARGET_ADDED_P99_MS:g})"
            )
            figures = {}
            for name, direct, through in rows:
                base, mesh = timed(direct, n), timed(through, n)
                added = figures[f"{name} added p99 ms"] = p(mesh, 0.99) - p(base, 0.99)
                print(
                    f"{name:<12} {statistics.median(base):10.2f} {p(base, 0.99):10.2f} "
                    f"{statistics.median(mesh):10.2f} {p(mesh, 0.99):10.2f} {added:10.2f}"
                )
        finally:
            app.kill()
            app.wait()
            car.stop()
    return figures_produced(figures) if args.smoke else 0


if __name__ == "__main__":
    raise SystemExit(main())
