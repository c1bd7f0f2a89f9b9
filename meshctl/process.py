"""Starting, feeding and supervising the data-plane subprocess (a re-exec of this same binary).

Owns the child's life: argv (``self_command``: the frozen executable itself, or this interpreter
running the console entry point), the inherited listening sockets (owned here, so connections
queue in the kernel backlog while a crashed data plane restarts instead of being refused), the
channel (a socketpair speaking ``meshctl.core.wire.channel``), one or more worker children each
restarted with exponential backoff, and the drain on SIGTERM/SIGINT. Invariants: the supervisor
never imports the data plane; a new child always receives the latest config, certificates and
workloads before anything else; ``run`` returns 0 after a requested drain (signal or
``/quitquitquit``) and never leaves a child behind. It also relays ``/config_dump``'s question
to the other workers (``Gather`` -> ``ReportRequest`` each -> ``Gathered``) and answers within
``report_timeout`` with whatever arrived, naming the workers that did not answer. In node mode
each child also gets a pod channel (SOCK_SEQPACKET): every pod the node agent handed over goes to
every child with its descriptors, and a new child receives all current pods after its config.
With a fork server (``meshctl.forkserver``, started early by the caller) a worker is forked from
it instead of re-executed: same argv, descriptors, environment and contract, without a fresh
interpreter's start and imports; a server found dead is replaced before the next start.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import importlib
import logging
import os
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Protocol

from meshctl import descriptors, logs
from meshctl.core.backoff import Backoff
from meshctl.core.wire import channel
from meshctl.forkserver import COMMAND as FORK_SERVER_COMMAND
from meshctl.forkserver import ForkedProcess, ForkServer, become_subreaper
from meshctl.shutdown import StopSignals

if TYPE_CHECKING:
    from meshctl.core.wire.dump import WorkerReport

log = logging.getLogger(__name__)

# Listener roles that keep serving during a drain (readiness must be seen to fail, metrics read).
HTTP_ROLES = ("readiness", "metrics", "admin")
_POD_SEND_TIMEOUT = 2.0


def self_command(*args: str) -> list[str]:
    """argv that runs this meshctl again with ``args`` (works frozen and from a venv)."""
    if getattr(sys, "frozen", False):
        return [sys.executable, *args]  # the one-file binary is its own interpreter
    return [sys.executable, "-m", "meshctl", *args]


def start_fork_server(command: str) -> ForkServer:
    """A fork server for raw command ``command`` (``self_command(command, ...)`` workers are then
    forked from it), itself forked from this process when it is single-threaded: it shares what
    this process has imported and imports the rest while the caller goes on. Start it early."""
    return ForkServer.fork(self_command(FORK_SERVER_COMMAND, command), _run_meshctl)


def _run_meshctl(args: list[str]) -> int:
    """meshctl's entry point, as ``self_command`` runs it (named, not imported: the entry point
    sits above every module, this one included)."""
    entry = importlib.import_module("meshctl.entry")
    return int(entry.main(args))


class _Process(Protocol):
    """What the supervisor needs of a child: a ``subprocess.Popen`` or a forked worker."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...
    def wait(self, timeout: float | None = None) -> int: ...
    def kill(self) -> None: ...


# A crashed child is restarted at once; one that crashes again waits 0.2 s doubling to 10 s.
RESTART_BACKOFF = Backoff(first=0.2, cap=10.0)
RESTART_STABLE = 10.0  # seconds a child must have run for its crash to count as the first again


class Feed:
    """What the supervisor sends: the full current state for a new child, changes after that.

    ``run`` is the feed's own background work (a CA client renewing certificates), started with
    the supervisor and cancelled when it stops; what it produces comes out of ``changes``.
    """

    def current(self) -> list[channel.Message]:
        raise NotImplementedError

    def changes(self) -> list[channel.Message]:
        raise NotImplementedError

    async def run(self) -> None:
        return

    async def wait(self, timeout: float) -> None:
        """Return when ``changes`` may have something, at the latest after ``timeout`` s.

        Polled sources (files) just sleep; a pushing source (discovery) returns at once.
        """
        await asyncio.sleep(timeout)


