"""meshctl.image.registry.Client against small loopback servers that misbehave in the ways real
registries and proxies do: every failure is one MeshctlError line saying whose fault it is."""

from __future__ import annotations

import contextlib
import http.server
import socket
import threading
from collections.abc import Iterator

import pytest

from meshctl.core.image.distribution import parse_reference
from meshctl.errors import MeshctlError
from meshctl.image.registry import Client, Settings


def _server(answers: dict[str, tuple[int, dict[str, str], bytes]]):
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, headers, body = answers.get(self.path.split("?")[0], (404, {}, b""))
            self.send_response(status)
            for name, value in headers.items():
                self.send_header(name, value)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:  # noqa: A002
            pass

    return Handler


@contextlib.contextmanager
def serving(answers: dict[str, tuple[int, dict[str, str], bytes]]) -> Iterator[str]:
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _server(answers))
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def _login(host: str, **settings: object) -> MeshctlError:
    client = Client(parse_reference(f"{host}/m:1"), Settings(**settings))  # type: ignore[arg-type]
    with pytest.raises(MeshctlError) as caught:
        client.login()
    return caught.value


def test_a_proxys_html_error_page_is_an_http_code_with_the_page_truncated():
    page = b"<html><body>" + b"bad gateway " * 100 + b"</body></html>"
    with serving({"/v2/": (502, {"Content-Type": "text/html"}, page)}) as host:
        error = _login(host, insecure=True)
    assert error.message.startswith(
        f"{host} refused access to its API: HTTP_502: Bad Gateway <html>"
    )
    assert len(error.message) < 300


def test_a_challenge_meshctl_cannot_answer_names_its_scheme():
    with serving({"/v2/": (401, {"WWW-Authenticate": 'Negotiate realm="x"'}, b"")}) as host:
        error = _login(host, insecure=True)
    assert "challenge schemes: negotiate" in error.message


def test_a_token_endpoint_that_answers_no_json_is_named():
    with (
        serving({"/token": (200, {}, b"<html>login</html>")}) as auth,
        serving(
            {
                "/v2/": (
                    401,
                    {"WWW-Authenticate": f'Bearer realm="http://{auth}/token",service="s"'},
                    b"",
                )
            }
        ) as host,
    ):
        error = _login(host, insecure=True)
    assert error.message.startswith(f"{host}'s token endpoint: the token endpoint answered no JSON")


def test_tls_to_a_plain_http_registry_says_to_pass_insecure():
    with serving({"/v2/": (200, {}, b"{}")}) as host:
        error = _login(host)
    assert error.message.startswith(f"TLS with {host} failed")
    assert "--insecure" in (error.hint or "")


def test_a_registry_that_is_not_there_is_unreachable_not_refusing():
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    error = _login(f"127.0.0.1:{port}", insecure=True)
    assert error.message.startswith(f"cannot reach the registry 127.0.0.1:{port}")
    assert "running" in (error.hint or "")
