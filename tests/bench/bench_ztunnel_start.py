"""Benchmark: ``meshctl ztunnel run`` from exec to ready, per form of meshctl, beside baselines.

Run (root): python -m tests.bench.bench_ztunnel_start [--runs N] [--binary dist/meshctl]
            [--tree dist/meshctl-tree] [--smoke]
In a pod namespace of a throwaway node, starts the supervisor (one data-plane worker, real
certificates, a local config with the pod) and times exec -> ``/healthz/ready`` answering 200 on
15021 (polled every 2 ms), then stops it with SIGTERM; a fresh start per sample. Same run, as
baselines: ``python -c pass`` and each form's ``meshctl version`` (exec to exit). Forms: the
source tree's interpreter, the one-file binary, the one-dir tree (the image's form). Prints
p50/p95 in ms; goal: p50 <= 500 ms for the forms that run in pods. ``--smoke``: two runs each,
and only checks that every figure was produced (both frozen forms must exist). Figures, not a gate.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from meshctl.core.pki.identity import SpiffeId
from tests.bench.bench_help import measure
from tests.bench.smoke import figures_produced
from tests.harness.netns import node_with_pods
from tests.netns.ztunnel_harness import (
    TD,
    Ca,
    Sidecar,
    http_get,
    meshctl_argv,
    workload,
    write_local_config,
)

GOAL_MS = 500.0


FIGURES: dict[str, float] = {}  # name -> p50 ms, for the smoke check


def stats(name: str, samples: list[float]) -> str:
    ordered = sorted(samples)
    FIGURES[name] = statistics.median(ordered)
    p95 = ordered[min(len(ordered) - 1, round(0.95 * (len(ordered) - 1)))]
    return f"{name:<44} p50 {statistics.median(ordered):7.1f} ms   p95 {p95:7.1f} ms"


def ready_times(car: Sidecar, runs: int) -> list[float]:
    out = []
    for i in range(runs + 1):
        started = time.perf_counter()
        car.start(wait_ready=False)
        assert car.proc is not None
        while True:
            if car.proc.poll() is not None:
                raise SystemExit(f"ztunnel run exited {car.proc.returncode}: {car.log_text()}")
            try:
                if http_get(car.ns, 15021, "/healthz/ready", timeout=1)[0] == 200:
                    break
            except OSError:
                pass
            time.sleep(0.002)
        took = (time.perf_counter() - started) * 1000
        code = car.stop()
        if code != 0:
            raise SystemExit(f"ztunnel run exited {code} on SIGTERM: {car.log_text()}")
        if i:  # the first start warms the page cache
            out.append(took)
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=15)
    parser.add_argument("--binary", default=os.environ.get("MESHCTL_FROZEN_BINARY", "dist/meshctl"))
    parser.add_argument(
        "--tree", default=os.environ.get("MESHCTL_FROZEN_TREE", "dist/meshctl-tree")
    )
    parser.add_argument("--smoke", action="store_true", help="two runs; only check figures appear")
    args = parser.parse_args()
    runs = 2 if args.smoke else args.runs
    if os.geteuid() != 0:
        print("bench_ztunnel_start: needs root (network namespaces)", file=sys.stderr)
        return 2
    forms: dict[str, list[str] | None] = {"unfrozen (python -m meshctl)": None}
    for name, path in (
        ("one-file binary", Path(args.binary)),
        ("one-dir tree", Path(args.tree) / "meshctl"),
    ):
        if path.is_file():
            forms[name] = [str(path.resolve())]
        elif args.smoke:  # CI builds both before it runs this
            print(f"bench_ztunnel_start: no {name} at {path}", file=sys.stderr)
            return 1
        else:
            print(f"({name}: {path} not found, run bash packaging/build.sh)")
    lines = [
        stats("python -c pass (interpreter start)", measure([sys.executable, "-c", "pass"], runs))
    ]
    with tempfile.TemporaryDirectory() as tmp, node_with_pods(1) as node:
        work = Path(tmp)
        (pod,) = node.pods
        certs = Ca.create(work / "ca").issue("w", SpiffeId(TD, "bench", "app"))
        config = write_local_config(
            work / "local.yaml", workloads=[workload("app", "bench", pod.ip, sa="app")]
        )
        for name, binary in forms.items():
            version = [*(binary or meshctl_argv()), "version"]
            lines.append(stats(f"{name}: meshctl version", measure(version, runs)))
            car = Sidecar(
                pod.ns, "bench/app/app", certs, config, log_path=work / "zt.log",
                binary=binary[0] if binary else None, group=None,
            )  # fmt: skip
            lines.append(stats(f"{name}: ztunnel run -> ready", ready_times(car, runs)))
    print(f"meshctl ztunnel run to ready, {runs} runs each, {os.cpu_count()} cores")
    for line in lines:
        print(line)
    print(f"goal: p50 <= {GOAL_MS:.0f} ms (the forms that run in pods: the one-dir tree)")
    return figures_produced(FIGURES) if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
