"""The fork server: one process that has imported a command's code forks that command's workers.

A supervisor starts it once (``ForkServer.start``, a re-exec of this binary); it imports what the
command needs (the command's ``preload``), freezes those objects out of the collector's sight
(``gc.freeze``: a worker's collections then never write to the shared pages) and waits. Each
``spawn`` forks a worker that runs the command as a fresh process would (``entry.main(args)``),
so a worker starts without an interpreter start or imports and shares the imported pages
copy-on-write with the server and its siblings.

Wire (a SOCK_SEQPACKET socketpair, one packet per message): a request is JSON ``{"args", "fds",
"env"}`` with the descriptors in SCM_RIGHTS in the order of ``fds`` (the numbers the worker must
see them at, as ``subprocess``'s ``pass_fds`` keeps them); the answer is ``{"pid"}`` with a pidfd
and the read end of the worker's status pipe, or ``{"error"}``. When the server reaps a worker it
writes the wait status (4 bytes) to that pipe.

Invariants: the server is single-threaded and runs no event loop, so a fork never copies a lock
held by another thread; a worker gets exactly its descriptors (at their numbers) besides stdio,
the environment asked for and default signal handling, and never returns into the server's loop
(it exits with its command's code); a worker's death never ends the server; the server exits
when its control socket closes (its supervisor is gone).
"""

from __future__ import annotations

import array
import contextlib
import fcntl
import gc
import json
import logging
import os
import select
import signal
import socket
import subprocess
import sys
import threading
import time
import traceback
from collections.abc import Callable, Mapping, Sequence

from meshctl.errors import UserError

COMMAND = "fork-server"  # meshctl's hidden command that runs ``serve`` (meshctl/entry.py)
_MAX_PACKET = 1 << 20  # a request: argv, descriptor numbers and the environment
_MAX_FDS = 64
_STATUS = 4  # bytes of a wait status in the status pipe
_UNREAPABLE_TRIES = 50  # x 10 ms: a worker exited under a dying server is ours by then


