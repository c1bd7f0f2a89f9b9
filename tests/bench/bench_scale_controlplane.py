"""Benchmark: the control plane at cluster scale (pods x services x node-proxy streams).

Run from the repository root (kube binaries built by tests/kube/build.sh; long: run niced):
    python -m tests.bench.bench_scale_controlplane --pods 10000 --services 2000 --streams 50,200,500
    python -m tests.bench.bench_scale_controlplane --smoke   # CI: tiny, asserts figures only

A real kube-apiserver (+ etcd) holds ``--pods`` Pods with ``status.podIP`` (on 20 nodes, in an
ambient namespace), ``--services`` Services each with an EndpointSlice of its pods, and
``--policies`` AuthorizationPolicies; ``meshctl controlplane run`` runs as a subprocess; the
streams are node-proxy Delta xDS clients in worker processes (``xds_fleet``: several processes,
one gRPC channel per stream, subscribing to Address and Authorization as ztunnel does, ACKing
everything, reconnecting at once). The fleet grows through ``--streams``; at each size:
- one pod change to every stream: a pod's status moves to a new IP through the API; the figure is
  the time from just before that write to each stream holding the workload at the new IP
  (p50/p99 over changes x streams), with the control plane's CPU per change and the bytes each
  stream received per change (incremental: one workload, not the full state).
Then, at the largest size:
- a burst of ``--burst`` changes (a rollout: distinct pods moved at once, 16 writers) until
  every stream holds every new IP (quiescence), the control plane's CPU-seconds per 1,000 changes
  and its peak RSS;
- a restart: the control plane stopped and started again on the same port with every stream
  reconnecting at once; the time from ready to each stream's first full push (Address and
  Authorization), p50/p99 and until all are synced;
- a second replica of the revision beside the restarted one (the leader, holding every
  stream): one change to every stream again, then a burst with the leader SIGKILLed in the
  middle of the writes; every stream reconnects to the survivor and must end holding every new
  IP (none stale); the survivor must take the lease.
Cost per change vs streams is printed as a least-squares slope (CPU ms per change per stream)
and as the exponent between the smallest and largest fleet (1.0: linear).

Baselines in the same run: a plain Kubernetes watch of the namespace's pods in this process
seeing the same change (what any controller waits for), and the bytes of one full state (the
first push of a stream). Targets at 10,000 pods / 500 streams: one change to every stream p99
<= 1 s, full reconnect <= 30 s, RSS <= 1 GB, cost per change no worse than linear in streams.
Not part of the test suite: figures, not a gate.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import secrets
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.bench import scale_cluster as sc
from tests.bench.xds_fleet import Fleet, Target
from tests.harness import controlplane as cp
from tests.harness.kube import (
    ControlPlaneOptions,
    KubeCluster,
    create_namespace,
    locate_binaries,
    running_cluster,
)

CHANGE_P99_MS = 1000.0
RSS_TARGET_MB = 1024.0
MS = 1000.0


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))] if ordered else math.nan


@dataclass
class Run:
    """One benchmark run's cluster, control plane and fleet."""

    cluster: KubeCluster
    api: sc.Api
    system: str
    apps: str
    pods: int
    services: int
    workdir: Path
    plane: cp.ControlPlaneProcess
    fleet: Fleet
    watch: sc.PodIpWatch
    extra: tuple[str, ...]
    moved: int = 0  # IPs handed out so far (each move gets a fresh one)
    killed_at: float = 0.0  # when ``burst`` killed a replica
    figures: dict[str, Any] = field(default_factory=dict)

    def next_ip(self) -> str:
        self.moved += 1
        return str(sc.MOVED_BASE + self.moved)

    def start_plane(
        self, *, grpc_port: int | None, revision: str, wait: bool = True
    ) -> cp.ControlPlaneProcess:
        return cp.start(
            self.cluster,
            self.system,
            self.workdir,
            *self.extra,
            revision=revision,
            grpc_port=grpc_port,
            wait_ready=wait,
            timeout=900,
            log_level="warning",
        )


