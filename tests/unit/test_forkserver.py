"""The fork server forks workers that behave like fresh processes, and outlives their crashes.

The server here runs a test command (``SERVER``): its preload sets a marker, and a worker reports
what it sees (the marker, its descriptors, its environment) and exits with the code asked for.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import traceback
from collections.abc import Callable
from pathlib import Path

import pytest

from meshctl import forkserver, process
from meshctl.core.wire import channel

SERVER = textwrap.dedent(
    """
    import os, sys
    from meshctl import forkserver

    PRELOADED = []

    def preload(command):
        PRELOADED.append(command)
        if os.environ.get("SLOW_PRELOAD"):
            import time
            time.sleep(float(os.environ["SLOW_PRELOAD"]))

    def open_fds():
        fds = []
        for n in range(1024):
            try:
                os.fstat(n)
            except OSError:
                continue
            fds.append(n)
        return fds

    def run(args):
        # args: FD TEXT CODE -- write what this worker sees to descriptor FD, exit with CODE.
        fd, text, code = int(args[0]), args[1], int(args[2])
        if text == "sleeper":  # says nothing: lives until killed
            import time
            time.sleep(60)
        if os.environ.get("PIDFILE"):
            with open(os.environ["PIDFILE"], "w") as out:
                out.write(str(os.getpid()))
        seen = f"{text} preloaded={PRELOADED} env={os.environ.get('WORKER_ENV')} "
        seen += f"pid={os.getpid()} server={os.getppid()} fds={open_fds()}"
        os.write(fd, seen.encode())
        if text == "hang":
            import time
            time.sleep(60)
        return code

    sys.exit(forkserver.main(sys.argv[1:], preload=preload, run=run))
    """
)


@pytest.fixture
def server():
    started = forkserver.ForkServer.start([sys.executable, "-c", SERVER, "test-command"])
    yield started
    started.close()


def _spawn(server: forkserver.ForkServer, fd: int, text: str, code: int = 0):
    """A worker that writes ``text`` and what it sees to our ``fd`` (at the same number)."""
    return server.spawn([str(fd), text, str(code)], [fd], {"WORKER_ENV": text}, 10.0)


def test_a_worker_runs_after_the_preload_with_its_descriptor_and_its_env(server):
    ours, theirs = socket.socketpair()
    worker = _spawn(server, theirs.fileno(), "first", code=7)
    assert worker.wait(10) == 7
    seen = ours.recv(4096).decode()
    assert seen.startswith("first preloaded=['test-command'] env=first ")
    assert f"pid={worker.pid} server={server.pid}" in seen
    # Exactly stdio and its one descriptor: none of the server's (its control socket, its
    # wake-up pipe, other workers' status pipes).
    assert seen.endswith(f"fds={sorted([0, 1, 2, theirs.fileno()])}")


def test_descriptors_land_at_their_numbers_even_when_the_numbers_are_each_others():
    a_read, a_write = os.pipe()
    b_read, b_write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the worker's side: a_write's number must now be b_write, and the reverse
        code = 1
        try:
            forkserver._place({a_write: b_write, b_write: a_write})
            os.write(a_write, b"to b")
            os.write(b_write, b"to a")
            code = 0
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert os.read(b_read, 100) == b"to b"
    assert os.read(a_read, 100) == b"to a"
    for fd in (a_read, a_write, b_read, b_write):
        os.close(fd)


def test_a_killed_worker_reports_its_signal_and_the_server_forks_the_next(server):
    ours, theirs = socket.socketpair()
    worker = _spawn(server, theirs.fileno(), "hang")
    assert ours.recv(4096).startswith(b"hang")
    assert worker.poll() is None
    with pytest.raises(subprocess.TimeoutExpired):
        worker.wait(0.05)
    worker.kill()
    assert worker.wait(10) == -signal.SIGKILL
    assert worker.poll() == -signal.SIGKILL
    assert server.alive()
    again = _spawn(server, theirs.fileno(), "again", code=3)
    assert again.wait(10) == 3
    assert b"again" in ours.recv(4096)


def test_waits_in_several_threads_and_a_poll_all_see_the_exit_and_keep_their_descriptors(server):
    ours, theirs = socket.socketpair()
    worker = _spawn(server, theirs.fileno(), "hang")
    ours.recv(4096)

    async def main() -> list[int]:
        loop = asyncio.get_running_loop()
        # As the supervisor does: one wait watching the worker, one more in the drain.
        waits = [loop.run_in_executor(None, worker.wait) for _ in range(3)]
        await asyncio.sleep(0.1)
        assert worker.poll() is None  # not blocked behind the waiting threads
        worker.kill()
        return list(await asyncio.gather(*waits))

    assert asyncio.run(asyncio.wait_for(main(), 10)) == [-signal.SIGKILL] * 3
    assert worker.wait(0) == -signal.SIGKILL


def test_the_server_exits_when_its_supervisor_closes_the_socket(server):
    pid = server.pid
    server.close()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


def test_a_spawn_on_a_dead_server_is_an_oserror(server):
    os.kill(server.pid, signal.SIGKILL)
    end = time.monotonic() + 10
    while server.alive() and time.monotonic() < end:
        time.sleep(0.01)
    with pytest.raises(OSError):  # noqa: PT011 (EPIPE or "exited": both say it is gone)
        _spawn(server, 1, "never")


class _NoFeed(process.Feed):
    def current(self) -> list[channel.Message]:
        return []

    def changes(self) -> list[channel.Message]:
        return []


def _in_child(body: Callable[[], None]) -> None:
    """Run ``body`` in a forked child of this test process: a subreaper (what a supervisor with
    a fork server becomes) must not be the test runner itself."""
    pid = os.fork()
    if pid == 0:
        code = 1
        try:
            body()
            code = 0
        except BaseException:  # noqa: BLE001 (reported through the exit code and stderr)
            traceback.print_exc()
        finally:
            os._exit(code)
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, "see the child's traceback above"


def _dataplane_supervisor(server: forkserver.ForkServer) -> process.Supervisor:
    """A supervisor of one sidecar data plane, forked from ``server``, fed nothing."""
    return process.Supervisor(
        argv=lambda fd: process.self_command(
            "ztunnel-dataplane", "--channel-fd", str(fd), "--log-level", "error"
        ),
        config=lambda _i, fds: channel.ProxyConfig(
            mode="sidecar", workload="ns/name/sa", listeners=fds
        ),
        listeners={},
        feed=_NoFeed(),
        drain_deadline=1.0,
        hello_timeout=30.0,
        fork_server=server,
    )


def test_the_supervisor_forks_data_planes_from_its_server_and_replaces_a_dead_server():
    async def main() -> None:
        server = process.start_fork_server("ztunnel-dataplane")
        supervisor = _dataplane_supervisor(server)
        child = await supervisor._start(0)  # it said hello over its channel
        assert isinstance(child.proc, forkserver.ForkedProcess)
        assert _parent(child.proc.pid) == server.pid
        supervisor._kill(child)
        os.kill(server.pid, signal.SIGKILL)
        server._proc.wait()  # type: ignore[attr-defined]
        child = await supervisor._start(0)  # from a new server
        replacement = supervisor._fork_server
        assert replacement is not None
        assert replacement.pid != server.pid
        assert _parent(child.proc.pid) == replacement.pid
        supervisor._kill(child)
        replacement.close()

    _in_child(lambda: asyncio.run(asyncio.wait_for(main(), 60)))


def test_once_every_worker_runs_the_server_retires_and_its_workers_become_ours():
    async def main() -> None:
        server = process.start_fork_server("ztunnel-dataplane")
        supervisor = _dataplane_supervisor(server)
        child = await supervisor._start(0)
        supervisor._retire_fork_server()  # what the slot does after each start
        assert server._proc.wait(10) == 0  # type: ignore[attr-defined]
        end = time.monotonic() + 10
        while _parent(child.proc.pid) != os.getpid():  # reparented to the supervisor
            assert time.monotonic() < end
            await asyncio.sleep(0.01)
        assert child.proc.poll() is None
        os.kill(child.proc.pid, signal.SIGTERM)  # it drains and exits 0: its real status
        assert child.proc.wait(10) == 0
        with pytest.raises(ChildProcessError):  # reaped: no zombie left
            os.waitpid(child.proc.pid, os.WNOHANG)
        supervisor._forget(child)
        again = await supervisor._start(0)  # a restart starts another server
        assert supervisor._fork_server is not server
        assert _parent(again.proc.pid) == supervisor._fork_server.pid  # type: ignore[union-attr]
        supervisor._kill(again)
        supervisor._fork_server.close()  # type: ignore[union-attr]

    _in_child(lambda: asyncio.run(asyncio.wait_for(main(), 60)))


def test_a_start_given_up_while_the_server_imports_kills_the_worker_forked_for_it(tmp_path):
    pidfile = tmp_path / "worker.pid"

    async def main() -> None:
        server = forkserver.ForkServer.start(
            [sys.executable, "-c", SERVER, "test-command"],
            env={**os.environ, "SLOW_PRELOAD": "1"},
        )
        supervisor = process.Supervisor(
            # This binary's command line, so that the supervisor forks it from the server;
            # the test server's worker sleeps.
            argv=lambda fd: [*process.self_command(), str(fd), "sleeper", "0"],
            config=lambda _i, fds: channel.ProxyConfig(mode="sidecar", workload="a/b/c"),
            listeners={},
            feed=_NoFeed(),
            drain_deadline=1.0,
            extra_env={"PIDFILE": str(pidfile)},
            fork_server=server,
        )
        start = asyncio.ensure_future(supervisor._start(0))
        await asyncio.sleep(0.3)  # the request is sent; the server is still importing
        start.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await start
        # The server forks it once imported (~1 s): without the kill it would hang for 60 s as
        # the server's live child; with it, it is killed (maybe before it wrote its pid).
        end = time.monotonic() + 3
        while time.monotonic() < end:
            live = [pid for pid in _children_of(server.pid) if _alive(pid)]
            assert not live or time.monotonic() < end - 1.5, f"abandoned worker runs: {live}"
            await asyncio.sleep(0.02)
        assert server.alive()  # it answered, and outlived the kill
        server.close()

    _in_child(lambda: asyncio.run(asyncio.wait_for(main(), 30)))


def _children_of(pid: int) -> list[int]:
    return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state not in ("Z", "X")


def _parent(pid: int) -> int:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return int(stat.rsplit(")", 1)[1].split()[1])
