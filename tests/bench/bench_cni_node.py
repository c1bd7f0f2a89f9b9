"""Benchmark: CNI ADD as containerd calls it on the real node, beside Debian's portmap in the chain.

Run (root, node binaries built, images built): python -m tests.bench.bench_cni_node [--pods N]
[--smoke]. Starts the test node (tests/harness/node.py, its machine lock), puts Debian's
``portmap`` into the node's conflist before ``bridge``'s successors (where a kubeadm-style node
has it), rolls out ``meshctl cni manifest`` from the meshctl image (the DaemonSet installs the
one-dir tree and links ``/opt/cni/bin/meshctl-cni`` to it), then creates pods one at a time:
CNI-mode injected ones (the plugin reads the pod and applies its rules) and plain ones (read,
nothing applied); then replaces it with the ambient stack (control plane, ``cni manifest
--ambient``, the node proxy) and creates pods in a namespace labelled for ambient mode (the
ADD returns once the node agent captured the pod and the node proxy acknowledged it).

What is timed: each plugin process from its ``execve`` to its exit, read from the kernel's own
``sched_process_exec``/``sched_process_exit`` trace events (a private tracefs instance, microsecond
timestamps), so nothing is wrapped and containerd runs the chain exactly as it would. Only the
window from a pod's create to its IP showing up counts (ADDs; the DELs of its deletion fall
outside). Prints p50/p95 in ms per plugin; goal p50 <= 60 ms for meshctl-cni on injected, plain and
ambient pods (``--no-ambient``: sidecar mode's only).
``--smoke``: two pods of each kind; checks only that every figure was produced.
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
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kubernetes import client as k8s
from meshctl_plugins.controlplane import crds

from tests.bench.smoke import figures_produced
from tests.harness import workloads as wl
from tests.harness.cli import run_meshctl
from tests.harness.node import (
    CNI_BIN_DIR,
    CNI_CONF_DIR,
    CONFLIST_NAME,
    TestNode,
    locate_node_binaries,
)
from tests.node.test_cni_on_node import (
    NETNS_DIR,
    SYSTEM_NS,
    injected,
    manifest,
    publish_root_cert,
)

GOAL_MS = 60.0
TRACEFS = Path("/sys/kernel/tracing")
PLUGINS = {
    "meshctl-cni": str(CNI_BIN_DIR / "meshctl-cni"),
    "portmap": "/usr/lib/cni/portmap",
    "bridge": "/usr/lib/cni/bridge",
}
# "  <comm>-<pid> [cpu] flags  12345.678901: sched_process_exec: filename=/x pid=7 old_pid=7"
EVENT = re.compile(
    r"\s(\d+\.\d+): (sched_process_exec|sched_process_exit|tracing_mark_write): (.*)"
)


@dataclass
class Trace:
    """A private ftrace instance recording exec and exit events (and our markers)."""

    root: Path

    def clear(self) -> None:
        (self.root / "trace").write_text("")

    def mark(self, text: str) -> None:
        (self.root / "trace_marker").write_text(text)

    def read(self) -> list[tuple[float, str, str]]:
        out = []
        for line in (self.root / "trace").read_text().splitlines():
            found = EVENT.search(line)
            if found:
                out.append((float(found[1]), found[2], found[3]))
        return out


@contextlib.contextmanager
def tracing() -> Iterator[Trace]:
    mounted = False
    if not (TRACEFS / "instances").is_dir():
        subprocess.run(["mount", "-t", "tracefs", "nodev", str(TRACEFS)], check=True)
        mounted = True
    root = TRACEFS / "instances" / f"meshctl-bench-{os.getpid()}"
    root.mkdir()
    try:
        (root / "buffer_size_kb").write_text("8192")
        for event in ("sched_process_exec", "sched_process_exit"):
            (root / "events" / "sched" / event / "enable").write_text("1")
        (root / "tracing_on").write_text("1")
        yield Trace(root)
    finally:
        (root / "tracing_on").write_text("0")
        root.rmdir()
        if mounted:
            subprocess.run(["umount", str(TRACEFS)], check=False)


def durations(events: list[tuple[float, str, str]]) -> dict[str, list[float]]:
    """Per plugin: ms from exec to exit of its ADD runs exec'd inside an ADD window.

    ADD and DEL are told apart by the chain's order (the kernel events carry no arguments): ADD
    runs bridge, portmap, meshctl-cni; DEL runs them backwards. So a meshctl-cni run right after
    a portmap run is an ADD, a portmap run right after a bridge run is one, and a bridge run is one
    when a portmap run follows it. (A kubelet may DEL a sandbox twice, late: counted as DEL.)
    """
    by_path = {path: name for name, path in PLUGINS.items()}
    runs: list[tuple[str, float, float, bool]] = []  # plugin, exec, exit, exec'd inside a window
    started: dict[str, tuple[str, float, bool]] = {}
    inside = False
    for stamp, kind, body in events:
        if kind == "tracing_mark_write":
            inside = body.startswith("add-begin")
            continue
        pid = re.search(r"\bpid=(\d+)", body)
        if pid is None:
            continue
        if kind == "sched_process_exec":
            filename = re.search(r"filename=(\S+)", body)
            name = by_path.get(filename[1]) if filename else None
            if name and pid[1] not in started:
                started[pid[1]] = (name, stamp, inside)
        elif pid[1] in started:
            name, begun, windowed = started.pop(pid[1])
            runs.append((name, begun, stamp, windowed))
    runs.sort(key=lambda run: run[1])
    out: dict[str, list[float]] = {name: [] for name in PLUGINS}
    for i, (name, begun, ended, windowed) in enumerate(runs):
        before = runs[i - 1][0] if i else None
        after = runs[i + 1][0] if i + 1 < len(runs) else None
        add = {"meshctl-cni": before == "portmap", "portmap": before == "bridge"}.get(
            name, after == "portmap"
        )
        if add and windowed:
            out[name].append((ended - begun) * 1000)
    return out


def stats(name: str, samples: list[float]) -> str:
    if not samples:
        return f"{name:<44} no samples"
    ordered = sorted(samples)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return (
        f"{name:<44} p50 {statistics.median(ordered):7.1f} ms   p95 {p95:7.1f} ms"
        f"   n={len(ordered)}"
    )


def with_portmap(conflist: bytes) -> bytes:
    body = json.loads(conflist)
    body["plugins"].insert(1, {"type": "portmap", "capabilities": {"portMappings": True}})
    return (json.dumps(body, indent=2) + "\n").encode()


def time_adds(
    api: k8s.ApiClient, trace: Trace, namespace: str, pods: list[dict[str, Any]]
) -> dict[str, list[float]]:
    core = k8s.CoreV1Api(api)
    out: dict[str, list[float]] = {name: [] for name in PLUGINS}
    for pod in pods:
        name = pod["metadata"]["name"]
        trace.clear()
        trace.mark(f"add-begin {name}")
        core.create_namespaced_pod(namespace, pod)
        ip = wl.retry(
            lambda n=name: core.read_namespaced_pod(n, namespace).status.pod_ip, bool, 120, 0.05
        )
        if not ip:
            raise TimeoutError(f"pod {name} got no IP\n{wl.describe_namespace(api, namespace)}")
        trace.mark(f"add-end {name}")
        core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
        wl.delete(api, [pod], namespace)
        # The sandbox's DEL runs after the API object is gone; the next ADD window must not
        # see it. DEL runs the chain backwards: bridge is its last plugin.
        wl.retry(lambda: bridge_ran_after_end(trace.read()), bool, 60, 0.2)
        for plugin, samples in durations(trace.read()).items():
            out[plugin] += samples
    return out


def bridge_ran_after_end(events: list[tuple[float, str, str]]) -> bool:
    after = False
    pids: set[str] = set()
    for _, kind, body in events:
        after = after or (kind == "tracing_mark_write" and body.startswith("add-end"))
        pid = re.search(r"\bpid=(\d+)", body)
        if not after or pid is None:
            continue
        if kind == "sched_process_exec" and f"filename={PLUGINS['bridge']} " in f"{body} ":
            pids.add(pid[1])
        elif kind == "sched_process_exit" and pid[1] in pids:
            return True
    return False


AMBIENT_LABEL = "istio.io/dataplane-mode"


def printed(*args: str) -> list[dict[str, Any]]:
    done = run_meshctl(*args, "-o", "json")
    if done.returncode != 0:
        raise RuntimeError(done.stderr)
    items: list[dict[str, Any]] = json.loads(done.stdout)["items"]
    return items


def ambient_stack(api: k8s.ApiClient, image: str) -> list[dict[str, Any]]:
    """Control plane, the ambient node agent and the node proxy, rolled out (as
    tests/node/test_ambient_on_node.py does); the objects, to delete."""
    core = k8s.CoreV1Api(api)
    wl.apply(api, crds.objects())
    plane = printed("controlplane", "manifest", "--image", image, "--replicas", "1")
    wl.apply(api, plane)
    wl.wait_rollout(api, "Deployment", SYSTEM_NS, "meshctl-controlplane", timeout=180)
    service = core.read_namespaced_service("meshctl-controlplane", SYSTEM_NS)
    address = f"{service.spec.cluster_ip}:15012"
    agent = printed("cni", "manifest", "--ambient", "--image", image, "--netns-dir", str(NETNS_DIR))
    wl.apply(api, agent)
    wl.wait_rollout(api, "DaemonSet", SYSTEM_NS, "meshctl-cni-node", timeout=180)
    proxy = printed(
        "ztunnel", "manifest", "--image", image, "--ca-address", address, "--xds-address", address
    )
    wl.apply(api, proxy)
    wl.wait_rollout(api, "DaemonSet", SYSTEM_NS, "meshctl-ztunnel", timeout=180)
    return plane + agent + proxy


def time_ambient_adds(
    api: k8s.ApiClient, image: str, busybox: str, count: int
) -> dict[str, list[float]]:
    """ADDs of pods in a namespace labelled for ambient mode, with the ambient stack up."""
    objects = ambient_stack(api, image)
    k8s.CoreV1Api(api).create_namespace(
        {"metadata": {"name": "bench-ambient", "labels": {AMBIENT_LABEL: "ambient"}}}
    )
    wl.wait_service_account(api, "bench-ambient")
    with tracing() as trace:
        pods = [wl.busybox_pod(f"amb-{i}", busybox, ["sleep", "3600"]) for i in range(count)]
        samples = time_adds(api, trace, "bench-ambient", pods)
    wl.delete_namespace_now(api, "bench-ambient")
    wl.delete(api, objects)
    return samples


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pods", type=int, default=20, help="pods of each kind")
    parser.add_argument("--smoke", action="store_true", help="two pods each; only check figures")
    parser.add_argument("--no-ambient", action="store_true", help="sidecar mode's pods only")
    args = parser.parse_args()
    count = 2 if args.smoke else args.pods
    binaries = locate_node_binaries()
    if isinstance(binaries, str):
        print(binaries)
        return 2
    node = TestNode(binaries, lock_timeout=1800)
    conflist = CNI_CONF_DIR / CONFLIST_NAME
    figures: dict[str, dict[str, list[float]]] = {}
    try:
        node.start()
        busybox = node.image("busybox")
        node.image("meshctl")
        conflist.write_bytes(with_portmap(conflist.read_bytes()))
        objects = manifest()
        with node.cluster.api_client() as api, tempfile.TemporaryDirectory() as tmp:
            core = k8s.CoreV1Api(api)
            for ns in (SYSTEM_NS, "bench"):
                core.create_namespace({"metadata": {"name": ns}})
                wl.wait_service_account(api, ns)
            publish_root_cert(api, SYSTEM_NS)
            publish_root_cert(api, "bench")
            wl.apply(api, objects)
            wl.wait_rollout(api, "DaemonSet", SYSTEM_NS, "meshctl-cni-node", timeout=180)
            sleep = ["sleep", "3600"]
            with tracing() as trace:
                plain = [wl.busybox_pod(f"plain-{i}", busybox, sleep) for i in range(count)]
                shop = [
                    injected(wl.busybox_pod(f"shop-{i}", busybox, sleep), Path(tmp))
                    for i in range(count)
                ]
                figures["injected pod"] = time_adds(api, trace, "bench", shop)
                figures["plain pod"] = time_adds(api, trace, "bench", plain)
            wl.delete(api, objects)
            if not args.no_ambient:
                figures["ambient pod"] = time_ambient_adds(
                    api, node.image("meshctl"), busybox, count
                )
            wl.delete_namespace_now(api, "bench")
            wl.delete_namespace_now(api, SYSTEM_NS)
    finally:
        node.stop()
    print(f"CNI ADD on the real node (containerd runs the chain), {count} pods each, exec to exit")
    for kind, per_plugin in figures.items():
        print(f"{kind}:")
        for name, samples in per_plugin.items():
            print(stats(f"  {name}", samples))
    print(f"goal: meshctl-cni p50 <= {GOAL_MS:.0f} ms on every kind of pod (portmap: the floor)")
    if not args.smoke:
        return 0
    return figures_produced(
        {
            f"{kind} {name}": statistics.median(samples) if samples else None
            for kind, per_plugin in figures.items()
            for name, samples in per_plugin.items()
        }
    )


if __name__ == "__main__":
    sys.exit(main())
