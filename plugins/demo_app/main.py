"""The demo's workloads: a small HTTP server and a client that keeps calling it.

``meshctl demo-app server --port P --name N``: HTTP/1.1 on every address of its namespace; answers
``GET /any`` with 200 and ``hello from N: you asked /any``, so a caller can check the body came
through the mesh unchanged.
``meshctl demo-app client --url URL --stats FILE [--interval S]``: one new connection per request
(so the proxies' connection counters move), forever; writes its tally as JSON to FILE (atomically,
about once a second) for the demo's view.
Invariants: plain sockets and the standard library only (these stand in for the user's apps,
which know nothing of the mesh); a failed request is counted, never fatal; SIGTERM ends at once.
"""

from __future__ import annotations

import http.server
import json
import os
import signal
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any


class _Handler(http.server.BaseHTTPRequestHandler):
    server_version = "meshctl-demo"
    protocol_version = "HTTP/1.1"
    name = "server"

    def do_GET(self) -> None:
        body = f"hello from {self.name}: you asked {self.path}\n".encode()
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 -- the base's name
        """Quiet: the demo's view shows traffic from the proxies' metrics."""


def serve(port: int, name: str) -> int:
    handler = type("Handler", (_Handler,), {"name": name})
    server = http.server.ThreadingHTTPServer(("0.0.0.0", port), handler)  # noqa: S104 -- a pod
    server.daemon_threads = True
    server.serve_forever()
    return 0


def client(url: str, stats: Path, interval: float) -> int:
    ok = failed = 0
    last_error = ""
    written = 0.0
    while True:
        try:
            with urllib.request.urlopen(url, timeout=3) as reply:  # noqa: S310 -- our http URL
                reply.read()
            ok += 1
        except (OSError, urllib.error.URLError) as exc:
            failed += 1
            last_error = str(exc)[:200]
        now = time.monotonic()
        if now - written >= 1.0:
            tmp = stats.with_suffix(".tmp")
            tally = {"ok": ok, "failed": failed, "last_error": last_error, "time": time.time()}
            tmp.write_text(json.dumps(tally))
            tmp.replace(stats)
            written = now
        time.sleep(interval)


def _option(argv: list[str], name: str, default: str | None = None) -> str:
    if name in argv and argv.index(name) + 1 < len(argv):
        return argv[argv.index(name) + 1]
    if default is None:
        raise SystemExit(f"Error: demo-app: {name} is required")
    return default


def main(argv: list[str]) -> int:
    """Entry point of the raw plugin ``demo-app``."""
    signal.signal(signal.SIGTERM, lambda *_: os._exit(0))
    role = argv[0] if argv else ""
    try:
        if role == "server":
            return serve(int(_option(argv, "--port")), _option(argv, "--name", "server"))
        if role == "client":
            return client(
                _option(argv, "--url"),
                Path(_option(argv, "--stats")),
                float(_option(argv, "--interval", "0.2")),
            )
    except KeyboardInterrupt:
        return 0
    except ValueError as exc:
        sys.stderr.write(f"Error: demo-app: {exc}\n")
        return 2
    sys.stderr.write("Error: demo-app: give 'server' or 'client'\n")
    return 2
