"""The agent's ``/cni`` route: the thin client's whole CNI request, served in this process.

Owns the request's wire form (``meshctl_plugins.cni_plugin.client`` writes it: each forwarded
``NAME=VALUE`` NUL-terminated, one more NUL, then the config exactly as the runtime piped it)
and the answer's (``<exit code>\\n<stdout>``), and where the work runs: each request on a worker
thread (it waits on the API server), its kernel steps on the agent's one kernel thread.
Invariants: a body that is not in that form is refused (400) without serving anything; the
records of ``meshctl.cni`` also go to ``<run_dir>/meshctl-cni.log`` (JSON lines, rotated at
10 MB as istio-cni's), where they were before the plugin became a client.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import logging.handlers
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshctl.core.k8s.cni.spec import LOG_NAME
from meshctl.logs import JsonFormatter

from .cnirequest import AgentUnavailableError, Context, KernelRunner, serve

if TYPE_CHECKING:
    from meshctl.core.k8s.cni.messages import PluginEvent

    from .pluginserver import Handler

log = logging.getLogger(__name__)
MAX_LOG_BYTES = 10 * 1024 * 1024
# The config's own limit (MESHCTL_MAX_INPUT_BYTES, 32 MiB by default) is checked by the request
# parser, with its error; the route only bounds what it holds.
MAX_REQUEST = 64 * 1024 * 1024 + 65536
ANSWER_TIMEOUT = 100.0  # a request's own bounds (pod lookup, ambient enrollment) end sooner
WORKERS = 8  # requests at once (each mostly waits on the API server or the kernel thread)


def decode(body: bytes) -> tuple[dict[str, str], bytes]:
    """The forwarded environment and the stdin of a ``/cni`` body; ``ValueError`` if malformed."""
    env: dict[str, str] = {}
    i = 0
    while True:
        end = body.find(b"\0", i)
        if end < 0:
            raise ValueError("the environment block is not terminated")
        if end == i:
            return env, body[end + 1 :]
        name, sep, value = os.fsdecode(body[i:end]).partition("=")
        if not sep or not name:
            raise ValueError(f"{body[i:end][:60]!r} is not NAME=VALUE")
        env[name] = value
        i = end + 1


class CniRequests:
    """The ``/cni`` route of one agent: ``start`` before serving, ``close`` after."""

    def __init__(
        self,
        run_dir: str,
        *,
        kernel: Callable[[Callable[[], Any]], Any] | None = None,
        ambient: dict[str, Handler] | None = None,
        log_level: str = "info",
        netns_dir: str = "",
    ) -> None:
        """``kernel``: runs a kernel step on the agent's kernel thread (default: a thread of
        its own); ``ambient``: the ambient agent's ``/cmdadd`` and ``/cmddel`` handlers (None:
        not in ambient mode, and a config asking for it fails closed); ``netns_dir``: where
        the runtime's netns files appear here ("" : everywhere, the agent runs on the host)."""
        self._run_dir = Path(run_dir)
        self._own_kernel: concurrent.futures.ThreadPoolExecutor | None = None
        if kernel is None:
            pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="cni-kernel")
            self._own_kernel = pool

            def kernel(fn: Callable[[], Any]) -> Any:
                return pool.submit(fn).result()

        self._kernel = KernelRunner(kernel)
        self._ambient = ambient
        self._level = log_level
        self._netns_dir = netns_dir
        self._pool = concurrent.futures.ThreadPoolExecutor(WORKERS, thread_name_prefix="cni")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._file: logging.Handler | None = None

    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        try:
            self._run_dir.mkdir(parents=True, exist_ok=True)
            handler = logging.handlers.RotatingFileHandler(
                self._run_dir / LOG_NAME, maxBytes=MAX_LOG_BYTES, backupCount=1, encoding="utf-8"
            )
        except OSError as exc:
            log.warning("plugin log %s unavailable: %s", self._run_dir / LOG_NAME, exc.strerror)
            return
        handler.setFormatter(JsonFormatter())
        handler.setLevel(self._level.upper())
        plugin_log = logging.getLogger("meshctl.cni")
        plugin_log.addHandler(handler)
        if plugin_log.getEffectiveLevel() > handler.level:
            plugin_log.setLevel(handler.level)
        self._file = handler

    def close(self) -> None:
        if self._file is not None:
            logging.getLogger("meshctl.cni").removeHandler(self._file)
            self._file.close()
            self._file = None
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self._own_kernel is not None:
            self._own_kernel.shutdown(wait=False, cancel_futures=True)

    async def handle(self, body: bytes) -> tuple[int, str]:
        """The route: 200 with ``<exit code>\\n<stdout>``, or 400 for a malformed body."""
        try:
            env, stdin = decode(body)
        except ValueError as exc:
            return 400, f"malformed CNI request: {exc}"
        context = Context(kernel=self._kernel, agent=self._call_agent, netns_dir=self._netns_dir)
        loop = asyncio.get_running_loop()
        answer = await loop.run_in_executor(self._pool, serve, env, stdin, context)
        return 200, f"{answer.code}\n{answer.stdout}"

    def _call_agent(self, route: str, event: PluginEvent, timeout: float) -> str:
        """From a worker thread: the ambient agent's answer to ``event`` on ``route``."""
        handler = (self._ambient or {}).get(route)
        if handler is None or self._loop is None:
            raise AgentUnavailableError(
                "this node agent does not run in ambient mode (meshctl cni install --ambient)"
            )
        call: Awaitable[tuple[int, str]] = handler(event)
        future = asyncio.run_coroutine_threadsafe(_as_coroutine(call), self._loop)
        try:
            status, text = future.result(timeout)
        except concurrent.futures.TimeoutError as exc:
            future.cancel()
            raise AgentUnavailableError(
                f"the ambient agent did not answer in {timeout:g}s"
            ) from exc
        if status != 200:
            raise AgentUnavailableError(f"the ambient agent answered {status}: {text}")
        return text


async def _as_coroutine(call: Awaitable[tuple[int, str]]) -> tuple[int, str]:
    return await call