class ForkedProcess:
    """A worker of a fork server, with the part of ``subprocess.Popen``'s interface a supervisor
    uses (``pid``, ``returncode``, ``poll``, ``wait``, ``kill``, ``terminate``, ``send_signal``).

    It is the server's child, not ours: its exit status comes through the status pipe, and
    signals go through the pidfd (never to a recycled pid). Once the server has gone (retired
    after start-up, or dead) the worker is ours (``become_subreaper``): waited for through the
    pidfd. ``wait`` may run in several threads
    while ``poll`` runs in another: the status pipe stays open (readable at its end) until the
    object goes, so a waiter never selects on a closed or reused descriptor.
    """

    def __init__(self, pid: int, pidfd: int, status_fd: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._pidfd = pidfd
        self._status_fd = status_fd
        os.set_blocking(status_fd, False)
        self._lock = threading.Lock()
        self._orphan = False  # the server went before reporting: the pidfd tells the exit
        self._unreapable = 0

    def poll(self) -> int | None:
        if self.returncode is None:
            self._collect(0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None and not self._collect(timeout):
            raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
        assert self.returncode is not None  # noqa: S101 (_collect set it)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        with self._lock:
            if self.returncode is None:
                with contextlib.suppress(ProcessLookupError):  # exited, not yet reported
                    signal.pidfd_send_signal(self._pidfd, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def _known(self) -> bool:
        return self.returncode is not None

    def _collect(self, timeout: float | None) -> bool:
        """Wait up to ``timeout`` s (None: for ever) for the status; whether it is known now."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            with self._lock:
                if self._known():
                    return True
                fd = self._pidfd if self._orphan else self._status_fd
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            # Unlocked while waiting: a ``poll`` from another thread never blocks behind it.
            ready, _, _ = select.select([fd], [], [], left)
            with self._lock:
                if ready:
                    self._read_status()
                if self._known():
                    return True
            if deadline is not None and time.monotonic() >= deadline:
                return False
            if ready and self._orphan and self._unreapable:
                time.sleep(0.01)  # exited, but not (yet) ours to reap: see _read_status

    def _read_status(self) -> None:
        """With the lock: take what a readable descriptor says."""
        if not self._orphan:
            try:
                data = os.read(self._status_fd, _STATUS)
            except BlockingIOError:
                return
            if len(data) == _STATUS:
                status = int.from_bytes(data, sys.byteorder, signed=True)
                self.returncode = os.waitstatus_to_exitcode(status)
                return
            self._orphan = True  # the server is gone: the worker's parent is now us, or init
        if not select.select([self._pidfd], [], [], 0)[0]:
            return  # still running
        try:
            result = os.waitid(os.P_PIDFD, self._pidfd, os.WEXITED | os.WNOHANG)
        except ChildProcessError:
            # Reparented to init (no subreaper), or not yet to us (the server is exiting): its
            # exit is certain, its status unknown after a grace of ~0.5 s.
            self._unreapable += 1
            if self._unreapable > _UNREAPABLE_TRIES:
                self.returncode = -signal.SIGKILL
            return
        if result is not None:
            killed = result.si_code in (os.CLD_KILLED, os.CLD_DUMPED)
            self.returncode = -result.si_status if killed else result.si_status

    def __del__(self, close: Callable[[int], None] = os.close) -> None:
        # Only here: while any thread waits (holding a reference) the numbers stay ours, never
        # closed under its select() nor reused by another descriptor meanwhile. (``close``
        # bound early: this may run while the interpreter tears the module down.)
        for fd in (self._status_fd, self._pidfd):
            with contextlib.suppress(OSError):
                close(fd)


class ForkServer:
    """Our end of a running fork server: ``spawn`` forks a worker, ``close`` ends the server."""

    def __init__(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None,
        sock: socket.socket,
        proc: subprocess.Popen[bytes] | _Adopted,
    ) -> None:
        self._argv, self._env = list(argv), env  # to start another like it
        self._sock = sock
        self._proc = proc
        self._lock = threading.Lock()  # one request and its answer at a time

    @classmethod
    def start(cls, argv: Sequence[str], env: Mapping[str, str] | None = None) -> ForkServer:
        """Start a server: ``argv`` is this binary's command line for ``COMMAND`` without the
        control descriptor (``--control-fd N`` goes before its last word), ``env`` its
        environment (None: ours)."""
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        try:
            proc = subprocess.Popen(
                [*argv[:-1], "--control-fd", str(theirs.fileno()), argv[-1]],
                pass_fds=(theirs.fileno(),),
                stdin=subprocess.DEVNULL,
                env=env,
            )
        except BaseException:
            ours.close()
            raise
        finally:
            theirs.close()
        return cls(argv, env, ours, proc)

    @classmethod
    def fork(cls, argv: Sequence[str], run: Callable[[list[str]], int]) -> ForkServer:
        """Start a server as a fork of this process, which must be single-threaded with no event
        loop running (``start`` otherwise): it begins with every module imported so far, shared
        copy-on-write, so it neither starts an interpreter nor imports them again. ``run(args)``
        is meshctl's entry point (what ``argv``, the command line ``start`` would use, runs);
        the server keeps only stdio and its control socket of our descriptors."""
        if threading.active_count() != 1:
            return cls.start(argv)
        ours, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = os.fork()
        if pid == 0:  # the server: never returns
            code = 1
            try:
                ours.detach()
                control = theirs.detach()
                _place({control: control})  # closes ours, listeners, any handover memfd
                code = run([COMMAND, "--control-fd", str(control), argv[-1]])
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
            except BaseException:  # noqa: BLE001 (what a fresh process would print)
                traceback.print_exc()
            finally:
                os._exit(code)
        theirs.close()
        return cls(argv, None, ours, _Adopted(pid))

    def retire(self) -> None:
        """Let the server go (it exits as its socket closes; ``alive``/``close`` reap it). Its
        workers stay, sharing what they still share, and become ours (``become_subreaper``)."""
        # shutdown first: a spawn blocked in another thread wakes (end of file) instead of
        # waiting on a descriptor closed under it.
        with contextlib.suppress(OSError):
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()

    @property
    def pid(self) -> int:
        return self._proc.pid

    def alive(self) -> bool:
        return self._proc.poll() is None

    def restart(self) -> ForkServer:
        """Another server like this one (after this one died)."""
        return ForkServer.start(self._argv, self._env)

    def spawn(
        self, args: Sequence[str], fds: Sequence[int], env: Mapping[str, str], timeout: float
    ) -> ForkedProcess:
        """Fork a worker running ``meshctl ARGS`` with ``fds`` at their numbers and ``env``.

        Blocks until the server answers (at first it is still importing: up to ``timeout`` s);
        an ``OSError`` when it is gone or says no.
        """
        request = json.dumps({"args": list(args), "fds": list(fds), "env": dict(env)}).encode()
        with self._lock:
            self._sock.settimeout(timeout)
            rights = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds))] if fds else []
            self._sock.sendmsg([request], rights)
            data, ancillary, _, _ = self._sock.recvmsg(_MAX_PACKET, socket.CMSG_SPACE(8))
        received = _descriptors(ancillary)
        if not data:
            _close(received)
            raise ConnectionError(f"the fork server (pid {self._proc.pid}) exited")
        try:
            answer = json.loads(data)
        except ValueError:
            answer = {"error": f"unreadable answer {data[:80]!r}"}
        if "pid" not in answer or len(received) != 2:
            _close(received)
            raise OSError(f"the fork server could not start a worker: {answer.get('error')}")
        return ForkedProcess(int(answer["pid"]), received[0], received[1])

    def close(self, timeout: float = 2.0) -> None:
        """End the server (its workers are not touched: each has its own supervisor channel)."""
        self.retire()
        try:
            self._proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self._proc.kill()
            self._proc.wait()


class _Adopted:
    """A child forked here (no ``Popen``): waited for by its pid."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._lock = threading.Lock()  # one waitpid at a time: the other sees its result

    def poll(self) -> int | None:
        with self._lock:
            return self._poll()

    def _poll(self) -> int | None:
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # not ours after all: treat as gone
                self.returncode = -1
            else:
                if pid:
                    self.returncode = os.waitstatus_to_exitcode(status)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.poll() is None:
            if deadline is not None and time.monotonic() >= deadline:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            time.sleep(0.01)
        assert self.returncode is not None  # noqa: S101 (poll set it)
        return self.returncode

    def kill(self) -> None:
        if self.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.pid, signal.SIGKILL)  # our unreaped child: the pid is still its


def become_subreaper() -> bool:
    """Make this process the parent of orphaned descendants (prctl PR_SET_CHILD_SUBREAPER): a
    fork server's workers outliving it are then our children, waited for with their status."""
    return _prctl(_PR_SET_CHILD_SUBREAPER, 1)


def _set_name(name: str) -> bool:
    """This process's name in ``ps``/``top`` (``/proc/PID/comm``, 15 bytes): a worker's
    command line is its server's (a fork), its name says which it is."""
    import ctypes

    return _prctl(_PR_SET_NAME, ctypes.c_char_p(name.encode()[:15]))


def _prctl(option: int, value: object) -> bool:
    import ctypes

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(option, value, 0, 0, 0)) == 0
    except (OSError, AttributeError, ctypes.ArgumentError):
        return False


_PR_SET_NAME = 15
_PR_SET_CHILD_SUBREAPER = 36


def _descriptors(ancillary: list[tuple[int, int, bytes]]) -> list[int]:
    fds = array.array("i")
    for level, kind, data in ancillary:
        if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
            fds.frombytes(data[: len(data) - len(data) % fds.itemsize])
    return list(fds)


def _close(fds: Sequence[int]) -> None:
    for fd in fds:
        with contextlib.suppress(OSError):
            os.close(fd)


# -- the server's side ---------------------------------------------------------------------------


def main(
    argv: list[str], *, preload: Callable[[str], None], run: Callable[[list[str]], int]
) -> int:
    """``meshctl fork-server --control-fd N COMMAND``: ``preload(COMMAND)``, then serve forks
    whose workers run ``run(args)``."""
    if len(argv) != 3 or argv[0] != "--control-fd" or not argv[1].isdigit():
        raise UserError(
            f"{COMMAND}: expected --control-fd N COMMAND, got {' '.join(argv) or 'nothing'}",
            hint="this command is started by a supervisor ('meshctl ztunnel run'), not by hand",
        )
    try:
        control = socket.socket(fileno=int(argv[1]))
    except OSError as exc:
        raise UserError(
            f"{COMMAND}: --control-fd {argv[1]}: {exc.strerror or exc}",
            hint="this command is started by a supervisor ('meshctl ztunnel run'), not by hand",
        ) from exc
    # Ctrl-C reaches the whole process group: the supervisor drains its workers, and this
    # server ends when the supervisor closes its socket (workers get the default back).
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _set_name(COMMAND)
    preload(argv[2])
    gc.collect()
    gc.freeze()  # what the workers share: never scanned (hence never written) by a collection
    return _Server(control, run).serve()


class _Server:
    def __init__(self, control: socket.socket, run: Callable[[list[str]], int]) -> None:
        self._control = control
        self._run = run
        self._status: dict[int, int] = {}  # worker pid -> write end of its status pipe
        self._wake_r, self._wake_w = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)

    def serve(self) -> int:
        # SIGCHLD wakes the loop through the pipe (the handler itself does nothing).
        signal.set_wakeup_fd(self._wake_w)
        signal.signal(signal.SIGCHLD, lambda _sig, _frame: None)
        poller = select.poll()
        poller.register(self._control.fileno(), select.POLLIN)
        poller.register(self._wake_r, select.POLLIN)
        while True:
            self._reap()
            for fd, _ in poller.poll():
                if fd == self._wake_r:
                    with contextlib.suppress(BlockingIOError):
                        os.read(self._wake_r, 512)
                elif not self._request():
                    return 0

    def _request(self) -> bool:
        """Answer one request; False when the supervisor has gone."""
        space = socket.CMSG_SPACE(_MAX_FDS * array.array("i").itemsize)
        try:
            data, ancillary, _, _ = self._control.recvmsg(_MAX_PACKET, space)
        except ConnectionError:
            return False
        fds = _descriptors(ancillary)
        if not data:
            _close(fds)
            return False
        try:
            request = json.loads(data)
            targets = [int(n) for n in request["fds"]]  # as many as descriptors (strict zip)
            pid, pidfd, status_r = self._fork(
                [str(a) for a in request["args"]], dict(zip(targets, fds, strict=True)),
                {str(k): str(v) for k, v in request["env"].items()},
            )  # fmt: skip
        except (ValueError, KeyError, TypeError, OSError) as exc:
            with contextlib.suppress(OSError):
                self._control.send(json.dumps({"error": str(exc)}).encode())
            return True
        finally:
            _close(fds)
        rights = array.array("i", (pidfd, status_r))
        try:
            self._control.sendmsg(
                [json.dumps({"pid": pid}).encode()],
                [(socket.SOL_SOCKET, socket.SCM_RIGHTS, rights)],
            )
        except OSError:
            # The supervisor went while we forked: nobody would ever feed or stop this worker.
            with contextlib.suppress(OSError):
                signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            return False
        finally:
            _close((pidfd, status_r))
        return True

    def _fork(
        self, args: list[str], fds: dict[int, int], env: dict[str, str]
    ) -> tuple[int, int, int]:
        status_r, status_w = os.pipe2(os.O_CLOEXEC)
        try:
            pid = os.fork()
        except OSError:
            _close((status_r, status_w))
            raise
        if pid == 0:
            self._become_worker(args, fds, env)  # never returns
        # Before the loop can reap it: the pid cannot be recycled while it is our zombie.
        pidfd = os.pidfd_open(pid)
        self._status[pid] = status_w
        return pid, pidfd, status_r

    def _reap(self) -> None:
        while self._status:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            status_w = self._status.pop(pid, None)
            if status_w is not None:
                with contextlib.suppress(OSError):  # the supervisor no longer listens
                    os.write(status_w, status.to_bytes(_STATUS, sys.byteorder, signed=True))
                os.close(status_w)

    def _become_worker(self, args: list[str], fds: dict[int, int], env: dict[str, str]) -> None:
        """In the forked child: become ``meshctl ARGS`` as a fresh process would, then exit."""
        code = 1
        try:
            self._control.detach()  # its number may become one of the worker's: never close it
            signal.set_wakeup_fd(-1)
            signal.signal(signal.SIGCHLD, signal.SIG_DFL)
            signal.signal(signal.SIGINT, signal.default_int_handler)
            _place(fds)
            _set_name(args[0] if args else "worker")
            os.environ.clear()
            os.environ.update(env)
            sys.argv = [sys.argv[0], *args]
            code = self._run(args)
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        except BaseException:  # noqa: BLE001 (what an uncaught exception does in a fresh process)
            traceback.print_exc()
        finally:
            logging.shutdown()  # the deferred log lines (meshctl.logs), as at a normal exit
            with contextlib.suppress(Exception):
                sys.stdout.flush()
                sys.stderr.flush()
            os._exit(code)


def _place(fds: dict[int, int]) -> None:
    """Put each received descriptor at its number; close every other one but stdio."""
    high = max([*fds, *fds.values(), 2]) + 1
    moved = {target: fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, high) for target, fd in fds.items()}
    for target, fd in moved.items():
        os.dup2(fd, target)  # inheritable, as pass_fds leaves them
    keep = sorted({0, 1, 2, *fds})
    limit = max(os.sysconf("SC_OPEN_MAX"), keep[-1] + 1)
    for low, next_kept in zip(keep, [*keep[1:], limit], strict=True):
        os.closerange(low + 1, next_kept)
