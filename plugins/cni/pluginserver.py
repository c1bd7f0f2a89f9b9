"""The node agent's endpoint for the CNI plugin: HTTP/1.1 on ``<run_dir>/pluginevent.sock``.

Owns the server side of what the plugin sends: ``/cni``, the whole CNI request from the thin
client (``meshctl_plugins.cni_plugin.client``; a raw route: the body is bytes), and Istio's
``/cmdadd`` / ``/cmddel`` JSON events (ambient mode): one request per connection, answered with
a status and a text. Invariants: only root can connect (mode 0600); a request line, headers or
body that is malformed, too large (64 KiB headers, 1 MiB body for a JSON route, ``raw_limit``
for a raw one) or too slow (10 s) gets 400 and the connection closes; a handler's failure is
the answer's text, never a crash of the agent.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeAlias, cast

from meshctl.structured import InputError, Limits, load_json

if TYPE_CHECKING:
    from meshctl.core.k8s.cni.messages import PluginEvent

log = logging.getLogger(__name__)

# A route's handler: the event (any JSON object, read as untrusted) -> (status, text).
Handler: TypeAlias = "Callable[[PluginEvent], Awaitable[tuple[int, str]]]"
# A raw route's handler: the body as it came -> (status, text).
RawHandler: TypeAlias = "Callable[[bytes], Awaitable[tuple[int, str]]]"
_MAX_BODY = 1024 * 1024
_LIMITS = Limits(max_bytes=_MAX_BODY)
_READ_TIMEOUT = 10.0
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 500: "Internal Server Error"}


class PluginServer:
    def __init__(
        self,
        path: str,
        routes: dict[str, Handler],
        raw_routes: dict[str, RawHandler] | None = None,
        *,
        raw_limit: int = _MAX_BODY,
        answer_timeout: float = _READ_TIMEOUT * 3,
    ) -> None:
        self.path = path
        self._routes = routes
        self._raw_routes = raw_routes or {}
        self._raw_limit = raw_limit
        self._answer_timeout = answer_timeout  # reading the request and handling it
        self._server: asyncio.Server | None = None

    async def start(self) -> None:
        path = Path(self.path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        self._server = await asyncio.start_unix_server(self._one, path=self.path, limit=65536)
        path.chmod(0o600)

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
            with contextlib.suppress(FileNotFoundError):
                Path(self.path).unlink()

    async def _one(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            status, text = await asyncio.wait_for(self._answer(reader), self._answer_timeout)
        except TimeoutError:
            status, text = 400, "request timed out"
        try:
            body = (text + "\n").encode()
            writer.write(
                f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
                f"Content-Type: text/plain\r\nContent-Length: {len(body)}\r\n"
                "Connection: close\r\n\r\n".encode()
                + body
            )
            await asyncio.wait_for(writer.drain(), _READ_TIMEOUT)
        except (OSError, TimeoutError):
            pass
        finally:
            writer.close()

    async def _answer(self, reader: asyncio.StreamReader) -> tuple[int, str]:  # noqa: PLR0911
        try:
            head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), _READ_TIMEOUT)
            method, target, _ = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ", 2)
            length = 0
            for line in head.split(b"\r\n")[1:]:
                name, _, value = line.decode("latin-1").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value.strip())
            limit = self._raw_limit if target in self._raw_routes else _MAX_BODY
            if not 0 <= length <= limit:
                return 400, f"body of {length} bytes refused (at most {limit})"
            data = await asyncio.wait_for(reader.readexactly(length), _READ_TIMEOUT)
        except (ValueError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError):
            return 400, "malformed request"
        except TimeoutError:
            return 400, "request timed out"
        raw = self._raw_routes.get(target)
        if raw is not None and method == "POST":
            try:
                return await raw(data)
            except Exception as exc:  # a bug must answer, not hang the plugin
                log.exception("plugin request %s failed", target)
                return 500, f"node agent failed: {type(exc).__name__}: {exc}"
        handler = self._routes.get(target)
        if handler is None or method != "POST":
            return 404, f"no {method} {target} here"
        try:
            event = load_json(data, "body", _LIMITS)
        except InputError as exc:
            return 400, f"body is not a usable JSON document: {exc.problem}"
        if not isinstance(event, dict):
            return 400, "body must be a JSON object"
        try:
            return await handler(cast("PluginEvent", event))
        except Exception as exc:  # a bug must answer, not hang the plugin
            log.exception("plugin event %s failed", target)
            return 500, f"node agent failed: {type(exc).__name__}: {exc}"
