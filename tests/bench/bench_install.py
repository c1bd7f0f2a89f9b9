"""Benchmark: ``meshctl install --profile default`` to all Ready, and ``meshctl verify``, on the
real single-node cluster, each beside a baseline measured in the same run.

Run (root; node binaries built, ``bash packaging/build.sh`` done):
    python tests/bench/bench_install.py [--smoke] [--samples K]

- install: ``meshctl install --profile default -y`` (server-side apply in dependency order,
  prune, readiness wait) until it returns with every component Ready; beside it ``kubectl apply
  --server-side -f`` of the same rendered manifest (``meshctl manifest generate``; its CRDs
  applied first and waited for until Established, as kubectl needs for the GatewayClass) plus
  ``kubectl wait`` / ``kubectl rollout status`` of the same workloads. Each starts from an
  empty cluster (``meshctl uninstall --purge`` between them, not timed).
- verify: ``meshctl verify`` end to end (process start to exit) on the healthy install, K
  samples; the target is <= 3 s. Beside it ``meshctl version`` (the same interpreter start and
  plugin discovery, no cluster work), so the share that is verify's own shows.
Figures, not a gate. ``--smoke``: one sample each, checks only that every figure was produced.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

VERIFY_GOAL_S = 3.0
SYSTEM_NS = "meshctl-system"


def timed(argv: list[str], what: str, timeout: float = 600) -> float:
    started = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout, check=False)
    took = time.monotonic() - started
    if done.returncode != 0:
        raise SystemExit(f"{what} failed ({done.returncode}):\n{done.stdout[-2000:]}"
                         f"\n{done.stderr[-3000:]}")  # fmt: skip
    return took


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="one sample each, figures only")
    parser.add_argument("--samples", type=int, default=5, help="verify runs")
    args = parser.parse_args(argv)
    samples = 1 if args.smoke else max(1, args.samples)

    from tests.harness.node import TestNode, locate_node_binaries

    binaries = locate_node_binaries()
    if isinstance(binaries, str):
        print(f"bench_install: no node: {binaries}", file=sys.stderr)
        return 2
    node = TestNode(binaries, lock_timeout=1800)
    try:
        cluster = node.start()
        image = node.image("meshctl")
        meshctl = [sys.executable, "-m", "meshctl", "--kubeconfig", str(cluster.kubeconfig)]
        values = [
            "--profile", "default",
            "--set", f"image={image}", "--set", "imagePullPolicy=Never",
            "--set", "components.controlplane.replicas=1",
        ]  # fmt: skip
        kubectl = [str(cluster.kubectl), f"--kubeconfig={cluster.kubeconfig}"]
        purge = [*meshctl, "uninstall", "-y", "--purge", "--timeout", "5m"]

        # Baseline first: kubectl apply of the rendered manifest, then kubectl wait.
        with tempfile.TemporaryDirectory(prefix="bench-install-") as tmp:
            rendered = Path(tmp) / "manifest.yaml"
            printed = subprocess.run(
                [*meshctl, "manifest", "generate", *values],
                capture_output=True, text=True, check=True, timeout=120,
            )  # fmt: skip
            rendered.write_text(printed.stdout)
            # What a kubectl user does with a manifest that defines CRDs and objects of them
            # (the GatewayClass): the CRDs first, wait until they are served, then everything.
            crds = Path(tmp) / "crds.yaml"
            crds.write_text(
                yaml.safe_dump_all(
                    d
                    for d in yaml.safe_load_all(printed.stdout)
                    if d and d.get("kind") == "CustomResourceDefinition"
                )
            )
            started = time.monotonic()
            timed([*kubectl, "apply", "--server-side", "--field-manager=bench", "-f",
                   str(crds)], "kubectl apply (CRDs)")  # fmt: skip
            timed([*kubectl, "wait", "--for=condition=Established", "-f", str(crds),
                   "--timeout=2m"], "kubectl wait (CRDs)", 150)  # fmt: skip
            timed([*kubectl, "apply", "--server-side", "--field-manager=bench", "-f",
                   str(rendered)], "kubectl apply")  # fmt: skip
            timed([*kubectl, "-n", SYSTEM_NS, "wait", "--for=condition=Available",
                   "deployment", "--all", "--timeout=5m"], "kubectl wait", 330)  # fmt: skip
            timed([*kubectl, "-n", SYSTEM_NS, "rollout", "status", "daemonset/meshctl-cni-node",
                   "--timeout=5m"], "kubectl rollout status", 330)  # fmt: skip
            baseline_install = time.monotonic() - started
            delete = [*kubectl, "delete", "--wait=true", "--ignore-not-found", "-f", str(rendered)]
            subprocess.run(delete, capture_output=True, timeout=300, check=False)
        timed(purge, "uninstall --purge (after the baseline)", 330)

        install = timed([*meshctl, "install", "-y", *values], "meshctl install", 600)
        verify = [timed([*meshctl, "verify"], "meshctl verify", 120) for _ in range(samples)]
        version = [timed([*meshctl, "version"], "meshctl version", 60) for _ in range(samples)]
        timed(purge, "uninstall --purge", 330)
    finally:
        node.stop()

    verify_p50 = statistics.median(verify)
    rows = [
        ("install --profile default to all Ready", f"{install:6.1f} s",
         "kubectl apply + wait", f"{baseline_install:6.1f} s"),
        (f"verify end to end (p50 of {samples})", f"{verify_p50:6.2f} s",
         "meshctl version", f"{statistics.median(version):6.2f} s"),
    ]  # fmt: skip
    print(f"{'figure':42} {'meshctl':>10}   {'baseline':24} {'value':>9}")
    for name, value, base, base_value in rows:
        print(f"{name:42} {value:>10}   {base:24} {base_value:>9}")
    verdict = "meets" if verify_p50 <= VERIFY_GOAL_S else "misses"
    print(f"verify {verdict} the {VERIFY_GOAL_S:.0f} s target (p50 {verify_p50:.2f} s)")
    if args.smoke:
        from tests.bench.smoke import figures_produced

        return figures_produced(
            {
                "install_s": install,
                "baseline_install_s": baseline_install,
                "verify_s": verify_p50,
                "baseline_verify_s": statistics.median(version),
            }
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
