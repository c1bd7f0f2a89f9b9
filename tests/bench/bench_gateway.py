"""Benchmark: the ingress gateway (``meshctl gateway run -f``) beside nginx and the backend direct.

Run: python -m tests.bench.bench_gateway [--smoke] [--requests N] [--clients C]

Same run, same 1 KiB backend (an uvloop responder), same client (h2load): HTTP/1.1 keep-alive to
the backend direct, through nginx (Debian's package: ``proxy_pass`` with ``keepalive``
upstreams, one worker) and through the gateway; HTTP/2 (h2c) through the gateway. Per path:
requests/s, mean and max request time (h2load's figures), the proxy's CPU-seconds (from
/proc) and requests per proxy CPU-second, its RSS at the end. Figures, not a gate. ``--smoke``:
tiny sizes, checks only that every figure was produced.
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.smoke import figures_produced  # noqa: E402 (after the path set-up)
from tests.harness import gateway as gw  # noqa: E402

BACKEND = """
import asyncio, sys, uvloop
BODY = b"x" * 1024
RESP = b"HTTP/1.1 200 OK\\r\\ncontent-length: 1024\\r\\ncontent-type: text/plain\\r\\n\\r\\n" + BODY
class P(asyncio.Protocol):
    def connection_made(self, t): self.t, self.buf = t, b""
    def data_received(self, d):
        self.buf += d
        while b"\\r\\n\\r\\n" in self.buf:
            _, self.buf = self.buf.split(b"\\r\\n\\r\\n", 1)
            self.t.write(RESP)
async def main():
    s = await asyncio.get_running_loop().create_server(P, "127.0.0.1", int(sys.argv[1]))
    print("ready", flush=True)
    await s.serve_forever()
uvloop.run(main())
"""

NGINX = """
worker_processes 1;
pid {tmp}/nginx.pid;
error_log {tmp}/nginx.err;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  client_body_temp_path {tmp}/body; proxy_temp_path {tmp}/proxy;
  fastcgi_temp_path {tmp}/fcgi; uwsgi_temp_path {tmp}/uwsgi; scgi_temp_path {tmp}/scgi;
  upstream backend {{ server 127.0.0.1:{backend}; keepalive 64; }}
  server {{
    listen 127.0.0.1:{port};
    location / {{
      proxy_pass http://backend; proxy_http_version 1.1; proxy_set_header Connection "";
    }}
  }}
}}
"""


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _h2load(url: str, requests: int, clients: int, *, h1: bool) -> dict[str, float]:
    argv = ["h2load", "-n", str(requests), "-c", str(clients), "-t", "1"]
    argv += ["--h1"] if h1 else ["-m", "10"]
    out = subprocess.run(
        [*argv, url], capture_output=True, text=True, timeout=600, check=False
    ).stdout
    rps = float(re.search(r"finished in [\d.]+m?s, ([\d.]+) req/s", out).group(1))  # type: ignore[union-attr]
    ok = int(re.search(r"(\d+) succeeded", out).group(1))  # type: ignore[union-attr]
    line = re.search(r"time for request:\s+(\S+)\s+(\S+)\s+(\S+)", out)
    assert line is not None, out
    assert ok == requests, out
    return {"rps": rps, "mean_ms": _ms(line.group(3)), "max_ms": _ms(line.group(2))}


def _ms(text: str) -> float:
    if text.endswith("us"):
        return float(text[:-2]) / 1000
    if text.endswith("ms"):
        return float(text[:-2])
    return float(text[:-1]) * 1000


def _measure(name: str, url: str, pid: int | None, args: argparse.Namespace, *, h1: bool = True):
    before = _cpu_seconds(pid) if pid else 0.0
    figures = _h2load(url, args.requests, args.clients, h1=h1)
    if pid:
        cpu = _cpu_seconds(pid) - before
        figures["cpu_s"] = cpu
        figures["rps_per_cpu_s"] = args.requests / cpu if cpu else float("inf")
        figures["rss_mb"] = _rss_mb(pid)
    print(f"{name:<22} " + "  ".join(f"{k} {v:,.2f}" for k, v in figures.items()))
    return {f"{name}.{k}": v for k, v in figures.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true", help="tiny run for CI")
    parser.add_argument("--requests", type=int, default=50_000)
    parser.add_argument("--clients", type=int, default=10)
    args = parser.parse_args()
    if args.smoke:
        # enough for the proxies' CPU time to be above the clock tick (10 ms) in every path
        args.requests, args.clients = 5000, 2
    if shutil.which("h2load") is None:
        print("needs h2load (nghttp2-client)")
        return 1
    tmp = Path(tempfile.mkdtemp(prefix="bench-gateway-"))
    procs: list[subprocess.Popen[bytes]] = []
    try:
        backend_port = _free_port()
        backend = subprocess.Popen(
            [sys.executable, "-c", BACKEND, str(backend_port)], stdout=subprocess.PIPE
        )
        procs.append(backend)
        assert backend.stdout is not None
        assert backend.stdout.readline().strip() == b"ready"
        objects = [
            gw.gateway_class(),
            gw.gateway(gw.http_listener()),
            gw.route("web", [gw.rule("/", "web:80")]),
            gw.service("web"),
            gw.endpoint_slice("web", [("127.0.0.1", True)], backend_port),
        ]
        config = tmp / "gateway.yaml"
        gw.write_objects(config, objects)
        offset = gw.free_offset((80,))
        gateway = subprocess.Popen(
            [
                *(sys.executable, "-m", "meshctl", "--log-level", "warning", "gateway", "run"),
                *("-f", str(config), "--bind-address", "127.0.0.1", "--port-offset", str(offset)),
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        procs.append(gateway)
        gw.wait_ready(15021 + offset, gateway, tmp / "none.log")  # type: ignore[arg-type]
        figures: dict[str, float] = {}
        direct = f"http://127.0.0.1:{backend_port}/"
        figures |= _measure("direct http/1.1", direct, None, args)
        nginx_pid = None
        if shutil.which("nginx"):
            port = _free_port()
            (tmp / "nginx.conf").write_text(NGINX.format(tmp=tmp, backend=backend_port, port=port))
            subprocess.run(["nginx", "-c", str(tmp / "nginx.conf")], check=True, timeout=30)
            time.sleep(0.5)
            master = int((tmp / "nginx.pid").read_text())
            children = subprocess.run(
                ["pgrep", "-P", str(master)], capture_output=True, text=True, check=False
            ).stdout.split()
            nginx_pid = int(children[0]) if children else master
            figures |= _measure("nginx http/1.1", f"http://127.0.0.1:{port}/", nginx_pid, args)
        url = f"http://127.0.0.1:{80 + offset}/"
        figures |= _measure("gateway http/1.1", url, gateway.pid, args)
        figures |= _measure("gateway h2c", url, gateway.pid, args, h1=False)
        if nginx_pid is not None:
            ratio = (
                figures["gateway http/1.1.rps_per_cpu_s"] / figures["nginx http/1.1.rps_per_cpu_s"]
            )
            print(f"gateway / nginx requests per CPU-second (HTTP/1.1): {ratio:.2f}")
            os.kill(int((tmp / "nginx.pid").read_text()), signal.SIGQUIT)
        if args.smoke:
            return figures_produced(figures)
        return 0
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
