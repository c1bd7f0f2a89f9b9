"""Benchmark: ``meshctl inject`` offline on 1,000 Deployments, and the webhook's p99 at 200 req/s.

Run from the repository root: python -m tests.bench.bench_inject [--deployments N] [--requests N]
[--smoke] (``--smoke``: 20 Deployments, one run, 50 requests per row; only checks that every
figure was produced)

Offline: the median of several runs of ``meshctl inject -f <file> -O <out>`` (the console script,
interpreter start included) and of the in-process pipeline, beside a baseline measured in the
same run: loading and dumping the same file with the same YAML loader and dumper (libyaml).
Target: <= 2 s for 1,000 Deployments.

Webhook: AdmissionReviews sent at a fixed 200 requests/s over TLS to ``meshctl inject webhook``
on 127.0.0.1 (HTTP/1.1 keep-alive, and HTTP/2 on one connection); latency is measured from each
request's scheduled send time, so a late send counts against the server. Baseline: the same
client against the same server stack (hypercorn, same TLS settings) answering with a no-op JSON
round trip of the same size. Target: p99 <= 10 ms. Loopback only, bounded request counts.
Not part of the test suite: figures, not a gate.
"""

from __future__ import annotations

import argparse
import dataclasses
import http.client
import json
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import h2.connection
import h2.events
import yaml

from meshctl.core.k8s.inject.documents import dump, inject_text, load
from meshctl.core.k8s.inject.settings import InjectSettings
from tests.bench.smoke import figures_produced
from tests.harness.inject_webhook import WebhookProcess, start_webhook, stop_webhook
from tests.harness.kube import free_port

OFFLINE_TARGET_S = 2.0
P99_TARGET_MS = 10.0
RATE = 200.0


def deployment(i: int) -> dict[str, Any]:
    name = f"svc-{i:04d}"
    return {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": name, "namespace": "bench", "labels": {"app": name}},
        "spec": {
            "replicas": 2,
            "selector": {"matchLabels": {"app": name}},
            "template": {
                "metadata": {
                    "labels": {"app": name, "version": "v1"},
                    "annotations": {"traffic.sidecar.istio.io/excludeOutboundPorts": "25"},
                },
                "spec": {
                    "containers": [
                        {
                            "name": "app",
                            "image": f"registry.example/{name}:1.0",
                            "ports": [{"name": "http", "containerPort": 8080}],
                            "env": [{"name": "MODE", "value": "production"}],
                            "readinessProbe": {
                                "httpGet": {"path": "/ready", "port": 8080},
                                "periodSeconds": 5,
                            },
                            "resources": {"requests": {"cpu": "100m", "memory": "64Mi"}},
                        }
                    ]
                },
            },
        },
    }


def timed(fn: Callable[[], object], runs: int) -> list[float]:
    fn()  # warm-up
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return times


def bench_offline(count: int, runs: int) -> dict[str, float]:
    text = dump([deployment(i) for i in range(count)])
    settings = InjectSettings(image="registry.example/meshctl:bench")
    with tempfile.TemporaryDirectory(prefix="meshctl-bench-") as tmp:
        source = Path(tmp) / "deployments.yaml"
        source.write_text(text)
        out = Path(tmp) / "out.yaml"
        cli = [sys.executable, "-c", "from meshctl.entry import run; run()", "inject"]
        cli += ["-f", str(source), "-O", str(out), "--image", "registry.example/meshctl:bench"]
        rows = {
            "baseline: yaml load+dump": timed(
                lambda: dump([d.data for d in load(text, "bench")]), runs
            ),
            "inject, in-process": timed(lambda: inject_text(text, "bench", settings), runs),
            "meshctl inject -f (CLI)": timed(
                lambda: subprocess.run(cli, check=True, capture_output=True), runs
            ),
            "python -c pass": timed(
                lambda: subprocess.run([sys.executable, "-c", "pass"], check=True), runs
            ),
        }
        injected = list(yaml.safe_load_all(out.read_text()))
        assert len(injected) == count
        assert injected[-1]["spec"]["template"]["spec"]["initContainers"][1]["name"] == (
            "istio-proxy"
        )
    size_kib = len(text.encode()) / 1024
    print(f"\n{count} Deployments, {size_kib:.0f} KiB in; median of {runs} runs")
    print(f"{'what':<28} {'median s':>9} {'max s':>7} {'target s':>9}  verdict")
    figures = {}
    for name, times in rows.items():
        median = figures[f"offline {name}"] = statistics.median(times)
        target = OFFLINE_TARGET_S if name.startswith("meshctl") else None
        verdict = "" if target is None else ("meets" if median <= target else "MISSES")
        shown = "" if target is None else f"{target:.1f}"
        print(f"{name:<28} {median:>9.3f} {max(times):>7.3f} {shown:>9}  {verdict}")
    return figures


