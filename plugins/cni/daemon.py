"""``meshctl cni install`` as a node agent: install, watch and repair, readiness, clean up on exit.

Invariants:
- The node's files are polled (``poll_interval``), so any rewrite by another agent, a removed
  binary or a rotated token is noticed within one interval and repaired; repairs are rate-limited
  (a token bucket) and a component that keeps undoing them is named in a warning with a hint.
- ``/readyz`` answers 200 only while the runtime's config includes us (``Installer.status``);
  ``/healthz`` answers 200 while the loop runs; ``/status`` is JSON for ``meshctl verify``
  (ready, reason, repairs within the conflict window; in ambient mode each pod's enrollment and
  the agent's health, ``?dry-run=1`` with a dry-run enrollment); ``/debug/conflist`` is the
  node's CNI config files as the agent reads them (read-only, for ``meshctl bug-report``).
  Every read has a timeout.
- SIGTERM or SIGINT: stop watching, then ``Installer.cleanup`` (the node's config as it was);
  in ambient mode, when the agent's DaemonSet is going away (an uninstall), every pod is
  released first (``AmbientAgent.release_all``), so running pods keep working unmeshed.
- The CNI plugin is a thin client of this agent: every CNI request arrives whole on
  ``<run_dir>/pluginevent.sock`` (``/cni``) and is served here (``requestroute.py``), in every
  mode; the socket is bound before the plugin is chained into the node's config, so a runtime
  never runs a plugin with no agent to answer it (but across a restart, which the client waits
  out within its bound). Records of older plugins on ``<run_dir>/log.sock`` are re-logged here.
- Ambient mode (``--ambient``): the node agent runs beside the installer (``ambient.py``): the
  ambient routes of the same socket, the ZDS server for the node proxy, the pod and namespace
  watches (or ``--local-inventory``: no API server); ``/readyz`` also waits for their first
  sync.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import logging
import socket
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from meshctl import logs
from meshctl.core.k8s.cni.spec import LOG_SOCKET_NAME, PLUGIN_EVENT_SOCKET_NAME
from meshctl.errors import MeshctlError, PortInUseError, listen_failed
from meshctl.net.sockets import address_text
from meshctl.shutdown import StopSignals
from meshctl.structured import InputError, load_json

from .health import AgentStatus
from .installer import ConfReport, Installer, InstallSettings, Status
from .pluginserver import Handler, PluginServer
from .requestroute import ANSWER_TIMEOUT, MAX_REQUEST, CniRequests

if TYPE_CHECKING:
    from collections.abc import Callable

    from .ambient import AmbientAgent

log = logging.getLogger(__name__)
WHAT = "CNI node agent"  # how the listening and ready lines name this daemon
plugin_log = logging.getLogger("meshctl.cni.plugin")

CONFLICT_WINDOW = 60.0  # seconds
CONFLICT_REPAIRS = 5  # more repairs than this within the window: someone keeps undoing ours
CONFLICT_HINT = (
    "another component keeps rewriting the CNI config or removing the plugin (e.g. Cilium with "
    "cni.exclusive=true, or a second CNI installer): configure it to leave chained plugins alone"
)


class RepairBudget:
    """A token bucket: ``burst`` repairs at once, then one per ``refill`` seconds."""

    def __init__(self, burst: int = 3, refill: float = 5.0) -> None:
        self._burst = burst
        self._refill = refill
        self._tokens = float(burst)
        self._last = time.monotonic()

    def take(self, now: float) -> bool:
        self._tokens = min(self._burst, self._tokens + (now - self._last) / self._refill)
        self._last = now
        if self._tokens < 1:
            return False
        self._tokens -= 1
        return True


@dataclass(slots=True)
class _State:
    status: Status
    running: bool = True
    announced: bool = False  # the ready line was logged
    repairs: collections.deque[float] = field(default_factory=collections.deque)
    agent: AmbientAgent | None = None
    conf_report: Callable[[], ConfReport] | None = None  # /debug/conflist (the installer's)

    def recent_repairs(self, now: float) -> int:
        while self.repairs and self.repairs[0] < now - CONFLICT_WINDOW:
            self.repairs.popleft()
        return len(self.repairs)

    def report(self) -> AgentStatus:
        report: AgentStatus = {
            "ready": self.status.ready,
            "reason": self.status.reason,
            "repairs": self.recent_repairs(time.monotonic()),
            "repairWindowSeconds": CONFLICT_WINDOW,
            "conflictRepairs": CONFLICT_REPAIRS,
        }
        if self.agent is not None:
            report["pods"] = self.agent.enrollment()
        return report

    def ready(self) -> tuple[bool, str]:
        if not self.status.ready:
            return False, self.status.reason
        if self.agent is not None and not self.agent.synced.is_set():
            return False, "ambient: waiting for the pod and namespace watches to sync"
        return True, "ok"


RELEASE_DEADLINE = 25.0  # seconds for an uninstall's release (the pod's grace period is 30)


async def _finish(task: asyncio.Future[None], release: asyncio.Event) -> None:
    """The agent stops with its stop event; wait for it (a crash shows in the log)."""
    try:
        await asyncio.wait_for(asyncio.shield(task), RELEASE_DEADLINE if release.is_set() else 10)
    except TimeoutError:
        log.error("the ambient node agent did not stop in time")  # noqa: TRY400 -- no traceback to show
        task.cancel()
    except Exception:
        log.exception("the ambient node agent failed")


async def _stop_agent(agent: AmbientAgent, stop: asyncio.Event, release: asyncio.Event) -> None:
    """Decide, before the agent stops, whether this is an uninstall (release every pod so it
    keeps working unmeshed) or an upgrade/restart (keep them captured for the next agent)."""
    plan = await agent.exit_plan()
    log.info(
        "stopping: %s pods (%s)", "releasing the" if plan.release else "keeping the", plan.reason
    )
    if plan.release:
        release.set()
    stop.set()


async def run(
    settings: InstallSettings,
    installer: Installer | None = None,
    *,
    agent: AmbientAgent | None = None,
) -> int:
    """Serve until SIGTERM/SIGINT, then clean up; returns the exit code."""
    installer = installer or Installer(settings)
    stop = asyncio.Event()
    signals = StopSignals(stop.set)
    signals.install()
    state = _State(Status(False, "starting"), agent=agent, conf_report=installer.conf_report)
    stopping = contextlib.AsyncExitStack()  # the agent's way out, before the node's cleanup
    async with contextlib.AsyncExitStack() as stack:
        addresses = []
        if settings.readiness_address:
            server = await _readiness_server(settings.readiness_address, state)
            stack.push_async_callback(_close_server, server)
            addresses += [f"http://{address_text(s)} (/readyz, /healthz)" for s in server.sockets]
        sink = Path(settings.run_dir) / LOG_SOCKET_NAME
        transport = await _log_sink(sink)
        if transport is not None:
            stack.callback(sink.unlink, missing_ok=True)
            stack.callback(transport.close)
            addresses.append(f"unix:{sink} (the plugin's log records)")
        ambient: dict[str, Handler] = (
            {"/cmdadd": agent.cni_add, "/cmddel": agent.cni_del} if agent else {}
        )
        requests = CniRequests(
            settings.run_dir,
            kernel=getattr(agent.kernel, "call", None) if agent is not None else None,
            ambient=ambient or None,
            log_level=settings.plugin_log_level,
            netns_dir=settings.netns_dir,
        )
        requests.start()
        stack.callback(requests.close)
        events = PluginServer(
            str(Path(settings.run_dir) / PLUGIN_EVENT_SOCKET_NAME),
            ambient,
            {"/cni": requests.handle},
            raw_limit=MAX_REQUEST,
            answer_timeout=ANSWER_TIMEOUT,
        )
        await events.start()
        stack.push_async_callback(events.close)
        addresses.append(f"unix:{events.path} (the plugin's requests)")
        if agent is not None:
            agent_stop, release = asyncio.Event(), asyncio.Event()
            serving = asyncio.ensure_future(agent.run(agent_stop, release=release))
            # On the way out, before the plugin leaves the node's config: decide and release.
            stopping.push_async_callback(_finish, serving, release)  # unwound last: LIFO
            stopping.push_async_callback(_stop_agent, agent, agent_stop, release)
        logs.listening(log, WHAT, addresses or ["nothing (readiness off, no log socket)"])
        try:
            await _watch(installer, settings, state, stop)
        finally:
            state.running = False
            await stopping.aclose()
            done = installer.cleanup()
            log.info("cleaned up: %s", ", ".join(done) or "nothing to remove")
    signals.remove()
    return signals.exit_code()


async def _watch(
    installer: Installer, settings: InstallSettings, state: _State, stop: asyncio.Event
) -> None:
    budget = RepairBudget()
    repairs = state.repairs
    installed_once = False
    last_problem = ""
    while not stop.is_set():
        now = time.monotonic()
        try:
            status = installer.status()
            if not status.ready and budget.take(now):
                changed = installer.install()
                if installed_once and changed:
                    repairs.append(now)
                    state.recent_repairs(now)
                    log.warning("repaired (%s): %s", status.reason, ", ".join(changed))
                    if len(repairs) > CONFLICT_REPAIRS:
                        log.warning(
                            "%d repairs in %.0fs. Hint: %s",
                            len(repairs),
                            CONFLICT_WINDOW,
                            CONFLICT_HINT,
                        )
                elif changed:
                    log.info("installed: %s", ", ".join(changed))
                installed_once = True
                status = installer.status()
            elif not status.ready:
                log.debug("repair rate-limited: %s", status.reason)
            last_problem = ""
        except MeshctlError as exc:
            status = Status(False, exc.message)
            if exc.message != last_problem:  # say it once, not every poll
                log.warning("%s%s", exc.message, f" Hint: {exc.hint}" if exc.hint else "")
                last_problem = exc.message
        state.status = status
        # Ready as /readyz says it: in ambient mode the agent's watches have synced too.
        if state.ready()[0] and not state.announced:
            state.announced = True
            logs.ready(log, WHAT, status.reason)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(stop.wait(), settings.poll_interval)


async def _readiness_server(address: str, state: _State) -> asyncio.Server:
    host, _, port = address.rpartition(":")  # validated HOST:PORT (InstallSettings)
    host = host.strip("[]")

    async def handle(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            request = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5.0)
            target = request.split(b" ", 2)[1].decode(errors="replace") if b" " in request else ""
            path, _, query = target.partition("?")
            content_type = "text/plain"
            if path == "/readyz":
                ok, reason = state.ready()
                code, body = (200, "ok") if ok else (503, reason)
            elif path == "/status":
                report = state.report()
                if state.agent is not None:  # ?dry-run=1: also a dry-run enrollment (verify)
                    dry_run = "dry-run=1" in query.split("&")
                    report["ambient"] = await state.agent.health(dry_run=dry_run)
                code, body, content_type = 200, json.dumps(report), "application/json"
            elif path == "/debug/conflist" and state.conf_report is not None:
                # Read-only, for bug-report: what the node's CNI config is, without exec.
                conf = await asyncio.wait_for(asyncio.to_thread(state.conf_report), 5.0)
                code, body, content_type = 200, json.dumps(conf), "application/json"
            elif path == "/healthz":
                code, body = (200, "ok") if state.running else (503, "stopping")
            else:
                code, body = 404, "not found"
            payload = (body + "\n").encode()
            reason = {200: "OK", 404: "Not Found", 503: "Service Unavailable"}[code]
            writer.write(
                f"HTTP/1.1 {code} {reason}\r\nContent-Type: {content_type}\r\n"
                f"Content-Length: {len(payload)}\r\nConnection: close\r\n\r\n".encode()
                + payload
            )
            await asyncio.wait_for(writer.drain(), 5.0)
        except (OSError, TimeoutError, asyncio.IncompleteReadError, asyncio.LimitOverrunError):
            pass  # a probe that hung up or sent garbage gets nothing
        finally:
            writer.close()

    try:
        return await asyncio.start_server(handle, host or None, int(port))
    except OSError as exc:
        # asyncio's own errno (its text names the address again): the words every daemon uses.
        error = listen_failed(address, "readiness", exc.errno, exc.strerror or str(exc))
        if isinstance(error, PortInUseError):
            error.hint = "stop what is using it, or pick a free port with --readiness-address"
        raise error from exc


async def _close_server(server: asyncio.Server) -> None:
    server.close()
    await server.wait_closed()


class _PluginLogs(asyncio.DatagramProtocol):
    def datagram_received(self, data: bytes, addr: object) -> None:
        try:
            record = load_json(data, "plugin log record")
            level = logging.getLevelName(str(record.get("level", "info")).upper())
            message = str(record.get("msg", ""))
        except (InputError, AttributeError):
            level, message = logging.INFO, data.decode(errors="replace")
        plugin_log.log(level if isinstance(level, int) else logging.INFO, "%s", message)


async def _log_sink(path: Path) -> asyncio.DatagramTransport | None:
    """Bind the plugin's log socket; without it the plugin still logs to its file."""
    with contextlib.suppress(FileNotFoundError):
        path.unlink()  # a stale socket from a killed installer
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        transport, _ = await asyncio.get_running_loop().create_datagram_endpoint(
            _PluginLogs, local_addr=str(path), family=socket.AF_UNIX
        )
    except OSError as exc:
        log.warning("plugin log socket %s unavailable: %s", path, exc.strerror)
        return None
    return transport
