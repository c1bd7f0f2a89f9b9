"""Port forwarding runs on a client of its own: kubernetes' ``stream()`` swaps its client's
``call_api`` while it connects, and two forwards at once on a shared client (``verify --proxy``
checks pods in parallel) could leave one's websocket transport on it."""

from __future__ import annotations

import socket
from typing import Any

import kubernetes.stream
from kubernetes import client

from meshctl.kube import portforward
from meshctl.kube.client import Kube


class _Forward:
    def __init__(self) -> None:
        self.a, self.b = socket.socketpair()

    def socket(self, port: int) -> socket.socket:
        return self.a

    def error(self, port: int) -> None:
        return None

    def close(self) -> None:
        self.a.close()
        self.b.close()


def test_each_forward_uses_its_own_client_with_the_shared_configuration(monkeypatch):
    shared = client.ApiClient(client.Configuration())
    kube = Kube(shared, "test", 5.0)
    used: list[Any] = []

    def fake_portforward(method: Any, *args: Any, **kwargs: Any) -> _Forward:
        used.append(method.__self__.api_client)
        return _Forward()

    monkeypatch.setattr(kubernetes.stream, "portforward", fake_portforward)
    for _ in range(2):
        with portforward.stream(kube, "ns", "pod", 15000):
            pass
    assert len(used) == 2
    assert all(c is not shared for c in used)
    assert used[0] is not used[1]
    assert all(c.configuration is shared.configuration for c in used)