# --- webhook ------------------------------------------------------------------------------------


def review_body(i: int) -> bytes:
    template = deployment(i)["spec"]["template"]
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {**template["metadata"], "generateName": f"svc-{i:04d}-", "namespace": "b"},
        "spec": template["spec"],
    }
    review = {
        "apiVersion": "admission.k8s.io/v1",
        "kind": "AdmissionReview",
        "request": {"uid": f"u{i}", "namespace": "b", "operation": "CREATE", "object": pod},
    }
    return json.dumps(review).encode()


def paced(requests: int, send: Callable[[int], None]) -> list[float]:
    """Calls ``send(i)`` at RATE per second; latency (ms) from each scheduled time to done."""
    latencies = []
    start = time.perf_counter() + 0.05
    for i in range(requests):
        scheduled = start + i / RATE
        pause = scheduled - time.perf_counter()
        if pause > 0:
            time.sleep(pause)
        send(i)
        latencies.append((time.perf_counter() - scheduled) * 1000)
    return latencies


def h1_client(server: WebhookProcess, bodies: list[bytes]) -> list[float]:
    conn = http.client.HTTPSConnection(
        "127.0.0.1", server.port, context=server.context("http/1.1"), timeout=10
    )
    headers = {"Content-Type": "application/json"}

    def send(i: int) -> None:
        conn.request("POST", "/inject", body=bodies[i % len(bodies)], headers=headers)
        response = conn.getresponse()
        response.read()
        assert response.status == 200, response.status

    try:
        send(0)  # connect and warm up before the clock starts
        return paced(len(bodies), send)
    finally:
        conn.close()


def h2_client(server: WebhookProcess, bodies: list[bytes]) -> list[float]:
    raw = socket.create_connection(("127.0.0.1", server.port), timeout=10)
    # As Go's and http.client's: without it, Nagle holds a small frame for a delayed ACK (40 ms).
    raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    with server.context("h2").wrap_socket(raw, server_hostname="127.0.0.1") as tls:
        conn = h2.connection.H2Connection()
        conn.initiate_connection()
        tls.sendall(conn.data_to_send())

        def send(i: int) -> None:
            body = bodies[i % len(bodies)]
            stream = conn.get_next_available_stream_id()
            conn.send_headers(
                stream,
                [
                    (":method", "POST"),
                    (":path", "/inject"),
                    (":scheme", "https"),
                    (":authority", "127.0.0.1"),
                    ("content-type", "application/json"),
                ],
            )
            conn.send_data(stream, body, end_stream=True)
            tls.sendall(conn.data_to_send())
            while True:
                data = tls.recv(65536)
                assert data, "connection closed"
                ended = False
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.DataReceived):
                        conn.acknowledge_received_data(
                            event.flow_controlled_length, event.stream_id
                        )
                    ended = ended or (
                        isinstance(event, h2.events.StreamEnded) and event.stream_id == stream
                    )
                tls.sendall(conn.data_to_send())
                if ended:
                    return

        send(0)
        return paced(len(bodies), send)


