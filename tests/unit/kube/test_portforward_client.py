"""Port forwarding reads at most its limit, and never touches the shared client: the kubernetes
package's stream swaps its client's ``call_api`` while it connects, so two forwards at once on
one client (bug-report dumps several proxies in parallel) could leave it swapped for every later
call."""

from __future__ import annotations

import contextlib
import functools
import importlib
import socket
import threading
from typing import Any

import pytest
from kubernetes import client as k8s
from kubernetes import stream
from kubernetes.client.exceptions import ApiException

from meshctl.errors import KubeError
from meshctl.kube import portforward
from meshctl.kube.client import Kube


def test_a_forward_connects_on_a_client_of_its_own(monkeypatch: pytest.MonkeyPatch):
    shared = k8s.ApiClient(k8s.Configuration(host="https://127.0.0.1:1"))
    original = shared.call_api
    seen: list[Any] = []

    def connect(configuration: Any, *args: Any, **kwargs: Any) -> Any:
        seen.append(shared.call_api)  # what another thread using the shared client would get
        raise ApiException(status=0, reason="no kubelet here")

    # The package's own wrapper (its module is shadowed by its ``stream`` function).
    wrapper = importlib.import_module("kubernetes.stream.stream")._websocket_request
    forward = functools.partial(wrapper, connect, {"_preload_content": False})
    monkeypatch.setattr(stream, "portforward", forward)
    kube = Kube(shared, "test", 5.0)
    with pytest.raises(KubeError, match="port-forward to pod ns/p port 15000"):
        portforward.http_get(kube, "ns", "p", 15000, "/config_dump")
    assert seen == [original]
    assert shared.call_api == original


def test_reading_stops_at_the_limit(monkeypatch: pytest.MonkeyPatch):
    ours, theirs = socket.socketpair()
    body = b"x" * 1_000_000
    answer = b"HTTP/1.0 200 OK\r\n\r\n" + body

    def serve() -> None:
        theirs.recv(4096)
        with contextlib.suppress(OSError):
            theirs.sendall(answer)  # more than is read: the reader stops and closes
        theirs.close()

    server = threading.Thread(target=serve)
    server.start()

    @contextlib.contextmanager
    def fake_stream(*args: Any) -> Any:
        try:
            yield ours
        finally:
            ours.close()

    monkeypatch.setattr(portforward, "stream", fake_stream)
    status, got = portforward.http_get(object(), "ns", "p", 15000, "/", limit=100_000)  # type: ignore[arg-type]
    server.join(10)
    assert status == 200
    assert len(got) == 100_000 - len(b"HTTP/1.0 200 OK\r\n\r\n")