def one_change_each(run: Run, plane_pids: list[int], changes: int) -> dict[str, float]:
    """``changes`` single pod moves, one at a time; per-stream latency, CPU, bytes."""
    latencies: list[float] = []
    watched: list[float] = []
    per_stream_bytes: list[float] = []
    cpu0 = sum(sc.cpu_seconds(pid) for pid in plane_pids)
    for c in range(changes):
        i = (c * 7919 + run.moved) % run.pods  # spread over pods and services
        ip = run.next_ip()
        run.fleet.mark({sc.workload_uid(run.apps, i): ip})
        t0 = time.monotonic()
        sc.set_ip(run.api, run.apps, i, ip)
        rows = run.fleet.wait(30)
        stale = sum(1 for done, _, _ in rows if done is None)
        if stale:
            raise SystemExit(f"change {c}: {stale} of {len(rows)} streams did not get it in 30 s")
        latencies += [done - t0 for done, _, _ in rows if done is not None]
        per_stream_bytes += [b for _, b, _ in rows]
        seen = run.watch.first(sc.pod_name(i), ip, t0)
        if seen is not None:
            watched.append(seen - t0)
        time.sleep(0.05)
    cpu = sum(sc.cpu_seconds(pid) for pid in plane_pids) - cpu0
    return {
        "change p50 ms": statistics.median(latencies) * MS,
        "change p99 ms": pct(latencies, 0.99) * MS,
        "baseline: kube watch p50 ms": statistics.median(watched) * MS if watched else math.nan,
        "baseline: kube watch p99 ms": pct(watched, 0.99) * MS,
        "CPU ms per change": cpu / changes * MS,
        "bytes per change per stream": statistics.mean(per_stream_bytes),
        "samples": float(len(latencies)),
    }


