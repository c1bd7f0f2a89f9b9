"""Benchmark: ``meshctl inject -f`` on a long manifest (50 MB of ~1 KiB Deployments, the size of
issue 24's report), one document at a time: documents per second and peak memory.

Run from the repository root: python -m tests.bench.bench_inject_stream [--megabytes N]
[--profile] [--smoke] (``--smoke``: 0.2 MB, only checks that every figure was produced;
``--profile``: the in-process pipeline's top functions by own time, under cProfile)

Rows, measured in the same run on the same file: two baselines in this process (libyaml's event
parser alone: the floor any YAML tool pays; PyYAML's libyaml load and dump of each document with
no injection), then the console script (interpreter start included) writing to ``-O``: the rate
by wall clock and by the child's CPU time (the machine may be shared), and its peak RSS beside
the peak for a tenth of the input (flat memory: the two are close). Targets: >= 2,000
documents/s; peak RSS independent of the input's length. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from meshctl.core.k8s.inject import documents
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.output import YamlWriter, render_objects
from tests.bench.bench_inject import deployment
from tests.bench.smoke import figures_produced
from tests.harness.measured import meshctl

TARGET_DOCS_PER_S = 2000.0
IMAGE = "registry.example/meshctl:bench"


def deployment_1k(i: int) -> dict[str, Any]:
    """bench_inject's Deployment with a few more labels and env vars: ~1 KiB of YAML."""
    obj = deployment(i)
    obj["metadata"]["labels"] |= {"team": "payments", "tier": "backend"}
    container = obj["spec"]["template"]["spec"]["containers"][0]
    container["env"] += [{"name": f"FEATURE_{n}", "value": "enabled"} for n in range(4)]
    return obj


def write_manifest(path: Path, megabytes: float) -> int:
    """Deployments until ``megabytes``; returns how many."""
    per_doc = len(render_objects([deployment_1k(0)], "yaml")) + 4
    count = max(1, int(megabytes * 1_000_000 / per_doc))
    with path.open("w") as out:
        for start in range(0, count, 1000):
            chunk = [deployment_1k(i) for i in range(start, min(count, start + 1000))]
            out.write(("---\n" if start else "") + render_objects(chunk, "yaml"))
    return count


def parse_only(path: Path) -> float:
    start = time.perf_counter()
    with path.open("rb") as handle:
        for _ in yaml.parse(handle, Loader=yaml.CSafeLoader):
            pass
    return time.perf_counter() - start


def load_and_dump(path: Path, limit: int) -> tuple[float, int]:
    """PyYAML's libyaml loader and dumper, one document at a time, the first ``limit``."""
    sink = io.StringIO()
    done = 0
    start = time.perf_counter()
    with path.open("rb") as handle:
        for document in yaml.load_all(handle, Loader=yaml.CSafeLoader):
            yaml.dump(document, sink, Dumper=yaml.CSafeDumper, sort_keys=False)
            done += 1
            if done == limit:
                break
    return time.perf_counter() - start, done


def in_process(path: Path) -> None:
    """The CLI's pipeline without the CLI: read, inject, write, one document at a time."""
    transform = documents.pod_transform(InjectSettings(image=IMAGE))
    writer = YamlWriter()
    sink = io.StringIO()
    with path.open("rb") as handle:
        for obj, _ in documents.transform_stream(
            documents.read(handle, str(path)), str(path), transform
        ):
            sink.write(writer.document(obj))


def cli(path: Path, out: Path) -> tuple[float, float, float]:
    """(wall s, CPU s, peak MiB) of ``meshctl inject -f path -O out``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    run = meshctl("inject", "-f", str(path), "-O", str(out), "--image", IMAGE, timeout=900)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if run.returncode != 0:
        raise SystemExit(run.describe())
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return run.seconds, cpu, run.max_rss_mib


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=50.0)
    parser.add_argument("--profile", action="store_true", help="cProfile the pipeline")
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: are figures produced?")
    args = parser.parse_args()
    if args.smoke:
        args.megabytes = 0.2
    figures: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="meshctl-bench-") as tmp:
        big, tenth = Path(tmp) / "big.yaml", Path(tmp) / "tenth.yaml"
        count = write_manifest(big, args.megabytes)
        small = write_manifest(tenth, args.megabytes / 10)
        size_mib = big.stat().st_size / (1 << 20)
        if args.profile:
            profile = cProfile.Profile()
            profile.runcall(in_process, tenth)
            pstats.Stats(profile).sort_stats("tottime").print_stats(15)
        parse_s = parse_only(big)
        dump_s, dumped = load_and_dump(big, min(count, 5000))
        wall, cpu, peak = cli(big, Path(tmp) / "out.yaml")
        _, _, peak_tenth = cli(tenth, Path(tmp) / "out-tenth.yaml")
        out_mib = (Path(tmp) / "out.yaml").stat().st_size / (1 << 20)
    figures["baseline libyaml parse docs/s"] = count / parse_s
    figures["baseline PyYAML load+dump docs/s"] = dumped / dump_s
    figures["meshctl inject -f docs/s (wall)"] = count / wall
    by_cpu = figures["meshctl inject -f docs/s (CPU)"] = count / cpu if cpu else float("nan")
    figures["peak MiB"] = peak
    figures["peak MiB, a tenth of the input"] = peak_tenth
    print(
        f"\ninject -f, one document at a time: {count} Deployments, {size_mib:.1f} MiB in, "
        f"{out_mib:.0f} MiB out (a tenth: {small} Deployments)"
    )
    print(f"{'what':<40} {'docs/s':>9} {'peak MiB':>9} {'target':>14}  verdict")
    rows = [
        ("baseline: libyaml parse, events only", count / parse_s, None),
        (f"baseline: PyYAML load+dump ({dumped} docs)", dumped / dump_s, None),
        ("meshctl inject -f (CLI), wall clock", count / wall, peak),
        ("meshctl inject -f (CLI), by its CPU time", by_cpu, None),
        ("meshctl inject -f, a tenth of the input", None, peak_tenth),
    ]
    for name, rate, mib in rows:
        shown_rate = f"{rate:>9.0f}" if rate is not None else f"{'':>9}"
        shown_mib = f"{mib:>9.0f}" if mib is not None else f"{'':>9}"
        target, verdict = "", ""
        if name.startswith("meshctl") and rate is not None:
            target = f">= {TARGET_DOCS_PER_S:.0f} docs/s"
            verdict = "meets" if rate >= TARGET_DOCS_PER_S else "MISSES"
        print(f"{name:<40} {shown_rate} {shown_mib} {target:>14}  {verdict}")
    flat = "flat" if peak - peak_tenth < 20 else "GROWS"
    print(f"memory: {peak_tenth:.0f} MiB for a tenth, {peak:.0f} MiB for all: {flat}")
    return figures_produced(figures) if args.smoke else 0


if __name__ == "__main__":
    sys.exit(main())
