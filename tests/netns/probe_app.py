"""A pod's app for the probe tests: HTTP on one port, a bare TCP listener on another, and a
gRPC health service (grpcio's server) on a third, until killed.

``python -m tests.netns.probe_app HTTP_PORT TCP_PORT GRPC_PORT`` prints ``ready`` once all three
listen. HTTP ``/healthz`` answers 200 and ``/metrics`` has ``app_orders_total 7``; the gRPC
health service reports SERVING for "".
"""

from __future__ import annotations

import http.server
import socket
import sys
import threading
from concurrent import futures
from typing import Any

import grpc

from meshctl.proto import health_pb2

METRICS = b"# TYPE app_orders_total counter\napp_orders_total 7\n"


class _Http(http.server.BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body = METRICS if self.path == "/metrics" else b""
        self.send_response(200 if self.path in ("/healthz", "/metrics") else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


def _check(request: health_pb2.HealthCheckRequest, context: Any) -> Any:
    if request.service:
        context.abort(grpc.StatusCode.NOT_FOUND, "unknown service")
    return health_pb2.HealthCheckResponse(status=health_pb2.HealthCheckResponse.SERVING)


def main(http_port: int, tcp_port: int, grpc_port: int) -> None:
    web = http.server.ThreadingHTTPServer(("0.0.0.0", http_port), _Http)  # noqa: S104 (a pod's app)
    threading.Thread(target=web.serve_forever, daemon=True).start()
    tcp = socket.create_server(("0.0.0.0", tcp_port))  # noqa: S104

    def accept() -> None:
        while True:
            conn, _ = tcp.accept()
            conn.close()

    threading.Thread(target=accept, daemon=True).start()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=2))
    handler = grpc.method_handlers_generic_handler(
        "grpc.health.v1.Health",
        {
            "Check": grpc.unary_unary_rpc_method_handler(
                _check,
                request_deserializer=health_pb2.HealthCheckRequest.FromString,
                response_serializer=health_pb2.HealthCheckResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((handler,))
    server.add_insecure_port(f"0.0.0.0:{grpc_port}")
    server.start()
    print("ready", flush=True)
    server.wait_for_termination()


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:4]))