def burst(
    run: Run, pids: list[int], count: int, kill: cp.ControlPlaneProcess | None = None
) -> dict[str, float]:
    """``count`` distinct pods moved at once (16 writers); with ``kill``, that replica is
    SIGKILLed once half the writes are done. Until every stream holds every new IP."""
    step = max(1, run.pods // count)
    moves = {(k * step + run.moved) % run.pods: run.next_ip() for k in range(count)}
    run.fleet.mark({sc.workload_uid(run.apps, i): ip for i, ip in moves.items()})
    live = [pid for pid in pids if kill is None or pid != kill.process.pid]
    cpu0 = {pid: sc.cpu_seconds(pid) for pid in pids}
    peaks = {pid: sc.PeakRss(pid) for pid in pids}
    items = list(moves.items())
    half = len(items) // 2 if kill is not None else len(items)
    t0 = time.monotonic()
    sc.parallel(lambda i=i, ip=ip: sc.set_ip(run.api, run.apps, i, ip) for i, ip in items[:half])
    if kill is not None:
        kill.process.send_signal(signal.SIGKILL)
        kill.process.wait()
        run.killed_at = time.monotonic()
        sc.parallel(
            lambda i=i, ip=ip: sc.set_ip(run.api, run.apps, i, ip) for i, ip in items[half:]
        )
    written = time.monotonic() - t0
    rows = run.fleet.wait(600)
    done = [d - t0 for d, _, _ in rows if d is not None]
    stale = len(rows) - len(done)
    cpu = sum(sc.cpu_seconds(pid) - cpu0[pid] for pid in live)
    peak = max(peaks[pid].stop() for pid in pids)
    watched = [run.watch.first(sc.pod_name(i), ip, t0) for i, ip in items]
    return {
        "changes": float(count),
        "API writes done s": written,
        "quiescence s": max(done) if done else math.nan,
        "stream synced p50 s": statistics.median(done) if done else math.nan,
        "stream synced p99 s": pct(done, 0.99),
        "streams left stale": float(stale),
        "baseline: kube watch saw all s": (
            max(w for w in watched if w is not None) - t0
            if all(w is not None for w in watched)
            else math.nan
        ),
        "CPU s per 1000 changes": cpu * 1000 / count,
        "bytes per change per stream": statistics.mean(b for _, b, _ in rows) / count,
        "peak RSS MB": peak,
    }


def restart(run: Run, py_spy: Path | None = None) -> dict[str, float]:
    """Stop the control plane, start it again on its port; every stream reconnects at once."""
    port, revision = run.plane.grpc_port, run.plane.revision
    run.plane.stop()
    t_start = time.monotonic()
    run.plane = run.start_plane(grpc_port=port, revision=revision)
    t_ready = time.monotonic()
    peak = sc.PeakRss(run.plane.process.pid)
    with profiled(py_spy, "reconnect", run.plane.process.pid):
        facts = run.fleet.wait_synced(t_start, 900)
    # From ready (streams that connected earlier wait for the caches; a few may be answered
    # between ready and our poll of /ready, up to 0.1 s: clipped at 0).
    synced = [max(0.0, max(f["address_at"], f["authz_at"]) - t_ready) for f in facts]
    done = sorted(max(f["address_at"], f["authz_at"]) for f in facts)
    return {
        "start to ready s": t_ready - t_start,
        "start to all streams synced s": done[-1] - t_start,
        "first stream synced to last s": done[-1] - done[0],
        "first full push after ready p50 s": statistics.median(synced),
        "first full push after ready p99 s": pct(synced, 0.99),
        "all streams synced after ready s": max(synced),
        "resources in a full push": float(min(f["full_resources"] for f in facts)),
        "baseline: bytes of one full state": float(
            statistics.median(f["full_bytes"] for f in facts)
        ),
        "peak RSS MB": peak.stop(),
        "RSS after sync MB": sc.rss_mb(run.plane.process.pid),
    }


def failover(run: Run, changes: int, count: int) -> dict[str, float]:
    """A second replica of the revision beside the running one (the leader, holding every
    stream); one change to every stream, then a burst with the leader SIGKILLed in the middle:
    every stream fails over to the other replica, which must also take the lease."""
    a = run.plane
    b = run.start_plane(grpc_port=None, revision=a.revision)
    planes = [a, b]
    try:
        # A stream cut from its replica reconnects to the next address: the survivor.
        run.fleet.point_at([f"127.0.0.1:{a.grpc_port}", f"127.0.0.1:{b.grpc_port}"])
        deadline = time.monotonic() + 60
        while (
            len(leaders := [p for p in planes if p.metric("meshctl_controlplane_leader") == 1]) != 1
        ):
            if time.monotonic() > deadline:
                raise SystemExit("two replicas: no single leader within 60 s")
            time.sleep(0.2)
        leader = leaders[0]
        split = [p.metric("pilot_xds") for p in planes]
        pids = [p.process.pid for p in planes]
        figures = {f"2 replicas: {k}": v for k, v in one_change_each(run, pids, changes).items()}
        figures["2 replicas: streams per replica (leader first)"] = float(
            split[planes.index(leader)]
        )
        before = {i: f["connects"] for i, f in enumerate(run.fleet.facts())}
        figures |= {
            f"failover burst: {k}": v for k, v in burst(run, pids, count, kill=leader).items()
        }
        survivor = b if leader is a else a
        while survivor.metric("meshctl_controlplane_leader") != 1:
            if time.monotonic() > run.killed_at + 120:
                raise SystemExit("the surviving replica did not take the lease within 120 s")
            time.sleep(0.2)
        figures["failover: survivor leads after kill s"] = time.monotonic() - run.killed_at
        moved = [f for i, f in enumerate(run.fleet.facts()) if f["connects"] > before[i]]
        resync = [max(f["address_at"], f["authz_at"]) - run.killed_at for f in moved]
        figures["failover: streams that reconnected"] = float(len(moved))
        figures["failover: their full push after kill p50 s"] = pct(resync, 0.5)
        figures["failover: their full push after kill p99 s"] = pct(resync, 0.99)
        return figures
    finally:
        for p in planes:
            p.stop()
        run.plane = a  # stopped: the caller only reads its facts


@contextlib.contextmanager
def profiled(directory: Path | None, name: str, pid: int) -> Iterator[None]:
    """py-spy (a measurement tool, not a dependency: ``pip install py-spy``) samples ``pid``
    while the block runs, its collapsed stacks written to ``directory/name.txt``."""
    if directory is None:
        yield
        return
    directory.mkdir(parents=True, exist_ok=True)
    argv = ["py-spy", "record", "--pid", str(pid), "--rate", "50", "--nonblocking"]
    argv += ["--format", "raw", "--output", str(directory / f"{name}.txt")]
    spy = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)
        spy.wait(60)


