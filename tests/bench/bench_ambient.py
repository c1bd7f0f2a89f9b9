"""Benchmark: ambient mode (node agent + node proxy), each figure beside a baseline of the same run.

Run (root; kube binaries built): python tests/bench/bench_ambient.py [--smoke] [--enrolled N]
    [--samples K] [--rss-pods M] [--seconds S] [--only enroll,rss,traffic]

- enroll: pod enrollment as the runtime sees it, the exec of ``meshctl-cni ADD`` to its exit,
  which returns only once the node agent captured the pod and the node proxy acknowledged it
  with its listeners open inside the pod, with ``--enrolled`` pods already enrolled on the node
  (the issue: 50). Beside it, the same plugin's ADD for a pod outside the mesh (lookup and
  netns notice only) and the agent's own share (from receiving the event to the proxy's ack).
  Own etcd + kube-apiserver, the kubelet stand-in, the dbnet conflist, as the kube tests.
- rss: the node proxy's RSS (supervisor + data plane) with ``--rss-pods`` idle pods handed over
  by a ZDS peer (issue: 100, <= 80 MB), beside the same proxy with none.
- traffic: bench_hbone's figures (single-stream throughput, 1 KiB latency, new connections/s)
  through one node proxy serving both pods, beside two unmeshed pods on the same bridge
  (direct) and beside two sidecars measured in this run (bench_hbone's topology), with both
  throughput ratios.
Figures, not a gate. ``--smoke``: tiny sizes, checks only that every figure was produced.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench import bench_hbone as hb  # noqa: E402 (after the path set-up)

SMOKE_MARKER = "bench_ambient: every figure produced"
GOALS = {"enroll_p50_ms": 100.0, "rss_mb": 80.0}
Row = tuple[str, str, str, str]


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


def p50_p95(samples: list[float]) -> str:
    return f"p50 {statistics.median(samples):6.1f} ms  p95 {pct(samples, 0.95):6.1f} ms"


# -- enrollment through the real chain ---------------------------------------------------------


def bench_enroll(tmp: Path, enrolled: int, samples: int) -> list[Row]:
    from kubernetes import client as k8s

    from meshctl.core.k8s import ambient
    from tests.harness.kube import (
        create_namespace,
        kubelet_node,
        locate_binaries,
        running_cluster,
    )
    from tests.harness.netns import NetnsFactory
    from tests.kube.ambient_support import agent_rbac, pod, prepare_nodes

    binaries = locate_binaries()
    if isinstance(binaries, str):
        sys.exit(binaries)
    factory = NetnsFactory()
    with (
        running_cluster(binaries) as cluster,
        cluster.api_client() as api,
        contextlib.ExitStack() as stack,
    ):
        stack.callback(factory.close)
        kubelet = stack.enter_context(kubelet_node(cluster, api, factory))
        create_namespace(api, "bench-agent")
        stack.enter_context(agent_rbac(api, "bench-agent"))
        (node,) = prepare_nodes(cluster, [kubelet], tmp, "bench-agent")
        node.start_agent()
        node.read_conflist()
        stack.callback(node.stop_agent)
        node.start_proxy()
        stack.callback(lambda: node.proxy.stop() if node.proxy else None)
        stack.callback(kubelet.close)  # sandboxes first (LIFO): their DEL needs the plugin
        timings = _time_our_plugin(kubelet)
        create_namespace(api, "bench-amb", {ambient.DATAPLANE_MODE: ambient.MODE_AMBIENT})
        create_namespace(api, "bench-plain")
        core = k8s.CoreV1Api(api)
        for i in range(enrolled):
            core.create_namespaced_pod("bench-amb", pod(f"pre{i}"))
            node.run_pod("bench-amb", f"pre{i}")
        timings.clear()
        ambient_ms, plain_ms = [], []
        for i in range(samples):
            core.create_namespaced_pod("bench-amb", pod(f"m{i}"))
            node.run_pod("bench-amb", f"m{i}")
            ambient_ms.append(timings.pop())
            core.create_namespaced_pod("bench-plain", pod(f"p{i}"))
            node.run_pod("bench-plain", f"p{i}")
            plain_ms.append(timings.pop())
        served = len(node.proxy.config_dump()["workloadState"]) if node.proxy else 0
        found = re.findall(
            r"\(CNI ADD\) in (\d+) ms \(capture (\d+) ms, node proxy (\d+) ms\)", node.log()
        )[enrolled:]
        agent_ms = [float(t) for t, _, _ in found]
        capture_ms = [float(c) for _, c, _ in found]
        proxy_ms = [float(p) for _, _, p in found]
    return [
        (
            f"CNI ADD to listeners up ({enrolled} enrolled)",
            p50_p95(ambient_ms),
            f"not ambient: {p50_p95(plain_ms)}",
            f"p50 <= {GOALS['enroll_p50_ms']:.0f} ms"
            + (
                " (met)"
                if statistics.median(ambient_ms) <= GOALS["enroll_p50_ms"]
                else " (NOT met)"
            ),
        ),
        (
            "  of which the agent (event to ack)",
            p50_p95(agent_ms),
            f"{served} pods served by the proxy",
            "-",
        ),
        ("    in-pod rules (netns open + apply)", p50_p95(capture_ms), "-", "-"),
        ("    node proxy (ZDS add to ack)", p50_p95(proxy_ms), "-", "-"),
    ]


def _goal(value: float, goal: float, text: str) -> str:
    return text.format(goal) + (" (met)" if value <= goal else " (NOT met)")


def _time_our_plugin(kubelet: Any) -> list[float]:
    """Milliseconds of each ``meshctl-cni ADD`` the stand-in runs (exec to exit)."""
    timings: list[float] = []
    run = kubelet._exec_plugin

    def timed(command: str, conf: Any, pod: Any, ifname: str) -> Any:
        started = time.perf_counter()
        try:
            return run(command, conf, pod, ifname)
        finally:
            if command == "ADD" and conf.get("type") == "meshctl-cni":
                timings.append((time.perf_counter() - started) * 1000)

    kubelet._exec_plugin = timed
    return timings


# -- the node proxy's memory -------------------------------------------------------------------


def bench_rss(tmp: Path, pods: int) -> list[Row]:
    from tests.harness.netns import NetnsFactory
    from tests.netns.ambient_harness import NodeProxy, write_ca_dir
    from tests.netns.zds_peer import AgentPeer
    from tests.netns.ztunnel_harness import Ca, write_local_config

    factory = NetnsFactory()
    try:
        node = factory("node")
        ca_dir = write_ca_dir(Ca.create(tmp / "certs"), tmp / "ca")
        config = write_local_config(tmp / "local.yaml", workloads=[])
        agent = AgentPeer(tmp / "rss.sock")
        proxy = NodeProxy(
            node, "", tmp, config, log_path=tmp / "rss.log", group=None,
            socket_path=agent.path, ca_dir=ca_dir,
        )  # fmt: skip
        try:
            proxy.start(wait_ready=False)
            agent.accept()
            assert agent.snapshot_sent() == ""
            proxy.wait_ready()
            time.sleep(1.0)
            empty = _proxy_memory(proxy)
            for i in range(pods):
                ns = factory(f"p{i}")
                error = agent.add(f"uid-{i}", ns.path, f"pod{i}", "bench", f"sa{i % 10}")
                assert error == "", error
            _wait_certificates(proxy, pods)
            time.sleep(1.0)
            full = _proxy_memory(proxy)
        finally:
            proxy.stop()
            agent.close()
    finally:
        factory.close()
    per_pod = (full[0] - empty[0]) / max(pods, 1) * 1024
    return [
        (
            f"node proxy RSS, {pods} idle pods",
            f"{full[0]:6.1f} MB ({per_pod:.0f} KB per pod)",
            f"no pods: {empty[0]:.1f} MB",
            _goal(full[0], GOALS["rss_mb"], "<= {:.0f} MB"),
        ),
        (
            "  the same as PSS (shared pages once)",
            f"{full[1]:6.1f} MB",
            f"no pods: {empty[1]:.1f} MB",
            _goal(full[1], GOALS["rss_mb"], "<= {:.0f} MB"),
        ),
    ]


def _proxy_memory(proxy: Any) -> tuple[float, float]:
    """(RSS summed, PSS summed) in MB of the supervisor and its data plane. RSS counts the
    libraries both map once per process; PSS shares them out, as a memory cgroup counts."""
    pids = [proxy.supervisor_pid(), *proxy.dataplane_pids(1)]
    pss = 0.0
    for pid in pids:
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss += int(line.split()[1]) / 1024
    return sum(hb._rss_mb(pid) for pid in pids), pss


def _wait_certificates(proxy: Any, pods: int, timeout: float = 120) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        state = proxy.config_dump()["workloadState"]
        if len(state) == pods and all(s["state"] == "Up" for s in state.values()):
            return
        time.sleep(0.2)
    raise RuntimeError(f"{pods} pods not all served within {timeout}s")


# -- traffic -------------------------------------------------------------------------------------


@contextlib.contextmanager
def _ambient(tmp: Path) -> Iterator[dict[str, Any]]:
    """One node, four pods: A and B enrolled (one node proxy), C and D outside the mesh."""
    from tests.harness.netns import node_with_pods
    from tests.netns.ambient_harness import NodeProxy, ambient_capture, write_ca_dir
    from tests.netns.zds_peer import AgentPeer
    from tests.netns.ztunnel_harness import Ca, workload, write_local_config

    with node_with_pods(4) as node:
        a, b, c, d = node.pods
        ca_dir = write_ca_dir(Ca.create(tmp / "certs"), tmp / "ca")
        config = write_local_config(
            tmp / "amb.yaml",
            workloads=[workload("client", "default", a.ip), workload("server", "prod", b.ip)],
        )
        for p in (a, b):
            ambient_capture(p)
        agent = AgentPeer(tmp / "amb.sock")
        proxy = NodeProxy(
            node.ns, "", tmp, config, log_path=tmp / "amb.log", group=None,
            socket_path=agent.path, ca_dir=ca_dir,
        )  # fmt: skip
        servers = [
            p.ns.popen(
                [sys.executable, hb.__file__, "_serve", p.ip, str(hb.MESH_PORT)],
                stdout=subprocess.PIPE,
            )
            for p in (b, d)
        ]
        try:
            for s in servers:
                assert s.stdout is not None
                assert s.stdout.readline().strip() == b"ready"
            proxy.start(wait_ready=False)
            agent.accept()
            for i, (p, name, ns) in enumerate(((a, "client", "default"), (b, "server", "prod"))):
                assert agent.add(f"uid-{i}", p.ns.path, name, ns, name) == ""
            assert agent.snapshot_sent() == ""
            proxy.wait_ready()
            _wait_certificates(proxy, 2)
            yield {"a": a, "b": b, "c": c, "d": d, "proxy": proxy}
        finally:
            proxy.stop()
            agent.close()
            for s in servers:
                s.kill()
                s.wait()


def _run_client(client: Any, server: Any, *args: str) -> dict[str, float]:
    done = client.ns.run(
        [sys.executable, hb.__file__, "_client", args[0], server.ip, str(hb.MESH_PORT), *args[1:]],
        timeout=300,
    )
    return json.loads(done.stdout)


def bench_traffic(tmp: Path, seconds: float, smoke: bool) -> list[Row]:
    rounds = str(200 if smoke else int(4000 * seconds))
    with _ambient(tmp / "ambient") as m:
        pids = [m["proxy"].supervisor_pid(), *m["proxy"].dataplane_pids(1)]
        direct_t = _run_client(m["c"], m["d"], "throughput", str(seconds))
        cpu = hb._cpu_seconds(pids)
        amb_t = _run_client(m["a"], m["b"], "throughput", str(seconds))
        per_gib = (hb._cpu_seconds(pids) - cpu) / (amb_t["bytes"] / (1 << 30))
        direct_l = _run_client(m["c"], m["d"], "latency", rounds)
        amb_l = _run_client(m["a"], m["b"], "latency", rounds)
        direct_c = _run_client(m["c"], m["d"], "conns", str(seconds), "32")
        amb_c = _run_client(m["a"], m["b"], "conns", str(seconds), "32")
    (tmp / "sidecar").mkdir()
    with hb._mesh(tmp / "sidecar", 1) as s:
        side_direct = hb._client(s, True, "throughput", str(seconds))
        side_t = hb._client(s, False, "throughput", str(seconds))
    ratio = amb_t["gbit_s"] / direct_t["gbit_s"]
    side_ratio = side_t["gbit_s"] / side_direct["gbit_s"]
    return [
        (
            "single stream",
            f"{amb_t['gbit_s']:.2f} Gbit/s ({ratio:.2f} of direct; {per_gib:.2f} proxy CPU-s/GiB)",
            f"direct {direct_t['gbit_s']:.2f} Gbit/s",
            (
                f"sidecars {side_t['gbit_s']:.2f} Gbit/s ({side_ratio:.2f} of direct "
                f"{side_direct['gbit_s']:.2f})"
            ),
        ),
        (
            "1 KiB req/resp p50 / p99",
            f"{amb_l['p50_ms'] * 1000:.0f} / {amb_l['p99_ms'] * 1000:.0f} us",
            f"direct {direct_l['p50_ms'] * 1000:.0f} / {direct_l['p99_ms'] * 1000:.0f} us",
            "-",
        ),
        (
            "new connections/s",
            f"{amb_c['per_s']:.0f} ({amb_c['errors']:.0f} errors)",
            f"direct {direct_c['per_s']:.0f}",
            "-",
        ),
    ]


# -- main ----------------------------------------------------------------------------------------


def main() -> int:
    if len(sys.argv) > 1 and sys.argv[1] in ("_serve", "_client"):
        return hb.main()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: does every figure come?")
    parser.add_argument("--enrolled", type=int, default=50, help="pods enrolled before timing")
    parser.add_argument("--samples", type=int, default=20, help="pods timed")
    parser.add_argument("--rss-pods", type=int, default=100)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--only", default="enroll,rss,traffic")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    if args.smoke:
        args.enrolled, args.samples, args.rss_pods, args.seconds = 2, 2, 5, 0.5
    only = set(args.only.split(","))
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="bench-ambient-") as tmp:
        if "enroll" in only:
            (Path(tmp) / "enroll").mkdir()
            rows += bench_enroll(Path(tmp) / "enroll", args.enrolled, args.samples)
        if "rss" in only:
            (Path(tmp) / "rss").mkdir()
            rows += bench_rss(Path(tmp) / "rss", args.rss_pods)
        if "traffic" in only:
            (Path(tmp) / "traffic").mkdir()
            rows += bench_traffic(Path(tmp) / "traffic", args.seconds, args.smoke)
    print(f"ambient bench: {os.cpu_count()} CPUs{' (smoke)' if args.smoke else ''}")
    print(f"{'':40} {'ambient':58} {'baseline (same run)':34} target / sidecars")
    for name, value, base, extra in rows:
        print(f"{name:40} {value:58} {base:34} {extra}")
    if args.smoke:
        print(SMOKE_MARKER)
    return 0


if __name__ == "__main__":
    sys.exit(main())
