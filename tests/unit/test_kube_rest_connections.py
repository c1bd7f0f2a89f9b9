"""The stdlib API reader keeps its connection to the API server alive between GETs, and copes
with the server closing it; answers are size-bounded. Against a real local HTTP/1.1 server."""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator

import pytest

from meshctl.kube import rest


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True

    def __init__(self) -> None:
        super().__init__(("127.0.0.1", 0), _Handler)
        self.connections = 0
        self.close_after_answer = False
        self.body_size = 0


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the API server speaks
    server: _Server

    def setup(self) -> None:
        super().setup()
        self.server.connections += 1

    def do_GET(self) -> None:
        body = json.dumps({"path": self.path, "pad": "x" * self.server.body_size}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
        if self.server.close_after_answer:  # an idle connection the server drops
            self.close_connection = True

    def log_message(self, *_args: object) -> None:
        pass


@pytest.fixture
def server() -> Iterator[_Server]:
    srv = _Server()
    thread = threading.Thread(target=srv.serve_forever, daemon=True)
    thread.start()
    yield srv
    srv.shutdown()
    srv.server_close()


def _config(srv: _Server) -> rest.RestConfig:
    return rest.RestConfig(server=f"http://127.0.0.1:{srv.server_address[1]}", source="test")


def test_later_gets_reuse_the_first_connection(server):
    config = _config(server)
    for name in ("a", "b", "c"):
        assert rest.get_json(config, f"/api/v1/namespaces/{name}", timeout=5)["path"].endswith(name)
    assert server.connections == 1


def test_a_connection_the_server_closed_is_replaced_without_an_error(server):
    config = _config(server)
    server.close_after_answer = True
    for name in ("a", "b", "c"):
        assert rest.get_json(config, f"/x/{name}", timeout=5)["path"] == f"/x/{name}"
    assert server.connections == 3


def test_an_oversized_answer_is_refused(server):
    server.body_size = rest.MAX_BODY_BYTES + 10
    with pytest.raises(rest.ApiStatusError, match="sent more than"):
        rest.get_json(_config(server), "/big", timeout=5)
    server.body_size = 0
    assert rest.get_json(_config(server), "/small", timeout=5)["path"] == "/small"