class PodFeed:
    """Node mode: the pods every data plane serves, as messages with the descriptors they carry."""

    def current(self) -> list[tuple[channel.Message, tuple[int, ...]]]:
        raise NotImplementedError

    def stop_listening(self) -> None:
        """The drain began: close the supervisor's copies of the pods' listeners (with the
        workers' copies closed too, the kernel hands what is queued on them to the next proxy's
        listeners, or refuses new connections when there is none)."""
        return


@dataclass(slots=True)
class _Child:
    index: int
    proc: _Process
    started: float
    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter
    pods: socket.socket | None = None
    fed: bool = False  # has its config and the current state: later updates go to it
    quit_requested: bool = False
    drained: asyncio.Event = field(default_factory=asyncio.Event)
    reading: asyncio.Task[None] | None = None


def _feed_ended(task: asyncio.Task[None]) -> None:
    if not task.cancelled() and task.exception() is not None:
        log.error("the certificate/workload feed failed", exc_info=task.exception())


class Supervisor:
    """Runs ``workers`` data-plane children, each restarted on its own when it dies.

    Every worker inherits the same proxy listeners (one accept queue per port; whichever worker
    is free accepts). Only worker 0 gets the HTTP listeners (readiness, metrics, admin), so one
    process answers them; a worker starts accepting only once it has config, certificates and
    workloads, so a restarting worker never takes a connection it cannot serve.
    """

    def __init__(
        self,
        *,
        argv: Callable[[int], Sequence[str]],
        config: Callable[[int, dict[str, int]], channel.ProxyConfig],
        listeners: dict[str, socket.socket],
        feed: Feed,
        drain_deadline: float,
        workers: int = 1,
        extra_env: Mapping[str, str] | None = None,
        on_exit: Callable[[int], None] | None = None,
        poll_interval: float = 1.0,
        backoff: Backoff = RESTART_BACKOFF,
        stable: float = RESTART_STABLE,
        hello_timeout: float = 30.0,
        report_timeout: float = 1.0,
        ready_line: tuple[str, str] = ("data plane", ""),
        pods: PodFeed | None = None,
        on_drain: Callable[[], None] | None = None,
        fork_server: ForkServer | None = None,
    ) -> None:
        if workers < 1:
            raise ValueError("at least one worker")
        self._argv = argv
        self._config = config
        self._listeners = listeners
        self._feed = feed
        self._drain_deadline = drain_deadline
        self._workers = workers
        # Children inherit our environment (their libraries may read it) plus ``extra_env``.
        self._env = {**os.environ, **extra_env} if extra_env else None
        self._on_exit = on_exit
        self._poll_interval = poll_interval
        self._backoff = backoff
        self._stable = stable
        self._hello_timeout = hello_timeout
        self._stop = asyncio.Event()
        self._quit = asyncio.Event()
        self._children: dict[int, _Child] = {}
        self.restarts = 0
        self._report_timeout = report_timeout
        self._requests = 0  # tokens of ReportRequests, unique for this supervisor
        self._reports: dict[tuple[int, int], asyncio.Future[channel.Report]] = {}
        self._gathering: set[asyncio.Task[None]] = set()
        # (what, detail) of the one "ready" line, logged when every worker first says ready.
        self._ready_line = ready_line
        self._ready: set[int] = set()
        self._announced = False
        self._pods = pods
        self._on_drain = on_drain
        # Retired once every worker runs; another starts for a restart. Workers that outlive
        # their server become our children (a subreaper), waited for with their status.
        self._fork_server = fork_server
        self._fork_server_retired = False
        if fork_server is not None:
            become_subreaper()

    def stop(self) -> None:
        """Begin the drain (what SIGTERM does)."""
        self._stop.set()

    @property
    def stopping(self) -> bool:
        return self._stop.is_set()

    @property
    def ready(self) -> bool:
        """Every worker is running and its last ``Status`` said ready."""
        return len(self._ready) == self._workers

    @property
    def ready_workers(self) -> frozenset[int]:
        """The indexes of the running workers whose last ``Status`` said ready."""
        return frozenset(self._ready)

    def pids(self) -> dict[int, int]:
        """Worker index -> pid of the live workers."""
        return {i: c.proc.pid for i, c in self._children.items() if c.proc.poll() is None}

    async def run(self) -> int:
        signals = StopSignals(self._stop.set)
        signals.install()
        poller = asyncio.ensure_future(self._poll())
        feeding = asyncio.ensure_future(self._feed.run())
        feeding.add_done_callback(_feed_ended)
        slots = [asyncio.ensure_future(self._slot(i)) for i in range(self._workers)]
        stop = asyncio.ensure_future(self._stop.wait())
        quit_ = asyncio.ensure_future(self._quit.wait())
        try:
            await asyncio.wait({stop, quit_}, return_when=asyncio.FIRST_COMPLETED)
            if self._quit.is_set():
                log.info("data plane drained on request (/quitquitquit); exiting")
            self._stop.set()  # slots stop restarting; the drain below ends the rest
            await self._drain()
            return signals.exit_code()
        finally:
            for task in (stop, quit_, poller, feeding, *slots, *self._gathering):
                task.cancel()
            signals.remove()
            for child in list(self._children.values()):
                self._kill(child)
            if self._fork_server is not None:
                self._fork_server.close()

    async def _slot(self, index: int) -> None:
        """Keep worker ``index`` running until the stop: start, watch, restart with backoff."""
        failures = 0
        while not self._stop.is_set():
            try:
                child = await self._start(index)
            except (OSError, TimeoutError, channel.ChannelError) as exc:
                log.error("data plane %d failed to start: %s", index, exc)  # noqa: TRY400 (expected; no traceback)
                failures += 1
            else:
                self._retire_fork_server()
                outcome = await self._watch(child)
                if outcome == "quit":
                    self._quit.set()
                    return
                if outcome == "stop":
                    return  # run() drains it
                uptime = time.monotonic() - child.started
                failures = 1 if uptime >= self._stable else failures + 1
                log.error(
                    "data plane %d exited with %s after %.1fs; restarting",
                    index,
                    child.proc.returncode,
                    uptime,
                )
            delay = self._backoff.delay(failures - 1)  # the first crash in a row: no wait
            self.restarts += 1
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), delay)

    async def _start(self, index: int) -> _Child:
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
        fds = {
            role: s.fileno()
            for role, s in self._listeners.items()
            if index == 0 or role.removesuffix("6") not in HTTP_ROLES
        }
        pods_ours: socket.socket | None = None
        inherited = [theirs.fileno(), *fds.values()]
        if self._pods is not None:
            pods_ours, pods_theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
            # Blocking with a deadline: a child that stops reading its pods is restarted.
            pods_ours.settimeout(_POD_SEND_TIMEOUT)
            inherited.append(pods_theirs.fileno())
        try:
            proc = await self._launch(self._argv(theirs.fileno()), inherited)
        except BaseException:
            if pods_ours is not None:
                pods_ours.close()
            raise
        finally:
            theirs.close()
            if self._pods is not None:
                pods_theirs.close()
        reader, writer = await asyncio.open_connection(sock=ours)
        child = _Child(
            index=index,
            proc=proc,
            started=time.monotonic(),
            reader=reader,
            writer=writer,
            pods=pods_ours,
        )
        self._children[index] = child
        decoder = channel.Decoder()
        hello: list[channel.Message] = []
        async with asyncio.timeout(self._hello_timeout):
            while not hello:
                data = await child.reader.read(65536)
                if not data:
                    self._kill(child)
                    raise OSError(f"data plane exited before saying hello ({proc.wait()})")
                hello = decoder.feed(data)
        first = hello[0]
        if not isinstance(first, channel.Hello) or channel.VERSION not in first.versions:
            self._kill(child)
            raise channel.ChannelError(f"data plane did not speak channel v{channel.VERSION}")
        config = self._config(index, fds)
        if self._pods is not None:
            config = dataclasses.replace(config, pod_channel=inherited[-1])
        self._send(child, config)
        for message in self._feed.current():
            self._send(child, message)
        if self._pods is not None:
            for message, attached in self._pods.current():
                self._send_pod(child, message, attached)
        child.fed = True
        log.debug("data plane %d started (pid %d)", index, proc.pid)
        child.reading = asyncio.ensure_future(self._read(child, decoder, hello[1:]))
        return child

    async def _launch(self, argv: Sequence[str], fds: list[int]) -> _Process:
        """Fork ``argv`` from the fork server when it runs this binary, else execute it."""
        prefix = self_command()
        server = self._fork_server
        if server is None or list(argv[: len(prefix)]) != prefix:
            return subprocess.Popen(
                list(argv), pass_fds=tuple(fds), stdin=subprocess.DEVNULL, env=self._env
            )
        if not server.alive():
            if not self._fork_server_retired:
                log.error("the fork server (pid %d) exited; starting another", server.pid)
            server.close()
            self._fork_server = server = server.restart()
            self._fork_server_retired = False
        env = self._env if self._env is not None else dict(os.environ)
        lock = threading.Lock()
        held: list[ForkedProcess] = []
        abandoned = False

        def spawn() -> ForkedProcess:
            nonlocal abandoned
            proc = server.spawn(argv[len(prefix) :], fds, env, self._hello_timeout)
            with lock:
                if abandoned:
                    proc.kill()
                held.append(proc)
            return proc

        # In a thread: the first answer waits for the server's imports. A start given up
        # meanwhile (the supervisor stopping) kills the worker forked for it, whenever it comes.
        try:
            return await asyncio.get_running_loop().run_in_executor(None, spawn)
        except asyncio.CancelledError:
            with lock:
                abandoned = True
                for proc in held:
                    proc.kill()
            raise

    def _retire_fork_server(self) -> None:
        """Once every worker runs, let the fork server go: idle, it held ~15 MB of pages its
        workers no longer share (each touched its own copies); they keep sharing the rest."""
        server = self._fork_server
        everyone = len(self._children) == self._workers
        if server is not None and everyone and not self._fork_server_retired:
            server.retire()
            self._fork_server_retired = True
            # Reaped as soon as it has gone (at once, on its socket's end): no zombie child.
            asyncio.get_running_loop().run_in_executor(None, server.close)

    async def _read(
        self, child: _Child, decoder: channel.Decoder, pending: list[channel.Message]
    ) -> None:
        messages = pending
        while True:
            for message in messages:
                if isinstance(message, channel.Status):
                    if message.problem:
                        log.error("data plane %d: %s", child.index, message.problem)
                    else:
                        log.debug("data plane %d status: ready=%s", child.index, message.ready)
                    self._note_ready(child.index, message.ready)
                elif isinstance(message, channel.Drained):
                    child.quit_requested = not self._stop.is_set()
                    child.drained.set()
                elif isinstance(message, channel.Gather):
                    task = asyncio.ensure_future(self._gather(child, message.request))
                    self._gathering.add(task)
                    task.add_done_callback(self._gathering.discard)
                elif isinstance(message, channel.Report):
                    waiter = self._reports.get((message.request, child.index))
                    if waiter is not None and not waiter.done():
                        waiter.set_result(message)
            try:
                data = await child.reader.read(65536)
                if not data:
                    return
                messages = decoder.feed(data)
            except (ConnectionError, channel.ChannelError) as exc:
                log.error("data plane %d channel: %s", child.index, exc)  # noqa: TRY400 (expected; no traceback)
                return

    def _note_ready(self, index: int, ready: bool) -> None:
        if ready:
            self._ready.add(index)
        else:
            self._ready.discard(index)
        if not self._announced and len(self._ready) == self._workers:
            self._announced = True
            what, detail = self._ready_line
            workers = f"{self._workers} data-plane worker{'s' if self._workers > 1 else ''}"
            logs.ready(log, what, f"{detail}, {workers}" if detail else workers)

    async def _gather(self, asker: _Child, request: int) -> None:
        """Ask every other live worker for its ``Report``; answer ``asker`` with what came in
        time (a worker that is restarting or stuck is named in ``missing``, never waited for)."""
        self._requests += 1
        token = self._requests
        loop = asyncio.get_running_loop()
        waits: dict[int, asyncio.Future[channel.Report]] = {}
        for child in list(self._children.values()):
            if child is asker or child.proc.poll() is not None:
                continue
            waits[child.index] = self._reports[(token, child.index)] = loop.create_future()
            self._send(child, channel.ReportRequest(request=token))
        if waits:
            await asyncio.wait(waits.values(), timeout=self._report_timeout)
        reports: list[WorkerReport] = []
        missing: list[int] = []
        for index in range(self._workers):
            if index == asker.index:
                continue
            self._reports.pop((token, index), None)
            waiter = waits.get(index)
            if waiter is not None and waiter.done():
                got = waiter.result()
                reports.append(
                    {"worker": got.worker, "pid": got.pid, "connections": got.connections}
                )
            else:
                if waiter is not None:
                    waiter.cancel()
                missing.append(index)
        answer = channel.Gathered(request=request, reports=tuple(reports), missing=tuple(missing))
        self._send(asker, answer)

    async def _watch(self, child: _Child) -> str:
        """Wait for the child to exit ("exited"), ask to quit ("quit") or a stop ("stop")."""
        loop = asyncio.get_running_loop()
        exited = loop.run_in_executor(None, child.proc.wait)
        stop = asyncio.ensure_future(self._stop.wait())
        drained = asyncio.ensure_future(child.drained.wait())
        waiting: set[asyncio.Future[Any]] = {exited, stop, drained}
        done, _ = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        stop.cancel()
        drained.cancel()
        if stop in done:
            return "stop"
        if drained in done and child.quit_requested:
            await asyncio.wait({exited}, timeout=5)
            self._kill(child)
            return "quit"
        await exited
        self._forget(child)
        return "exited"

    async def _drain(self) -> None:
        """Stop accepting (close our listener copies), then ask every live child to drain."""
        for role, sock in self._listeners.items():
            if role.removesuffix("6") not in HTTP_ROLES:
                sock.close()  # the kernel now refuses new connections; open ones carry on
        if self._on_drain is not None:
            self._on_drain()  # the caller's own listener copies (sent over the pod channel)
        if self._pods is not None:
            self._pods.stop_listening()
        children = [c for c in self._children.values() if c.proc.poll() is None]
        if not children:
            return
        log.info("draining: open connections have %.1fs to finish", self._drain_deadline)
        loop = asyncio.get_running_loop()
        waits: set[asyncio.Future[Any]] = set()
        for child in children:
            if not child.drained.is_set():
                self._send(child, channel.Drain(deadline=self._drain_deadline))
            waits.add(loop.run_in_executor(None, child.proc.wait))
        await asyncio.wait(waits, timeout=self._drain_deadline + 2)
        for child in children:
            self._kill(child)

    async def _poll(self) -> None:
        while True:
            await self._feed.wait(self._poll_interval)
            try:
                changes = self._feed.changes()
            except Exception:  # a reload problem must never take the proxy down
                log.exception("reload failed; keeping the current state")
                continue
            for message in changes:
                self.broadcast(message)  # a child still starting gets the new state as current

    def broadcast(self, message: channel.Message) -> None:
        """Send ``message`` to every live data plane now (not at the next poll)."""
        for child in list(self._children.values()):
            if child.fed and child.proc.poll() is None:
                self._send(child, message)

    def send_pod(self, message: channel.Message, fds: tuple[int, ...] = ()) -> None:
        """Node mode: a pod message, with its descriptors, to every live data plane."""
        for child in list(self._children.values()):
            if child.fed and child.proc.poll() is None:
                self._send_pod(child, message, fds)

    def _send_pod(self, child: _Child, message: channel.Message, fds: tuple[int, ...]) -> None:
        if child.pods is None:
            return
        try:
            descriptors.send(child.pods, message, fds)
        except OSError as exc:  # TimeoutError included: it stopped reading
            log.error("data plane %d: pod channel: %s; restarting it", child.index, exc)  # noqa: TRY400
            if child.proc.poll() is None:
                child.proc.kill()

    def _send(self, child: _Child, message: channel.Message) -> None:
        if not child.writer.is_closing():
            child.writer.write(channel.encode(message))

    def _kill(self, child: _Child) -> None:
        if child.proc.poll() is None:
            child.proc.kill()
            child.proc.wait()
        self._forget(child)

    def _forget(self, child: _Child) -> None:
        # Through the transport, which first takes the descriptor out of the loop's selector:
        # a socket closed under it (a child seen dead before its EOF was read) left the
        # selector's record of that number, and the next child's channel, given the same
        # number, was never watched (its hello unread until the hello timeout).
        child.writer.close()
        if child.reading is not None:
            child.reading.cancel()
        with contextlib.suppress(OSError):
            if child.pods is not None:
                child.pods.close()
        if self._children.get(child.index) is child:
            del self._children[child.index]
            self._ready.discard(child.index)  # its replacement says ready for itself
            if self._on_exit is not None:
                self._on_exit(child.proc.pid)
