"""Benchmark: CNI ADD latency as the runtime sees it (exec of the plugin to its exit).

Run (root, kube binaries built): python -m tests.bench.bench_cni [--runs N] [--tree DIR] [--smoke]
Starts a throwaway etcd + kube-apiserver, creates a CNI-mode-injected pod and a plain one, and
per sample a fresh pod netns (outside the timed part); the node agent's request endpoint runs in
this process (the plugin is its thin client). Times, in the same run:
- ``meshctl-cni ADD`` for the injected pod (API lookup + rules applied in the netns) and for the
  plain pod (API lookup, nothing applied), once for each installed form: the fast form the
  DaemonSet installs from the image (the one-dir tree, ``--tree``, placed and linked by the real
  installer) and the unfrozen launcher script (this checkout's interpreter),
- Debian's ``/usr/lib/cni/portmap`` ADD with the same prevResult (a Go plugin doing no work:
  the floor of exec + runtime start),
then the parts: bare interpreter start, start + imports + dispatch (``VERSION``) per form, the
pod GET in-process (on the kept-alive connection the agent reuses, and on a new one), the rule
apply in-process. Prints p50/p95 in ms; goal p50 <= 60 ms for the injected pod with the fast
form. ``--smoke``: two runs each, and only checks that every figure was produced (the tree must
exist). Figures, not a gate.
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
from meshctl_plugins.cni.installer import Installer, InstallSettings, PluginTree
from meshctl_plugins.cni.manifest import CniValues, objects

from meshctl.core.capture.plan import plan
from meshctl.core.capture.settings import settings_from_args
from meshctl.core.k8s.cni.pod import decide
from meshctl.core.k8s.inject.pipeline import inject_pod
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.core.k8s.install.components import standalone
from meshctl.core.tree import MANIFEST_NAME
from meshctl.core.tree import parse as parse_manifest
from meshctl.kube import pods, rest
from meshctl.net import capture, netns
from tests.bench.smoke import figures_produced
from tests.harness import netns as harness
from tests.harness.cni import (
    PREV_RESULT,
    NodeAgent,
    exec_plugin,
    fake_node,
    install_launcher,
    network_config,
)
from tests.harness.kube import (
    SA_ISSUER,
    create_namespace,
    locate_binaries,
    request_token,
    running_cluster,
)
from tests.harness.netns import Netns

GOAL_MS = 60.0
PORTMAP = Path("/usr/lib/cni/portmap")


FIGURES: dict[str, float] = {}  # name -> p50 ms, for the smoke check


def stats(name: str, samples: list[float], form: str = "") -> str:
    ordered = sorted(samples)
    FIGURES[f"{form} {name.strip()}".strip()] = statistics.median(ordered)
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


def install_tree(tree: Path, node: Path) -> Path:
    """The fast form as the DaemonSet installs it: a verified copy of ``tree``, linked."""
    node.mkdir(parents=True)
    fake_node(node)
    settings = InstallSettings(
        cni_bin_dir=str(node / "bin"),
        cni_conf_dir=str(node / "net.d"),
        run_dir=str(node / "run"),
        service_account_dir=str(node / "sa"),
        kube_server="https://127.0.0.1:1",
    )
    manifest = parse_manifest((tree / MANIFEST_NAME).read_bytes())
    Installer(settings, tree=PluginTree(tree.resolve(), manifest)).install()
    return node / "bin" / "meshctl-cni"


def main() -> int:  # noqa: PLR0915 (one linear script)
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument(
        "--tree", default=os.environ.get("MESHCTL_FROZEN_TREE", "dist/meshctl-tree")
    )
    parser.add_argument("--smoke", action="store_true", help="two runs; only check figures appear")
    args = parser.parse_args()
    runs = 2 if args.smoke else args.runs
    tree = Path(args.tree)
    if not (tree / MANIFEST_NAME).is_file():
        print(f"(no one-dir tree at {tree}: run bash packaging/build.sh)")
        if args.smoke and os.environ.get("CI") == "true":  # CI builds it before this runs
            return 1
    binaries = locate_binaries()
    if isinstance(binaries, str):
        print(binaries)
        return 2
    with tempfile.TemporaryDirectory() as tmp, running_cluster(binaries) as cluster:
        work = Path(tmp)
        with cluster.api_client() as api:
            create_namespace(api, "bench")
            # The plugin's own RBAC, as `meshctl cni manifest` grants it.
            rendered = objects(standalone("bench", None), CniValues())
            by_kind = {o["kind"]: o for o in rendered}
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
        # The plugin is a thin client: its requests are served by the node agent's endpoint,
        # here on a thread of this process (tests/harness/cni.NodeAgent), warm like the
        # DaemonSet's.
        NodeAgent(work / "run").start()
        plugins = {"launcher (unfrozen)": install_launcher(work / "bin", work / "run")}
        if (tree / MANIFEST_NAME).is_file():
            plugins = {"fast form (tree)": install_tree(tree, work / "node"), **plugins}
        conf = network_config(kubeconfig=str(kubeconfig), run_dir=str(work / "run"))

        def add(plugin: Path, name: str) -> Callable[[Netns], object]:
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

        def version(plugin: Path) -> Callable[[Netns], object]:
            def run(_: Netns) -> None:
                result = exec_plugin(plugin, "VERSION", {"cniVersion": "1.0.0"}, pod=None)
                assert result.returncode == 0

            return run

        config = rest.load(str(kubeconfig))

        def api_get(_: Netns) -> None:
            pods.get_pod(config, "bench", "shop", timeout=2, deadline=2)

        def api_get_new_connection(_: Netns) -> None:
            rest.close_idle_connections()
            pods.get_pod(config, "bench", "shop", timeout=2, deadline=2)

        shop = pods.get_pod(config, "bench", "shop", timeout=2, deadline=2)
        capture_plan = plan(settings_from_args(decide(shop).args))

        def apply(ns: Netns) -> None:
            capture.apply(capture_plan, target=netns.NetnsRef(ns.path, ns.path), backend="iptc")

        print(
            f"CNI ADD latency, {runs} runs each, {os.cpu_count()} cores ({sys.version.split()[0]})"
        )
        for form, plugin in plugins.items():
            print(f"{form}:")
            injected = timed(add(plugin, "shop"), runs)
            print(stats("  ADD, injected pod (rules applied)", injected, form))
            print(stats("  ADD, plain pod (lookup only)", timed(add(plugin, "plain"), runs), form))
            print(stats("  VERSION (start+imports+dispatch)", timed(version(plugin), runs), form))
        print(stats("portmap ADD (Debian, Go) baseline", timed(portmap, runs)))
        print("parts:")
        print(stats("  python -c pass (interpreter start)", timed(interpreter, runs)))
        print(stats("  pod GET in-process, kept-alive connection", timed(api_get, runs)))
        print(
            stats("  pod GET in-process, new TLS connection", timed(api_get_new_connection, runs))
        )
        print(stats("  rule apply in-process (iptc)", timed(apply, runs)))
        print(f"goal: p50 <= {GOAL_MS:.0f} ms for the injected pod with the fast form")
    return figures_produced(FIGURES) if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
