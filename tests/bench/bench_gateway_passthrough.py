"""Benchmark: the gateway's TLS passthrough and TCP listeners beside nginx's ``stream`` module
(``ssl_preread``, Debian's package) doing the same SNI routing, in the same run.

Run: python -m tests.bench.bench_gateway_passthrough [--seconds S] [--clients N] [--smoke]
        [--profile DIR]
    --smoke         0.5 s per test, small transfers: only checks every figure was produced (CI)
    --profile DIR   also record the gateway with py-spy during each test (collapsed stacks in
                    DIR, and the leaf frames with the most samples printed)

Two routes by SNI on one port (``a.bench.test``, ``b.bench.test``), each to its own backend with
its own certificate; nginx maps ``$ssl_preread_server_name`` to the same two backends, the
gateway has a ``protocol: TLS``, ``tls.mode: Passthrough`` listener with one TLSRoute per name
(read from a local file, endpoints from EndpointSlices). Neither proxy terminates TLS. Both run
one worker process. Measured, each way (direct to the backend, nginx, the gateway):

- new TLS connections/s: client processes each opening connections one after another (a full
  TLS 1.3 handshake with the backend through the proxy, SNI alternating between the names, the
  certificate verified, the backend's one-line answer read and checked), the proxy's CPU time
  over the run (its whole process tree, from /proc): connections per proxy CPU-second;
- TLS throughput: curl downloading a file over HTTPS from an nginx backend through the
  passthrough listener (one connection, SNI ``a.bench.test``), Gbit/s and the proxy's
  CPU-seconds per GiB;
- TCP throughput: iperf3 (plain TCP: it speaks no TLS) through a TCP listener (TCPRoute) and
  nginx's ``stream`` ``proxy_pass``; after the hello a passthrough connection is this same copy.

Targets (issue 26): >= 0.8x nginx's throughput, >= 0.5x its connections per CPU-second.
Not part of the test suite: figures, not a gate. Traffic stays on 127.0.0.1.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import multiprocessing
import os
import shutil
import signal
import socket
import ssl
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.bench.bench_gateway import cpu_seconds, free_port, meshctl, process
from tests.bench.smoke import figures_produced

NAMES = ("a.bench.test", "b.bench.test")  # the connection test's, answering their name
BULK = "bulk.bench.test"  # the download's: an HTTPS backend serving a file
TLS_LISTENER, TCP_LISTENER = 443, 9400  # + the offset; 9400 stays under 65535 after it
OWN_PORTS = (15000, 15020, 15021)
TARGETS = {"throughput": 0.8, "conns_per_cpu_s": 0.5}
STREAM_MODULE = Path("/usr/lib/nginx/modules/ngx_stream_module.so")
NGINX = shutil.which("nginx") or "/usr/sbin/nginx"


def port_offset() -> int:
    """An offset at which the gateway's listeners and own ports are all free on loopback."""
    for offset in range(20000, 50000, 997):
        try:
            for port in (TLS_LISTENER, TCP_LISTENER, *OWN_PORTS):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", port + offset))
        except OSError:
            continue
        return offset
    raise RuntimeError("no free port offset for the gateway")


def wait_ready(port: int, timeout: float = 30.0) -> None:
    """Until the gateway's readiness endpoint answers 200 (its config and endpoints read)."""
    import http.client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with contextlib.suppress(OSError):
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz/ready")
            if conn.getresponse().status == 200:
                return
        time.sleep(0.1)
    raise RuntimeError(f"the gateway is not ready after {timeout:.0f}s")


# -- configuration ---------------------------------------------------------------------------------


def certificates(work: Path) -> dict[str, tuple[Path, Path]]:
    """A self-signed certificate per name: each backend its own, as passthrough promises."""
    from tests.harness.gateway import server_cert

    out = {}
    for name in (*NAMES, BULK):
        chain, key = server_cert(name)
        crt, pem = work / f"{name}.crt", work / f"{name}.key"
        crt.write_bytes(chain)
        pem.write_bytes(key)
        out[name] = (crt, pem)
    return out


def _main_context(work: Path, name: str) -> str:
    return f"""daemon off;
master_process off;
worker_processes 1;
pid {work}/{name}.pid;
error_log {work}/{name}.error.log warn;
events {{ worker_connections 4096; }}
"""