def fit(sizes: list[int], costs: list[float]) -> tuple[float, float, float]:
    """Least squares cost = a + b * streams; and the exponent between the extremes."""
    n = len(sizes)
    mx, my = sum(sizes) / n, sum(costs) / n
    sxx = sum((x - mx) ** 2 for x in sizes)
    b = sum((x - mx) * (y - my) for x, y in zip(sizes, costs, strict=True)) / sxx if sxx else 0.0
    exponent = (
        math.log(costs[-1] / costs[0]) / math.log(sizes[-1] / sizes[0])
        if n > 1 and costs[0] > 0 and costs[-1] > 0
        else math.nan
    )
    return my - b * mx, b, exponent


def show(title: str, figures: dict[str, float]) -> None:
    print(title, flush=True)
    for key, value in figures.items():
        print(f"  {key:52} {value:12.2f}", flush=True)


def measure(args: argparse.Namespace, sizes: list[int]) -> dict[str, Any]:
    binaries = locate_binaries()
    if isinstance(binaries, str):
        raise SystemExit(binaries)
    options = ControlPlaneOptions(service_cluster_ip_range="10.96.0.0/16")  # room for 2,000 VIPs
    with (
        running_cluster(binaries, options=options) as cluster,
        tempfile.TemporaryDirectory() as tmp,
    ):
        system, apps = f"ssys-{secrets.token_hex(2)}", f"sapp-{secrets.token_hex(2)}"
        with cluster.api_client() as client:
            create_namespace(client, system)
            create_namespace(client, apps, labels={"istio.io/dataplane-mode": "ambient"})
            cp.install_crds(cluster)
            made = sc.populate(
                cluster, apps, pods=args.pods, services=args.services, policies=args.policies
            )
            show(
                f"cluster: {args.pods} pods, {args.services} services, {args.policies} policies",
                made,
            )
            extra = ("--trusted-node-accounts", f"{system}/meshctl-ztunnel")
            t0 = time.monotonic()
            plane = cp.start(cluster, system, Path(tmp), *extra, timeout=900, log_level="warning")
            cold = {
                "start to ready s": time.monotonic() - t0,
                "RSS MB": sc.rss_mb(plane.process.pid),
            }
            token = cp.pod_token(cluster, system, "meshctl-ztunnel", "ztunnel-b", node="node-1")
            root = cp.root_pem(client, system)
        target = Target((f"127.0.0.1:{plane.grpc_port}",), root, token, plane.server_name)
        workers = args.workers or max(2, min(6, math.ceil(sizes[-1] / 100)))
        fleet = Fleet(target, workers)
        watch = sc.PodIpWatch(cluster, apps)
        run = Run(
            cluster,
            sc.Api(cluster),
            system,
            apps,
            args.pods,
            args.services,
            Path(tmp),
            plane,
            fleet,
            watch,
            extra,
        )
        try:
            return phases(run, args, sizes, cold)
        finally:
            watch.stop()
            fleet.close()
            run.plane.stop()