BASELINE_SERVER = """
import asyncio, json, sys
from pathlib import Path
from hypercorn.asyncio import serve
from meshctl_plugins.inject.server import ServeOptions, config_for
pad = int(sys.argv[4])
async def app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    review = json.loads(body)
    answer = {"apiVersion": review["apiVersion"], "kind": "AdmissionReview",
              "response": {"uid": review["request"]["uid"], "allowed": True, "pad": "x" * pad}}
    out = json.dumps(answer).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json")]})
    await send({"type": "http.response.body", "body": out})
options = ServeOptions(address="127.0.0.1", port=int(sys.argv[1]), tls_cert=Path(sys.argv[2]),
                       tls_key=Path(sys.argv[3]))
asyncio.run(serve(app, config_for(options)))
"""


def start_baseline(real: WebhookProcess, workdir: Path, pad: int) -> WebhookProcess:
    """The no-op server on the same stack and certificate as ``real``."""
    port = free_port()
    process = subprocess.Popen(
        [
            *(sys.executable, "-c", BASELINE_SERVER, str(port)),
            *(str(workdir / "serving.crt"), str(workdir / "serving.key"), str(pad)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=0.5):
                # Same CA and serving certificate as the real webhook: only the server differs.
                return dataclasses.replace(real, port=port, process=process)
        except OSError:
            time.sleep(0.05)
    process.kill()
    process.wait()
    raise TimeoutError("baseline server did not start")


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(len(ordered) * q))]


def bench_webhook(requests: int) -> dict[str, float]:
    bodies = [review_body(i) for i in range(50)]
    with tempfile.TemporaryDirectory(prefix="meshctl-bench-") as tmp:
        workdir = Path(tmp)
        real = start_webhook(workdir)
        try:
            conn = http.client.HTTPSConnection(
                "127.0.0.1", real.port, context=real.context("http/1.1"), timeout=10
            )
            conn.request(
                "POST", "/inject", body=bodies[0], headers={"Content-Type": "application/json"}
            )
            answer_size = len(conn.getresponse().read())
            conn.close()
            baseline = start_baseline(real, workdir, pad=answer_size - 100)
            try:
                rows = {
                    "baseline no-op, HTTP/1.1": h1_client(baseline, bodies * (requests // 50)),
                    "webhook, HTTP/1.1": h1_client(real, bodies * (requests // 50)),
                    "baseline no-op, HTTP/2": h2_client(baseline, bodies * (requests // 50)),
                    "webhook, HTTP/2": h2_client(real, bodies * (requests // 50)),
                }
            finally:
                baseline.process.terminate()
                baseline.process.wait(timeout=15)
        finally:
            stop_webhook(real)
    size_kib = len(bodies[0]) / 1024
    print(
        f"\nwebhook: {requests} AdmissionReviews per row at {RATE:.0f}/s over TLS to 127.0.0.1, "
        f"request {size_kib:.1f} KiB, answer {answer_size / 1024:.1f} KiB"
    )
    print(
        f"{'what':<26} {'p50 ms':>7} {'p90 ms':>7} {'p99 ms':>7} {'max ms':>7} {'target':>7}"
        "  verdict"
    )
    figures = {}
    for name, latencies in rows.items():
        p99 = figures[f"webhook p99 {name}"] = percentile(latencies, 0.99)
        target = P99_TARGET_MS if name.startswith("webhook") else None
        verdict = "" if target is None else ("meets" if p99 <= target else "MISSES")
        shown = "" if target is None else f"{target:.0f}"
        print(
            f"{name:<26} {percentile(latencies, 0.5):>7.2f} {percentile(latencies, 0.9):>7.2f} "
            f"{p99:>7.2f} {max(latencies):>7.2f} {shown:>7}  {verdict}"
        )
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deployments", type=int, default=1000)
    parser.add_argument("--runs", type=int, default=5)
    # hypercorn closes a connection after 1,000 requests (clients reconnect); one connection per
    # row keeps the measurement about serving, not handshakes.
    parser.add_argument("--requests", type=int, default=900, help="per row, a multiple of 50")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: are figures produced?")
    args = parser.parse_args()
    if args.smoke:
        args.deployments, args.runs, args.requests = 20, 1, 50
    figures = bench_offline(args.deployments, args.runs)
    figures |= bench_webhook(max(50, min(args.requests, 950)))
    return figures_produced(figures) if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