def backend_conf(
    work: Path, certs: dict[str, tuple[Path, Path]], answer: dict[str, int], https: int
) -> Path:
    """The backends, one nginx: per name a TLS port answering the name on a line (stream
    ``return``), and an HTTPS port serving ``work/www`` (the throughput test's file)."""
    servers = "\n".join(
        f"""  server {{
    listen 127.0.0.1:{answer[name]} ssl;
    ssl_certificate {certs[name][0]};
    ssl_certificate_key {certs[name][1]};
    ssl_protocols TLSv1.3;
    return "{name}\\n";
  }}"""
        for name in NAMES
    )
    crt, key = certs[BULK]
    conf = work / "backend.conf"
    conf.write_text(
        f"""load_module {STREAM_MODULE};
{_main_context(work, "backend")}
stream {{
{servers}
}}
http {{
  access_log off;
  client_body_temp_path {work}/backend.body;
  proxy_temp_path {work}/backend.proxy;
  fastcgi_temp_path {work}/backend.fcgi;
  uwsgi_temp_path {work}/backend.uwsgi;
  scgi_temp_path {work}/backend.scgi;
  keepalive_requests 1000000;
  server {{
    listen 127.0.0.1:{https} ssl;
    server_name {BULK};
    ssl_certificate {crt};
    ssl_certificate_key {key};
    ssl_protocols TLSv1.3;
    root {work}/www;
  }}
}}
"""
    )
    return conf


def nginx_proxy_conf(
    work: Path, tls_port: int, tcp_port: int, routes: dict[str, int], iperf: int
) -> Path:
    """nginx's stream module routing by the hello's SNI (ssl_preread), never terminating; and a
    plain TCP proxy to iperf3's server."""
    mapping = "\n".join(f"    {name} 127.0.0.1:{port};" for name, port in routes.items())
    conf = work / "proxy.conf"
    conf.write_text(
        f"""load_module {STREAM_MODULE};
{_main_context(work, "proxy")}
stream {{
  proxy_buffer_size 64k;  # the gateway's read size (nginx's default is 16k)
  map $ssl_preread_server_name $by_sni {{
{mapping}
  }}
  server {{
    listen 127.0.0.1:{tls_port};
    ssl_preread on;
    proxy_pass $by_sni;
  }}
  server {{
    listen 127.0.0.1:{tcp_port};
    proxy_pass 127.0.0.1:{iperf};
  }}
}}
"""
    )
    return conf


def gateway_conf(work: Path, routes: dict[str, int], iperf: int) -> Path:
    """A Gateway with a TLS passthrough and a TCP listener, a TLSRoute per name (each to its own
    Service), a TCPRoute to iperf3's server, and the Services' endpoints on loopback."""
    import yaml

    ns = "bench"
    docs: list[dict[str, Any]] = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}},
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "GatewayClass",
            "metadata": {"name": "meshctl"},
            "spec": {"controllerName": "meshctl.io/gateway-controller"},
        },
        {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": "Gateway",
            "metadata": {"name": "bench", "namespace": ns},
            "spec": {
                "gatewayClassName": "meshctl",
                "listeners": [
                    {
                        "name": "tls",
                        "port": TLS_LISTENER,
                        "protocol": "TLS",
                        "tls": {"mode": "Passthrough"},
                    },
                    {"name": "tcp", "port": TCP_LISTENER, "protocol": "TCP"},
                ],
            },
        },
    ]

    def backend(service: str, port: int) -> list[dict[str, Any]]:
        return [
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": service, "namespace": ns},
                "spec": {"ports": [{"name": "tcp", "port": port, "targetPort": port}]},
            },
            {
                "apiVersion": "discovery.k8s.io/v1",
                "kind": "EndpointSlice",
                "metadata": {
                    "name": f"{service}-1",
                    "namespace": ns,
                    "labels": {"kubernetes.io/service-name": service},
                },
                "addressType": "IPv4",
                "ports": [{"name": "tcp", "port": port}],
                "endpoints": [{"addresses": ["127.0.0.1"], "conditions": {"ready": True}}],
            },
        ]

    def route(kind: str, name: str, section: str, service: str, port: int) -> dict[str, Any]:
        spec: dict[str, Any] = {
            "parentRefs": [{"name": "bench", "sectionName": section}],
            "rules": [{"backendRefs": [{"name": service, "port": port}]}],
        }
        if kind == "TLSRoute":
            spec["hostnames"] = [name]
        return {
            "apiVersion": "gateway.networking.k8s.io/v1",
            "kind": kind,
            "metadata": {"name": service, "namespace": ns},
            "spec": spec,
        }

    for i, (name, port) in enumerate(routes.items()):
        service = f"sni-{i}"
        docs += [route("TLSRoute", name, "tls", service, port), *backend(service, port)]
    docs += [route("TCPRoute", "-", "tcp", "iperf", iperf), *backend("iperf", iperf)]
    path = work / "gateway.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    return path


