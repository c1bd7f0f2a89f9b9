"""Benchmark: ``CreateCertificate`` throughput and p99 of ``meshctl controlplane run``.

Run from the repository root: python -m tests.bench.bench_ca [--requests N] [--rate R]
    [--burst 2000] [--burst-accounts 100] [--burst-channels 50] [--smoke]

A real kube-apiserver + etcd (the test harness's) and one control-plane replica on 127.0.0.1.
Each of ``--identities`` service accounts gets a real TokenRequest token; one warm-up call per
token fills the CA's TokenReview cache (Istio caches reviews by token hash), then
``--requests`` calls with fresh ztunnel-style CSRs (P-256, generated before the clock starts)
go over TLS with ``--in-flight`` calls outstanding, spread over one channel per identity.
Latency is per call, send to answer, in the client. Targets: >= 500 certificates/s, p99 <= 20 ms.
The open loop's calls are also read from the server's own histogram
(``meshctl_ca_request_duration_seconds``: authentication, checks and signing, no gRPC or client),
as the share answered within 20 ms, which separates the server from the Python client.

Burst (``--burst``, issue 29: 2,000 pods starting at once): as many distinct tokens (TokenRequests
for ``--burst-accounts`` service accounts, one token per pod as the kubelet's projected tokens
are) and fresh CSRs, all calls sent at the same moment over ``--burst-channels`` connections
opened before the clock (a node proxy's, or a sidecar's, connection to the CA), each call
carrying its own pod's token: the time until every pod has its certificate and the p50/p99 of
each pod's, with the CA's TokenReview cache cold (one review per pod, counted by the server),
beside the same burst again with the cache warm (new CSRs, the same tokens) and the TokenReviews
per second the API server answers the benchmark itself (16 at a time, up to 500 tokens new to it).

With ghz (Go; ``$MESHCTL_GHZ``, PATH or ``~/go/bin``) the same server is also loaded by an
independent client that costs far less CPU per call than Python's (one token, one connection,
the same CSR each call), closed loop and open loop at ``--rate``.

Baselines measured in the same run: the raw cost of one certificate in this process (CSR parse
and check + signing, no gRPC, no auth); the same gRPC stack (``meshctl.rpc`` server, TLS, the
same client and calls) answering a fixed chain of the same size without any work, i.e. the
ceiling gRPC alone leaves; and one uncached TokenReview against the same API server (what a
cache miss adds). The client shares the machine's cores with the server.
``--smoke``: a few calls of each, asserting only that every figure was produced (CI).
Not part of the test suite: figures, not a gate.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import grpc

from meshctl import rpc
from meshctl.core.pki import ca
from meshctl.core.pki.identity import SpiffeId
from meshctl.kube.client import KubeSettings, connect
from meshctl.kube.tokens import review_token
from meshctl.proto import citadel_pb2, citadel_pb2_grpc
from tests.bench.pyspy import profiled
from tests.harness import controlplane as cp
from tests.harness.kube import (
    CertificateAuthority,
    create_namespace,
    free_port,
    locate_binaries,
    request_token,
    running_cluster,
)

THROUGHPUT_TARGET = 500.0
REVIEW_THREADS = 16  # the review-capacity baseline's parallelism
P99_TARGET_MS = 20.0


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def raw_sign(count: int) -> float:
    """Certificates per second for parse + check + sign in this process (one core)."""
    now = datetime.now(UTC)
    cert, key = ca.mint_root(trust_domain="cluster.local", now=now)
    authority = ca.load_authority(ca_cert_pem=cert.encode(), ca_key_pem=key, now=now)
    identity = SpiffeId("cluster.local", "bench", "raw")
    csrs = [cp.csr(str(identity))[0] for _ in range(count)]
    started = time.perf_counter()
    for pem in csrs:
        request = ca.parse_csr(pem)
        ca.issue_workload(
            authority,
            request.public_key,
            ca.requested_identity(request),
            ttl=timedelta(hours=24),
            now=now,
        )
    return count / (time.perf_counter() - started)


def token_review_ms(kubeconfig: Path, tokens: list[str]) -> list[float]:
    """Milliseconds per uncached TokenReview of each token (the same API server)."""
    kube = connect(KubeSettings(kubeconfig=str(kubeconfig)))
    out = []
    try:
        for token in tokens:
            started = time.perf_counter()
            verdict = review_token(kube, token, ("istio-ca", "meshctl-ca"))
            out.append((time.perf_counter() - started) * 1000)
            assert verdict.authenticated, verdict.error
    finally:
        kube.api.close()
    return out


class _FixedAnswer(citadel_pb2_grpc.IstioCertificateServiceServicer):
    """The echo baseline's servicer: a fixed two-certificate chain, no checks, no signing."""

    def __init__(self, chain: list[str]) -> None:
        self._response = citadel_pb2.IstioCertificateResponse(cert_chain=chain)

    async def CreateCertificate(  # noqa: N802 -- the gRPC method name
        self, request: citadel_pb2.IstioCertificateRequest, context: object
    ) -> citadel_pb2.IstioCertificateResponse:
        return self._response


