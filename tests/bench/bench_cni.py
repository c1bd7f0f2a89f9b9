"""Benchmark: CNI ADD latency as the runtime sees it (exec of the plugin to its exit).

Run (root, kube binaries built): python -m tests.bench.bench_cni [--runs N] [--smoke]
Starts a throwaway etcd + kube-apiserver, creates a CNI-mode-injected pod and a plain one, and
per sample a fresh pod netns (outside the timed part). Times, in the same run:
- ``meshctl-cni ADD`` for the injected pod (API lookup + rules applied in the netns),
- ``meshctl-cni ADD`` for the plain pod (API lookup, nothing applied),
- Debian's ``/usr/lib/cni/portmap`` ADD with the same prevResult (a Go plugin doing no work:
  the floor of exec + runtime start),
then the parts: bare interpreter start, interpreter + imports + dispatch (``VERSION``), the pod
GET in-process, the rule apply in-process. Prints p50/p95 in ms; goal p50 <= 150 ms. Figures,
not a gate. ``--smoke``: two runs each, only checks that every figure was produced (CI).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from kubernetes import client as k8s
from meshctl_plugins.cni.manifest import objects

from meshctl.core.capture.plan import plan
from meshctl.core.capture.settings import settings_from_args
from meshctl.core.cni.pod import decide
from meshctl.core.inject.pipeline import inject_pod
from meshctl.core.inject.settings import InjectSettings
from meshctl.kube import pods, rest
from meshctl.net import capture, netns
from tests.bench.smoke import figures_produced
from tests.harness import netns as harness
from tests.harness.cni import PREV_RESULT, exec_plugin, install_launcher, network_config
from tests.harness.kube import (
    SA_ISSUER,
    create_namespace,
    locate_binaries,
    request_token,
    running_cluster,
)
from tests.harness.netns import Netns

GOAL_MS = 150.0
PORTMAP = Path("/usr/lib/cni/portmap")


FIGURES: dict[str, float] = {}  # name -> p50 ms, for the smoke check


def stats(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    FIGURES[name.strip()] = statistics.median(ordered)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{name:<46} p50 {statistics.median(ordered):7.1f} ms   p95 {p95:7.1f} ms"


def timed(action: Callable[[Netns], object], runs: int) -> list[float]:
    out = []
    for i in range(runs + 1):
        ns = harness.create("bench")
        try:
            started = time.perf_counter()
            action(ns)
            if i:  # the first run warms the page cache
                out.append((time.perf_counter() - started) * 1000)
        finally:
            harness.destroy(ns)
    return out


def main() -> int:  # noqa: PLR0915 (one linear script)
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--smoke", action="store_true", help="two runs: are figures produced?")
    args = parser.parse_args()
    runs = 2 if args.smoke else args.runs
    binaries = locate_binaries()
    if isinstance(binaries, str):
        print(binaries)
        return 2
    with tempfile.TemporaryDirectory() as tmp, running_cluster(binaries) as cluster:
        work = Path(tmp)
        with cluster.api_client() as api:
            create_namespace(api, "bench")
            # The plugin's own RBAC, as `meshctl cni manifest` grants it.
            by_kind = {o["kind"]: o for o in objects(namespace="bench")}
            role, binding = by_kind["ClusterRole"], by_kind["ClusterRoleBinding"]
            binding["subjects"][0]["name"] = "cni"
            rbac = k8s.RbacAuthorizationV1Api(api)
            rbac.create_cluster_role(role)
            rbac.create_cluster_role_binding(binding)
            token = request_token(cluster, "bench", "cni", SA_ISSUER)
            pod = {
                "metadata": {"name": "shop"},
                "spec": {"containers": [{"name": "app", "image": "registry.invalid/a:1"}]},
            }
            injected = inject_pod(pod, InjectSettings(cni=True), workload_name="shop").pod
            core = k8s.CoreV1Api(api)
            core.create_namespaced_pod("bench", {"apiVersion": "v1", "kind": "Pod", **injected})
            core.create_namespaced_pod(
                "bench", {"apiVersion": "v1", "kind": "Pod", **pod, "metadata": {"name": "plain"}}
            )
        kubeconfig = work / "kubeconfig"
        kubeconfig.write_text(
            json.dumps(
                {
                    "current-context": "c",
                    "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}],
                    "clusters": [
                        {
                            "name": "c",
                            "cluster": {
                                "server": cluster.server,
                                "certificate-authority": str(cluster.ca_file),
                            },
                        }
                    ],
                    "users": [{"name": "u", "user": {"token": token}}],
                }
            )
        )
        plugin = install_launcher(work / "bin")
        conf = network_config(kubeconfig=str(kubeconfig), run_dir=str(work / "run"))

        def add(name: str) -> Callable[[Netns], object]:
            def run(ns: Netns) -> None:
                result = exec_plugin(plugin, "ADD", conf, netns=ns.path, pod=("bench", name))
                assert result.returncode == 0, result.stdout + result.stderr

            return run

        def portmap(ns: Netns) -> None:
            body = {
                "cniVersion": "1.0.0",
                "name": "test-net",
                "type": "portmap",
                "capabilities": {"portMappings": True},
                "prevResult": PREV_RESULT,
            }
            result = exec_plugin(PORTMAP, "ADD", body, netns=ns.path)
            assert result.returncode == 0, result.stdout + result.stderr

        def interpreter(_: Netns) -> None:
            subprocess.run([sys.executable, "-c", "pass"], check=True)

        def version(_: Netns) -> None:
            result = exec_plugin(plugin, "VERSION", {"cniVersion": "1.0.0"}, pod=None)
            assert result.returncode == 0

        config = rest.load(str(kubeconfig))

        def api_get(_: Netns) -> None:
            pods.get_pod(config, "bench", "shop", timeout=2, deadline=2)

        shop = pods.get_pod(config, "bench", "shop", timeout=2, deadline=2)
        capture_plan = plan(settings_from_args(decide(shop).args))

        def apply(ns: Netns) -> None:
            capture.apply(capture_plan, target=netns.NetnsRef(ns.path, ns.path), backend="iptc")

        print(
            f"CNI ADD latency, {runs} runs each, {os.cpu_count()} cores ({sys.version.split()[0]})"
        )
        print(stats("meshctl-cni ADD, injected pod (rules applied)", timed(add("shop"), runs)))
        print(stats("meshctl-cni ADD, plain pod (lookup only)", timed(add("plain"), runs)))
        print(stats("portmap ADD (Debian, Go) baseline", timed(portmap, runs)))
        print("parts:")
        print(stats("  python -c pass (interpreter start)", timed(interpreter, runs)))
        print(stats("  meshctl-cni VERSION (start+imports+dispatch)", timed(version, runs)))
        print(stats("  pod GET in-process (TLS + token)", timed(api_get, runs)))
        print(stats("  rule apply in-process (iptc)", timed(apply, runs)))
        print(f"goal: p50 <= {GOAL_MS:.0f} ms for the injected pod")
    return figures_produced(FIGURES) if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