def phases(
    run: Run, args: argparse.Namespace, sizes: list[int], cold: dict[str, float]
) -> dict[str, Any]:
    out: dict[str, Any] = {"cold start": cold, "streams": {}}
    show("control plane, cold start", cold)
    costs: list[float] = []
    for size in sizes:
        t0 = time.monotonic()
        run.fleet.grow(size)
        facts = run.fleet.wait_synced(0.0, 900)
        joined = [max(f["address_at"], f["authz_at"]) for f in facts if f["connected_at"] >= t0]
        figures = {"streams": float(size), "connect: new streams synced s": max(joined) - t0}
        with profiled(args.py_spy, f"changes-{size}", run.plane.process.pid):
            figures |= one_change_each(run, [run.plane.process.pid], args.changes)
        figures["RSS MB"] = sc.rss_mb(run.plane.process.pid)
        costs.append(figures["CPU ms per change"])
        out["streams"][size] = figures
        show(f"{size} streams: one pod change to every stream ({args.changes} changes)", figures)
    a, b, exponent = fit(sizes, costs)
    out["cost fit"] = {
        "CPU ms per change at 0 streams": a,
        "CPU ms per change per stream": b,
        "exponent (1 = linear)": exponent,
    }
    show("cost per change vs streams (least squares; exponent between extremes)", out["cost fit"])
    out["burst"] = burst(run, [run.plane.process.pid], args.burst)
    show(f"{sizes[-1]} streams: a burst of {args.burst} changes", out["burst"])
    out["restart"] = restart(run, args.py_spy)
    show(f"{sizes[-1]} streams: control plane restart, all streams reconnecting", out["restart"])
    if not args.no_failover:
        out["failover"] = failover(run, args.changes, args.burst)
        show(f"{sizes[-1]} streams: 2 replicas, leader killed mid-burst", out["failover"])
    return out


def verdicts(args: argparse.Namespace, sizes: list[int], out: dict[str, Any]) -> list[str]:
    last = out["streams"][sizes[-1]]
    rss = max(out["burst"]["peak RSS MB"], out["restart"]["peak RSS MB"])
    change_ms = last["change p99 ms"]
    reconnect = out["restart"]["start to all streams synced s"]
    return [
        f"one change to every stream p99 {change_ms:.0f} ms (target <= {CHANGE_P99_MS:.0f})",
        f"full reconnect (process start to all synced) {reconnect:.1f} s (target <= 30)",
        f"peak RSS {rss:.0f} MB (target <= {RSS_TARGET_MB:.0f})",
        f"cost exponent in streams {out['cost fit']['exponent (1 = linear)']:.2f} (target <= 1)",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", type=int, default=1000)
    parser.add_argument("--services", type=int, default=500)
    parser.add_argument("--policies", type=int, default=200)
    parser.add_argument("--streams", default="50,200,500", help="fleet sizes, ascending")
    parser.add_argument("--changes", type=int, default=20, help="single changes per fleet size")
    parser.add_argument("--burst", type=int, default=1000, help="changes in the rollout burst")
    parser.add_argument("--workers", type=int, default=0, help="client processes (0: by size)")
    parser.add_argument("--no-failover", action="store_true", help="skip the two-replica phase")
    parser.add_argument("--json", type=Path, help="also write the figures here")
    parser.add_argument("--py-spy", type=Path, help="profile the control plane into this dir")
    parser.add_argument("--smoke", action="store_true", help="tiny run; asserts figures only")
    args = parser.parse_args(argv)
    # SIGTERM unwinds as Ctrl-C does: the control plane and the client processes are stopped.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    if args.smoke:
        args.pods, args.services, args.policies, args.streams = 50, 10, 5, "2,5"
        args.changes, args.burst, args.workers = 3, 20, 2
    sizes = sorted(int(s) for s in args.streams.split(","))
    started = time.monotonic()
    out = measure(args, sizes)
    out["seconds"] = time.monotonic() - started
    print(
        f"targets (at 10,000 pods / 500 streams; this run: {args.pods} pods / {sizes[-1]} streams):"
    )
    for line in verdicts(args, sizes, out):
        print(f"  {line}")
    print(f"run took {out['seconds']:.0f} s")
    if args.json:
        args.json.write_text(json.dumps(out, indent=2, default=str))
    if args.smoke:
        parts = [out["burst"], out["restart"], out["failover"], *out["streams"].values()]
        missing = [k for part in parts for k, v in part.items() if math.isnan(v)]
        assert not [k for k in missing if "baseline" not in k], missing
        assert out["burst"]["streams left stale"] == 0
        assert out["failover"]["failover burst: streams left stale"] == 0
    return 0


if __name__ == "__main__":
    sys.exit(main())