async def _serve_fixed(port: int, folder: Path) -> None:
    pair = rpc.KeyPair(
        cert_chain_pem=(folder / "serving.crt").read_bytes(),
        key_pem=(folder / "serving.key").read_bytes(),
    )
    server = rpc.Server(pair)
    chain = [(folder / "leaf.pem").read_text(), (folder / "root.pem").read_text()]
    server.add(citadel_pb2_grpc.add_IstioCertificateServiceServicer_to_server, _FixedAnswer(chain))
    server.listen(f"127.0.0.1:{port}")
    await server.start()
    stop = asyncio.Event()
    asyncio.get_running_loop().add_signal_handler(signal.SIGTERM, stop.set)
    await stop.wait()
    await server.stop(1)


def find_ghz() -> str | None:
    """ghz (Go, github.com/bojand/ghz), a gRPC load generator much cheaper per call than a
    Python client: ``$MESHCTL_GHZ``, else on PATH, else ``~/go/bin`` (``go install``)."""
    for candidate in (os.environ.get("MESHCTL_GHZ"), shutil.which("ghz")):
        if candidate:
            return candidate
    installed = Path.home() / "go" / "bin" / "ghz"
    return str(installed) if installed.is_file() else None


def ghz_run(
    ghz: str,
    plane: cp.ControlPlaneProcess,
    root_file: Path,
    token: str,
    csr_pem: str,
    *flags: str,
) -> dict[str, float]:
    """One ghz run against the CA (one token: its review cached): calls/s, p50, p99, errors."""
    proto = Path(__file__).resolve().parents[2] / "meshctl" / "proto"
    result = subprocess.run(
        [
            ghz,
            *("--proto", str(proto / "citadel.proto"), "--import-paths", str(proto)),
            "--call",
            "istio.v1.auth.IstioCertificateService/CreateCertificate",
            *("--cacert", str(root_file), "--cname", plane.server_name),
            *("-m", json.dumps({"authorization": f"Bearer {token}"})),
            *("-d", json.dumps({"csr": csr_pem, "validity_duration": 3600})),
            *("--format", "json", *flags),
            f"127.0.0.1:{plane.grpc_port}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if result.returncode != 0 and not result.stdout.strip():
        raise RuntimeError(f"ghz failed: {result.stderr[-500:]}")
    report = json.loads(result.stdout)
    latencies = {d["percentage"]: d["latency"] / 1e6 for d in report["latencyDistribution"] or []}
    codes = report.get("statusCodeDistribution") or {}
    return {
        "rps": float(report["rps"]),
        "p50": latencies.get(50, 0.0),
        "p99": latencies.get(99, 0.0),
        "errors": float(sum(v for k, v in codes.items() if k != "OK")),
        "ok": float(codes.get("OK", 0)),
    }


def independent_client(
    args: argparse.Namespace,
    plane: cp.ControlPlaneProcess,
    root: bytes,
    token: str,
    identity: str,
    folder: Path,
) -> dict[str, dict[str, float]]:
    """ghz's closed-loop and open-loop figures, or none without ghz."""
    ghz = find_ghz()
    if ghz is None:
        return {}
    root_file = folder / "root.pem"
    root_file.write_bytes(root)
    csr_pem = cp.csr(identity)[0]
    calls = str(max(20, args.requests))
    closed = ghz_run(ghz, plane, root_file, token, csr_pem, "-c", str(args.in_flight), "-n", calls)
    rate = ("--rps", str(int(args.rate)), "-n", calls)
    opened = ghz_run(ghz, plane, root_file, token, csr_pem, "-c", "64", *rate)
    return {"closed": closed, "open": opened}


def grpc_ceiling(folder: Path, chain: list[str], csrs: list[str], in_flight: int) -> float:
    """Calls/s of the fixed-answer server in its own process, with the bench's client."""
    ca_ = CertificateAuthority("bench-echo")
    ca_.issue("echo", server=True, ip_sans=["127.0.0.1"]).write(folder, "serving")
    (folder / "leaf.pem").write_text(chain[0])
    (folder / "root.pem").write_text(chain[-1])
    port = free_port()
    server = subprocess.Popen(
        [sys.executable, "-m", "tests.bench.bench_ca", "--serve-fixed", str(port), str(folder)]
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            with socket.socket() as probe:
                if probe.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if time.monotonic() > deadline or server.poll() is not None:
                raise RuntimeError("the fixed-answer server did not start")
            time.sleep(0.05)

        async def run() -> float:
            auth = rpc.CallAuth(token="bench", cluster_id="Kubernetes")
            async with rpc.connect(
                f"127.0.0.1:{port}", root_pem=ca_.cert_pem, auth=auth
            ) as channel:
                await cp.create_certificate(channel, csrs[0])
                return await closed_loop([(channel, pem) for pem in csrs], in_flight)

        return asyncio.run(run())
    finally:
        server.send_signal(signal.SIGTERM)
        server.wait(10)


async def closed_loop(calls: list[tuple[object, str]], in_flight: int) -> float:
    """Calls per second with ``in_flight`` outstanding until ``calls`` are done."""
    pending = list(calls)

    async def worker() -> None:
        while pending:
            channel, pem = pending.pop()
            assert len(await cp.create_certificate(channel, pem, timeout=30)) == 2

    started = time.perf_counter()
    await asyncio.gather(*(worker() for _ in range(in_flight)))
    return len(calls) / (time.perf_counter() - started)


async def load(
    plane: cp.ControlPlaneProcess,
    root: bytes,
    work: list[tuple[str, list[str]]],
    in_flight: int,
    rate: float,
) -> tuple[dict[str, float], list[str]]:
    """Closed loop (``in_flight`` calls outstanding: the most it signs per second), then open
    loop at ``rate`` calls/s (latency from each call's scheduled send time, so a late start
    counts against the server), both over TLS; and the first, uncached, call per token."""
    channels = [plane.channel(root, token) for token, _ in work]
    try:
        # Warm-up: one call per token (a TokenReview each), not timed.
        first = []
        for channel, (_, csrs) in zip(channels, work, strict=True):
            started = time.perf_counter()
            await cp.create_certificate(channel, csrs.pop())
            first.append((time.perf_counter() - started) * 1000)
        calls = [(ch, pem) for ch, (_, csrs) in zip(channels, work, strict=True) for pem in csrs]
        secrets.SystemRandom().shuffle(calls)
        half = len(calls) // 2
        closed, opened = calls[:half], calls[half:]
        count = len(closed)
        throughput = await closed_loop(closed, in_flight)
        sample = await cp.create_certificate(*opened.pop())

        latencies: list[float] = []
        server_before = await asyncio.to_thread(server_within, plane, P99_TARGET_MS / 1000)
        loop = asyncio.get_running_loop()
        begin = loop.time() + 0.1

        async def one(index: int, channel: object, pem: str) -> None:
            due = begin + index / rate
            await asyncio.sleep(max(0.0, due - loop.time()))
            assert len(await cp.create_certificate(channel, pem, timeout=30)) == 2
            latencies.append((loop.time() - due) * 1000)

        await asyncio.gather(*(one(i, ch, pem) for i, (ch, pem) in enumerate(opened)))
        offered = len(opened) / (loop.time() - begin)
        server_after = await asyncio.to_thread(server_within, plane, P99_TARGET_MS / 1000)
        handled = server_after[0] - server_before[0]
        server_share = (server_after[1] - server_before[1]) / handled if handled else float("nan")
        figures = {
            "throughput": throughput,
            "offered": offered,
            "p50": percentile(latencies, 0.50),
            "p99": percentile(latencies, 0.99),
            "first": statistics.median(first),
            "server_within": server_share,
            "calls": float(count + len(opened)),
        }
        return figures, sample
    finally:
        for channel in channels:
            await channel.close()


def burst_tokens(
    cluster: object, namespace: str, accounts: int, count: int, prefix: str = "pod-sa"
) -> list[str]:
    """``count`` distinct bound tokens (audience istio-ca) spread over ``accounts`` accounts."""
    from kubernetes import client as k8s

    names = [f"{prefix}{i}" for i in range(accounts)]
    out = []
    with cluster.api_client() as api:  # type: ignore[attr-defined]
        core = k8s.CoreV1Api(api)
        for name in names:
            core.create_namespaced_service_account(namespace, {"metadata": {"name": name}})
        spec = k8s.V1TokenRequestSpec(audiences=["istio-ca"], expiration_seconds=3600)
        for i in range(count):
            answer = core.create_namespaced_service_account_token(
                names[i % accounts], namespace, k8s.AuthenticationV1TokenRequest(spec=spec)
            )
            out.append(answer.status.token)
    return out


async def burst(
    plane: cp.ControlPlaneProcess,
    root: bytes,
    calls: list[tuple[str, str]],
    channels: int,
) -> dict[str, float]:
    """Every ``(token, csr)`` call sent at once over ``channels`` connections opened first;
    seconds from the send to the last certificate, p50/p99 per call, and the failures."""
    opened = [plane.channel(root) for _ in range(channels)]
    try:
        await asyncio.gather(*(ch.channel_ready() for ch in opened))
        stubs = [citadel_pb2_grpc.IstioCertificateServiceStub(ch) for ch in opened]
        loop = asyncio.get_running_loop()
        done: list[float] = []
        failures: list[str] = []

        async def one(index: int, token: str, pem: str) -> None:
            request = citadel_pb2.IstioCertificateRequest(csr=pem, validity_duration=3600)
            metadata = (("authorization", f"Bearer {token}"), ("clusterid", "Kubernetes"))
            try:
                answer = await stubs[index % channels].CreateCertificate(
                    request, metadata=metadata, timeout=300
                )
                assert len(answer.cert_chain) == 2
                done.append(loop.time() - begin)
            except grpc.aio.AioRpcError as exc:  # counted and shown, never hidden
                failures.append(
                    f"{exc.code().name} after {loop.time() - begin:.2f} s on connection "
                    f"{index % channels}: {exc.details()}"
                )

        begin = loop.time()
        await asyncio.gather(*(one(i, tok, pem) for i, (tok, pem) in enumerate(calls)))
        if failures:
            print(
                f"burst: {len(failures)} calls failed:",
                *sorted(failures)[:: max(1, len(failures) // 8)],
                sep="\n  ",
            )
            print(plane.log_tail(40))
        return {
            "all_s": max(done) if done else float("nan"),
            "p50_ms": percentile(done, 0.50) * 1000 if done else float("nan"),
            "p99_ms": percentile(done, 0.99) * 1000 if done else float("nan"),
            "failed": float(len(failures)),
        }
    finally:
        for ch in opened:
            await ch.close()


def run_burst(
    args: argparse.Namespace,
    cluster: object,
    plane: cp.ControlPlaneProcess,
    root: bytes,
    namespace: str,
) -> dict[str, dict[str, float]]:
    """The cold burst (every token new to the CA) and the same burst warm."""
    tokens = burst_tokens(cluster, namespace, args.burst_accounts, args.burst)
    accounts = [f"pod-sa{i % args.burst_accounts}" for i in range(args.burst)]
    out = {}
    for phase in ("cold", "warm"):
        csrs = [cp.csr(f"spiffe://cluster.local/ns/{namespace}/sa/{sa}")[0] for sa in accounts]
        reviews = plane.metric("meshctl_ca_token_reviews_total", result="accepted")
        calls = list(zip(tokens, csrs, strict=True))
        with profiled(plane.process.pid, args.profile_burst if phase == "cold" else None):
            got = asyncio.run(burst(plane, root, calls, args.burst_channels))
        got["reviews"] = plane.metric("meshctl_ca_token_reviews_total", result="accepted") - reviews
        out[phase] = got
    fresh = burst_tokens(
        cluster, namespace, args.burst_accounts, min(args.burst, 500), prefix="review-sa"
    )
    out["cold"]["api_reviews_per_s"] = review_capacity(
        cluster.kubeconfig,  # type: ignore[attr-defined]
        fresh,
        REVIEW_THREADS,
    )
    return out


def review_capacity(kubeconfig: Path, tokens: list[str], threads: int) -> float:
    """TokenReviews per second the API server answers this process, ``threads`` at a time, each
    token new to it: what a cold burst's reviews cost without the CA."""
    from concurrent.futures import ThreadPoolExecutor

    kube = connect(KubeSettings(kubeconfig=str(kubeconfig)))
    try:
        started = time.perf_counter()
        with ThreadPoolExecutor(threads) as pool:
            verdicts = list(pool.map(lambda t: review_token(kube, t, ("istio-ca",)), tokens))
        elapsed = time.perf_counter() - started
    finally:
        kube.api.close()
    assert all(v.authenticated for v in verdicts)
    return len(tokens) / elapsed


def server_within(plane: cp.ControlPlaneProcess, seconds: float) -> tuple[float, float]:
    """(issued calls so far, those the server handled within ``seconds``) by its histogram."""
    name = "meshctl_ca_request_duration_seconds_bucket"
    total = plane.metric(name, result="issued", le="+Inf")
    within = plane.metric(name, result="issued", le=str(seconds))
    return total, within


def report(
    args: argparse.Namespace,
    got: dict[str, float],
    raw: float,
    ceiling: float,
    reviews: list[float],
    issued: float,
    server_reviews: float,
) -> None:
    print(
        f"CreateCertificate over TLS, {got['calls']:.0f} calls, {args.identities} identities "
        "(TokenReview cached)"
    )
    print(
        f"  throughput      {got['throughput']:8.0f} certificates/s   "
        f"(closed loop, {args.in_flight} in flight; target >= {THROUGHPUT_TARGET:.0f})"
    )
    print(f"  at {got['offered']:.0f}/s offered (open loop, from scheduled send time):")
    print(f"    latency p50   {got['p50']:8.2f} ms")
    print(f"    latency p99   {got['p99']:8.2f} ms              (target <= {P99_TARGET_MS:.0f})")
    print(
        f"    server-side   {got['server_within'] * 100:8.2f} % handled within "
        f"{P99_TARGET_MS:.0f} ms (its histogram: authentication, checks, signing)"
    )
    print(f"  first call      {got['first']:8.2f} ms   (uncached token: TokenReview + sign)")
    print("baselines (same run):")
    print(f"  raw sign        {raw:8.0f} certificates/s   (parse + check + sign, no gRPC/auth)")
    print(f"  gRPC alone      {ceiling:8.0f} calls/s          (same stack, fixed answer, no work)")
    print(
        f"  TokenReview     {statistics.median(reviews):8.2f} ms p50, "
        f"{percentile(reviews, 0.99):.2f} ms p99 (one uncached review)"
    )
    print(f"server counted {issued:.0f} issued, {server_reviews:.0f} TokenReviews")


def report_burst(args: argparse.Namespace, bursts: dict[str, dict[str, float]]) -> None:
    if not bursts:
        return
    print(
        f"burst: {args.burst} pods at once ({args.burst} distinct tokens of "
        f"{args.burst_accounts} accounts, {args.burst_channels} connections)"
    )
    for phase, label in (("cold", "TokenReview cache cold"), ("warm", "baseline: cache warm")):
        b = bursts[phase]
        print(
            f"  {label:24} every pod served after {b['all_s']:6.2f} s; per pod p50 "
            f"{b['p50_ms']:8.1f} ms, p99 {b['p99_ms']:8.1f} ms; {b['reviews']:.0f} TokenReviews, "
            f"{b['failed']:.0f} failed"
        )
    cold = bursts["cold"]
    print(
        f"  the cold burst reviewed {args.burst / cold['all_s']:.0f} tokens/s; baseline: the API "
        f"server answers {cold['api_reviews_per_s']:.0f} TokenReviews/s ({REVIEW_THREADS} at a "
        "time from this process, tokens new to it)"
    )


def report_independent(args: argparse.Namespace, independent: dict[str, dict[str, float]]) -> None:
    if not independent:
        print("independent client: ghz not found (go install github.com/bojand/ghz/cmd/ghz)")
        return
    closed, opened = independent["closed"], independent["open"]
    print("independent client (ghz, Go; one token, one connection, same server):")
    print(
        f"  throughput      {closed['rps']:8.0f} certificates/s   "
        f"(closed loop, {args.in_flight} in flight; p99 {closed['p99']:.2f} ms)"
    )
    print(
        f"  at {opened['rps']:.0f}/s offered: p50 {opened['p50']:.2f} ms, "
        f"p99 {opened['p99']:.2f} ms (target <= {P99_TARGET_MS:.0f})"
    )
    print(f"  non-OK answers  {closed['errors'] + opened['errors']:.0f}")
    assert closed["ok"] > 0
    assert opened["ok"] > 0


def arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--requests", type=int, default=4000)
    parser.add_argument("--identities", type=int, default=16)
    parser.add_argument("--in-flight", type=int, default=32)
    parser.add_argument("--rate", type=float, default=THROUGHPUT_TARGET, help="open-loop calls/s")
    parser.add_argument("--burst", type=int, default=2000, help="pods at once (0: no burst)")
    parser.add_argument("--burst-accounts", type=int, default=100)
    parser.add_argument("--burst-channels", type=int, default=50)
    parser.add_argument(
        "--profile-burst", type=Path, help="py-spy the control plane during the cold burst"
    )
    parser.add_argument("--smoke", action="store_true", help="a few calls; figures only")
    parser.add_argument("--serve-fixed", nargs=2, metavar=("PORT", "DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.smoke:
        args.requests, args.identities, args.in_flight, args.rate = 40, 4, 4, 50.0
        args.burst, args.burst_accounts, args.burst_channels = 20, 4, 4
    return args


def main() -> int:
    args = arguments()
    if args.serve_fixed:  # the baseline's server process (started by this benchmark)
        asyncio.run(_serve_fixed(int(args.serve_fixed[0]), Path(args.serve_fixed[1])))
        return 0
    binaries = locate_binaries()
    if isinstance(binaries, str):
        raise SystemExit(binaries)

    raw = raw_sign(50 if args.smoke else 500)
    with running_cluster(binaries) as cluster, tempfile.TemporaryDirectory() as tmp:
        home, ns = f"cp-{secrets.token_hex(3)}", f"bench-{secrets.token_hex(3)}"
        with cluster.api_client() as api:
            create_namespace(api, home)
            create_namespace(api, ns)
        accounts = [f"sa{i}" for i in range(args.identities)]
        tokens = [request_token(cluster, ns, sa, "istio-ca") for sa in accounts]
        reviews = token_review_ms(cluster.kubeconfig, tokens)
        per = args.requests // args.identities + 1  # +1: the warm-up call
        work = [
            (token, [cp.csr(f"spiffe://cluster.local/ns/{ns}/sa/{sa}")[0] for _ in range(per)])
            for token, sa in zip(tokens, accounts, strict=True)
        ]
        plane = cp.start(cluster, home, Path(tmp))
        try:
            with cluster.api_client() as api:
                root = cp.root_pem(api, home)
            got, chain = asyncio.run(load(plane, root, work, args.in_flight, args.rate))
            identity = f"spiffe://cluster.local/ns/{ns}/sa/{accounts[0]}"
            independent = independent_client(args, plane, root, tokens[0], identity, Path(tmp))
            bursts = run_burst(args, cluster, plane, root, ns) if args.burst else {}
            issued = plane.metric("meshctl_ca_requests_total", result="issued")
            server_reviews = plane.metric("meshctl_ca_token_reviews_total", result="accepted")
        finally:
            plane.stop()
        fixed_csrs = [cp.csr(f"spiffe://cluster.local/ns/{ns}/sa/x")[0] for _ in range(per * 4)]
        ceiling = grpc_ceiling(Path(tmp), chain, fixed_csrs, args.in_flight)

    report(args, got, raw, ceiling, reviews, issued, server_reviews)
    report_independent(args, independent)
    report_burst(args, bursts)
    figures = [got["throughput"], got["p50"], got["p99"], got["first"], raw, ceiling]
    figures += [got["server_within"]] if got["server_within"] > 0 else [float("nan")]
    for b in bursts.values():
        figures += [b["all_s"], b["p50_ms"], b["p99_ms"]]
    figures += [bursts["cold"]["api_reviews_per_s"]] if bursts else []
    assert all(f > 0 for f in figures), figures
    assert server_reviews == args.identities + args.burst, (
        "one TokenReview per token: the first call of each (the burst's cold pass), none after"
    )
    if bursts:
        assert bursts["cold"]["failed"] == bursts["warm"]["failed"] == 0, bursts
        assert bursts["cold"]["reviews"] == args.burst, bursts
        assert bursts["warm"]["reviews"] == 0, bursts
    verdict(args.smoke, got, independent)
    return 0


def verdict(smoke: bool, got: dict[str, float], independent: dict[str, dict[str, float]]) -> None:
    if smoke:
        print("smoke: figures produced")
        return
    met = got["throughput"] >= THROUGHPUT_TARGET and got["p99"] <= P99_TARGET_MS
    print(f"targets {'met' if met else 'MISSED'} (Python client)")
    if independent:
        closed, opened = independent["closed"], independent["open"]
        met = closed["rps"] >= THROUGHPUT_TARGET and opened["p99"] <= P99_TARGET_MS
        print(f"targets {'met' if met else 'MISSED'} (ghz)")


if __name__ == "__main__":
    raise SystemExit(main())