# -- the clients -----------------------------------------------------------------------------------


def _connections_worker(
    port: int, names: tuple[str, ...], cafile: str, seconds: float, out: Any
) -> None:
    """One client process: connections one after another until ``seconds`` passed; puts
    (completed, wrong answers, failures)."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.load_verify_locations(cafile)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    done = wrong = failed = 0
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        name = names[(done + wrong + failed) % len(names)]
        try:
            with (
                socket.create_connection(("127.0.0.1", port), timeout=5) as raw,
                ctx.wrap_socket(raw, server_hostname=name) as tls,
            ):
                answer = b""
                while not answer.endswith(b"\n"):
                    chunk = tls.recv(64)
                    if not chunk:
                        break
                    answer += chunk
            done += 1
            wrong += answer != f"{name}\n".encode()
        except (OSError, ssl.SSLError):
            failed += 1
    out.put((done, wrong, failed))


@dataclass
class Rate:
    per_s: float
    per_cpu_s: float  # per CPU-second of the proxy (nan direct)
    cpu_s: float


def connections(
    port: int | dict[str, int], cafile: Path, seconds: float, clients: int, proxy: int | None
) -> Rate:
    """New TLS connections/s through ``port`` (a dict: straight to each name's backend)."""
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = []
    names: tuple[str, ...]
    for i in range(clients):
        if isinstance(port, dict):  # direct: a client per backend, its one name
            name = NAMES[i % len(NAMES)]
            target, names = port[name], (name,)
        else:
            target, names = port, NAMES
        worker_args = (target, names, str(cafile), seconds, queue)
        procs.append(ctx.Process(target=_connections_worker, args=worker_args, daemon=True))
    before = cpu_seconds(proxy) if proxy else 0.0
    began = time.monotonic()
    for p in procs:
        p.start()
    results = [queue.get(timeout=seconds + 60) for _ in procs]
    elapsed = time.monotonic() - began
    spent = cpu_seconds(proxy) - before if proxy else 0.0
    for p in procs:
        p.join(10)
    done = sum(r[0] for r in results)
    wrong, failed = sum(r[1] for r in results), sum(r[2] for r in results)
    if wrong or failed or not done:
        raise RuntimeError(
            f"{done} connections, {wrong} answered by the wrong backend, {failed} failed"
        )
    return Rate(
        per_s=done / elapsed, per_cpu_s=done / spent if spent else float("nan"), cpu_s=spent
    )


@dataclass
class Flow:
    gbit_s: float
    cpu_s_per_gib: float  # the proxy's (nan direct)


def tls_download(port: int, cafile: Path, size: int, repeat: int, proxy: int | None) -> Flow:
    """curl fetching the file ``repeat`` times over one TLS connection with SNI BULK."""
    url = f"https://{BULK}:{port}/blob"
    argv = ["curl", "-sS", "--fail", "--cacert", str(cafile), "--tlsv1.3"]
    argv += ["--resolve", f"{BULK}:{port}:127.0.0.1", "-w", "%{size_download}\\n"]
    argv += ["-o", "/dev/null", url] * repeat  # an -o per URL, or the rest go to stdout
    before = cpu_seconds(proxy) if proxy else 0.0
    began = time.monotonic()
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, check=False)
    elapsed = time.monotonic() - began
    spent = cpu_seconds(proxy) - before if proxy else 0.0
    got = sum(int(x) for x in done.stdout.split())
    if done.returncode != 0 or got != size * repeat:
        raise RuntimeError(
            f"curl via :{port}: {got} of {size * repeat} bytes: {done.stderr[-400:]}"
        )
    return Flow(got * 8 / elapsed / 1e9, spent / (got / 2**30) if proxy else float("nan"))


