"""The plain-HTTP ports: readiness ``/ready`` (8080, as istiod) and metrics ``/metrics`` (15014).

Owns two tiny ASGI apps. Invariants: ``/ready`` answers 200 only when every part reports ready
and the process is not draining, else 503 with the reasons as text; ``/metrics`` renders the
process's own registry; any other path is 404; nothing here reads a request body.
"""

from __future__ import annotations

from collections.abc import Callable

from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope
from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest

from meshctl.webhook import lifespan


async def _answer(send: ASGISendCallable, status: int, content_type: str, body: bytes) -> None:
    headers = [
        (b"content-type", content_type.encode()),
        (b"content-length", str(len(body)).encode()),
    ]
    await send({"type": "http.response.start", "status": status, "headers": headers})
    await send({"type": "http.response.body", "body": body, "more_body": False})


class _PlainApp:
    """An app answering GET on fixed paths (``paths``) with ``answer()``, 404 elsewhere."""

    paths: tuple[str, ...] = ()

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        if scope["path"] not in self.paths:
            await _answer(send, 404, "text/plain", b"not found\n")
            return
        await _answer(send, *self.answer())

    def answer(self) -> tuple[int, str, bytes]:
        raise NotImplementedError


class ReadinessApp(_PlainApp):
    """``GET /ready``: 200 ``ready`` or 503 with what is missing (``not_ready()``)."""

    paths = ("/ready",)

    def __init__(self, not_ready: Callable[[], list[str]]) -> None:
        self._not_ready = not_ready

    def answer(self) -> tuple[int, str, bytes]:
        reasons = self._not_ready()
        if reasons:
            text = "not ready: " + "; ".join(reasons) + "\n"
            return 503, "text/plain; charset=utf-8", text.encode()
        return 200, "text/plain", b"ready\n"


class MetricsApp(_PlainApp):
    """``GET /metrics``: the Prometheus text exposition of ``registry``."""

    paths = ("/metrics", "/stats/prometheus")

    def __init__(self, registry: CollectorRegistry) -> None:
        self._registry = registry

    def answer(self) -> tuple[int, str, bytes]:
        return 200, CONTENT_TYPE_LATEST, generate_latest(self._registry)