def iperf3(port: int, seconds: float, proxy: int | None) -> Flow:
    """One iperf3 single-stream run (client to server) through ``port``."""
    argv = ["iperf3", "-c", "127.0.0.1", "-p", str(port), "-J"]
    argv += ["-t", str(max(1, round(seconds)))] if seconds >= 1 else ["-n", "64M"]
    for _ in range(20):
        before = cpu_seconds(proxy) if proxy else 0.0
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=seconds + 60, check=False
        )
        spent = cpu_seconds(proxy) - before if proxy else 0.0
        # iperf3's server runs one test at a time and may still be closing the last one.
        if "server is busy" not in done.stdout:
            break
        time.sleep(0.25)
    try:
        report = json.loads(done.stdout)
        received = report["end"]["sum_received"]
    except (ValueError, KeyError) as exc:
        raise RuntimeError(f"iperf3 via :{port} failed: {done.stdout[-400:]}{done.stderr}") from exc
    moved = received["bytes"]
    if not moved:
        raise RuntimeError(f"iperf3 via :{port} moved 0 bytes: {report.get('error')}")
    return Flow(
        received["bits_per_second"] / 1e9, spent / (moved / 2**30) if proxy else float("nan")
    )


# -- profiling -------------------------------------------------------------------------------------


@contextlib.contextmanager
def profiled(pid: int, target: Path | None) -> Iterator[None]:
    """py-spy recording ``pid`` (the gateway's serving process) while the block runs; native
    frames included, so time in uvloop's C code and in system calls is seen for what it is."""
    if target is None:
        yield
        return
    argv = ["py-spy", "record", "-p", str(pid), "-o", str(target), "-f", "raw", "-r", "200"]
    spy = subprocess.Popen([*argv, "--native"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    time.sleep(0.5)
    try:
        yield
    finally:
        spy.send_signal(signal.SIGINT)  # py-spy writes what it has and exits
        try:
            spy.wait(30)
        except subprocess.TimeoutExpired:
            spy.kill()
            spy.wait()
        leaves, ours = top_frames(target)
        print(f"  py-spy: {target} (busy samples only: the loop's epoll wait left out)")
        for frame, share in leaves:
            print(f"    {share:5.1f}%  {frame}")
        print("  including callees, meshctl's own functions:")
        for frame, share in ours:
            print(f"    {share:5.1f}%  {frame}")


def top_frames(path: Path, n: int = 10) -> tuple[list[tuple[str, float]], list[tuple[str, float]]]:
    """From a py-spy ``raw`` file (collapsed stacks), busy samples only (a stack whose leaf is
    the event loop's epoll wait is idle): the leaf frames with the most samples, and the
    functions of meshctl and its plugins with the most samples including their callees."""
    leaves: Counter[str] = Counter()
    ours: Counter[str] = Counter()
    total = 0
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            stack, _, samples = line.rpartition(" ")
            frames = stack.split(";")
            if not samples.isdigit() or frames[-1].startswith("epoll"):
                continue
            leaves[frames[-1]] += int(samples)
            for frame in set(frames):
                if "plugins/" in frame or ("meshctl/" in frame and "entry.py" not in frame):
                    ours[frame] += int(samples)
            total += int(samples)
    if not total:
        return [], []

    def shares(counts: Counter[str]) -> list[tuple[str, float]]:
        return [(frame, 100 * c / total) for frame, c in counts.most_common(n)]

    return shares(leaves), shares(ours)


def worker_pid(supervisor: int) -> int:
    """The process that serves the connections: the supervisor's only child that is a gateway
    worker, or the supervisor itself."""
    with contextlib.suppress(OSError):
        for task in Path(f"/proc/{supervisor}/task").iterdir():
            for kid in (task / "children").read_text().split():
                cmdline = Path(f"/proc/{kid}/cmdline").read_bytes()
                if b"gateway" in cmdline:
                    return int(kid)
    return supervisor


# -- the run ---------------------------------------------------------------------------------------


def _missing_tools() -> list[str]:
    missing = [t for t in ("iperf3", "curl") if shutil.which(t) is None]
    if not Path(NGINX).exists():
        missing.append("nginx (nginx-light)")
    if not STREAM_MODULE.exists():
        missing.append(f"{STREAM_MODULE} (libnginx-mod-stream)")
    return missing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--clients", type=int, default=4, help="connection client processes")
    parser.add_argument("--blob-mib", type=int, default=256, help="the downloaded file's size")
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--profile", type=Path, help="write py-spy collapsed stacks here")
    args = parser.parse_args()
    seconds = 0.5 if args.smoke else args.seconds
    # Smoke still moves enough for the proxies' CPU time to pass a clock tick (10 ms).
    blob = (64 if args.smoke else args.blob_mib) << 20
    repeat = 1 if args.smoke else 4
    missing = _missing_tools()
    if missing:
        print(f"bench_gateway_passthrough: not installed: {', '.join(missing)}")
        return 1
    if args.profile is not None:
        if shutil.which("py-spy") is None:
            sys.exit("--profile needs py-spy (pip install py-spy)")
        args.profile.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="bench-passthrough-") as tmp:
        work = Path(tmp)
        certs = certificates(work)
        cafile = work / "backends.pem"
        cafile.write_bytes(b"".join(crt.read_bytes() for crt, _ in certs.values()))
        (work / "www").mkdir()
        with (work / "www" / "blob").open("wb") as f:
            block = os.urandom(1 << 20)  # incompressible; TLS does not compress anyway
            for _ in range(blob >> 20):
                f.write(block)
        answer = {name: free_port() for name in NAMES}
        https, iperf_port = free_port(), free_port()
        routes = {**answer, BULK: https}
        nginx_tls, nginx_tcp = free_port(), free_port()
        offset = port_offset()
        gw_tls, gw_tcp = TLS_LISTENER + offset, TCP_LISTENER + offset
        gateway_argv = [
            *meshctl(),
            "gateway",
            "run",
            "-f",
            str(gateway_conf(work, routes, iperf_port)),
            "--gateway",
            "bench/bench",
            "--bind-address",
            "127.0.0.1",
            "--port-offset",
            str(offset),
            *os.environ.get("BENCH_GATEWAY_ARGS", "").split(),
        ]
        backend = backend_conf(work, certs, answer, https)
        proxy_conf = nginx_proxy_conf(work, nginx_tls, nginx_tcp, routes, iperf_port)
        with (
            process([NGINX, "-c", str(backend), "-p", str(work)], https, work / "backend.log"),
            process(["iperf3", "-s", "-B", "127.0.0.1", "-p", str(iperf_port)], iperf_port,
                    work / "iperf3.log"),
            process([NGINX, "-c", str(proxy_conf), "-p", str(work)], nginx_tls,
                    work / "nginx.log") as nginx_pid,
            process(gateway_argv, gw_tls, work / "gateway.log") as gateway_pid,
        ):  # fmt: skip
            wait_ready(15021 + offset)
            proxies = Proxies(nginx_tls, nginx_tcp, nginx_pid, gw_tls, gw_tcp, gateway_pid)
            conns = _measure_connections(args, seconds, cafile, answer, proxies)
            download = _measure_download(args, cafile, blob, repeat, https, proxies)
            stream = _measure_iperf(args, seconds, iperf_port, proxies)
    figures = report(
        [
            ("TLS connections", "conn/s", conns),
            ("TLS download", "Gbit/s", download),
            ("TCP iperf3", "Gbit/s", stream),
        ]
    )
    if args.smoke:
        return figures_produced(figures)
    return 0


def report(rows: list[tuple[str, str, Row]]) -> dict[str, float | None]:
    """The table, each test's gateway/nginx ratios beside its target; the figures by name."""
    figures: dict[str, float | None] = {}
    print(f"{'test':<16} {'way':<8} {'rate':>10} {'unit':<7} {'proxy cost':>14}")
    for label, unit, result in rows:
        for way in ("direct", "nginx", "gateway"):
            rate, cost, cost_unit = result[way]
            cost_text = "" if math.isnan(cost) else f"{cost:.0f} {cost_unit}"
            print(f"{label:<16} {way:<8} {rate:>10.2f} {unit:<7} {cost_text:>14}")
        g, n = result["gateway"], result["nginx"]
        ratio_rate, ratio_cost = _ratio(g[0], n[0]), _ratio(g[1], n[1])
        if unit == "conn/s":
            target = f"per CPU-s x{ratio_cost:.2f} (target >= {TARGETS['conns_per_cpu_s']})"
            figures["conns_per_cpu_s_ratio"] = ratio_cost
            figures["gateway_conns_per_cpu_s"] = g[1]
            figures["nginx_conns_per_cpu_s"] = n[1]
        else:
            # CPU per GiB: lower is better, so nginx's over ours reads like the other ratios.
            target = (
                f"throughput x{ratio_rate:.2f} (target >= {TARGETS['throughput']}), "
                f"CPU per GiB x{ratio_cost:.2f} nginx's"
            )
            key = label.split()[0].lower()
            figures[f"{key}_throughput_ratio"] = ratio_rate
            figures[f"gateway_{key}_gbit_s"] = g[0]
            figures[f"nginx_{key}_gbit_s"] = n[0]
        print(f"{label:<16} gateway/nginx: rate x{ratio_rate:.2f}, {target}")
    return figures


def _ratio(ours: float, theirs: float) -> float:
    return ours / theirs if theirs else float("nan")


def _profile_path(args: argparse.Namespace, name: str) -> Path | None:
    return args.profile / f"{name}.txt" if args.profile is not None else None


@dataclass(frozen=True)
class Proxies:
    nginx_tls: int
    nginx_tcp: int
    nginx_pid: int
    gw_tls: int
    gw_tcp: int
    gateway_pid: int


Row = dict[str, tuple[float, float, str]]  # way -> (rate, the proxy's cost, the cost's unit)


def _measure_connections(
    args: argparse.Namespace, seconds: float, cafile: Path, answer: dict[str, int], p: Proxies
) -> Row:
    direct = connections(answer, cafile, seconds, args.clients, None)
    nginx = connections(p.nginx_tls, cafile, seconds, args.clients, p.nginx_pid)
    with profiled(worker_pid(p.gateway_pid), _profile_path(args, "connections")):
        gateway = connections(p.gw_tls, cafile, seconds, args.clients, p.gateway_pid)
    return {
        "direct": (direct.per_s, float("nan"), ""),
        "nginx": (nginx.per_s, nginx.per_cpu_s, "per CPU-s"),
        "gateway": (gateway.per_s, gateway.per_cpu_s, "per CPU-s"),
    }


def _measure_download(
    args: argparse.Namespace, cafile: Path, blob: int, repeat: int, https: int, p: Proxies
) -> Row:
    direct = tls_download(https, cafile, blob, repeat, None)
    nginx = tls_download(p.nginx_tls, cafile, blob, repeat, p.nginx_pid)
    with profiled(worker_pid(p.gateway_pid), _profile_path(args, "download")):
        gateway = tls_download(p.gw_tls, cafile, blob, repeat, p.gateway_pid)
    return _flows(direct, nginx, gateway)


def _measure_iperf(args: argparse.Namespace, seconds: float, iperf_port: int, p: Proxies) -> Row:
    direct = iperf3(iperf_port, seconds, None)
    nginx = iperf3(p.nginx_tcp, seconds, p.nginx_pid)
    with profiled(worker_pid(p.gateway_pid), _profile_path(args, "iperf3")):
        gateway = iperf3(p.gw_tcp, seconds, p.gateway_pid)
    return _flows(direct, nginx, gateway)


def _flows(direct: Flow, nginx: Flow, gateway: Flow) -> Row:
    return {
        "direct": (direct.gbit_s, float("nan"), ""),
        "nginx": (nginx.gbit_s, nginx.cpu_s_per_gib * 1000, "CPU-ms/GiB"),
        "gateway": (gateway.gbit_s, gateway.cpu_s_per_gib * 1000, "CPU-ms/GiB"),
    }


if __name__ == "__main__":
    sys.exit(main())
