"""The error family every layer raises and the CLI renders.

Invariant: an expected failure is a ``MeshctlError`` with a one-line message, an optional hint and
an exit code (1 runtime, 2 usage, 3 a check found problems). Foreign exceptions are translated once,
at the adapter that caught them (``raise UserError(...) from exc``), never deeper.
"""

from __future__ import annotations

import errno

# The exit codes of every command (docs/cli.md has the table; tests/cli/test_exit_codes.py walks
# the commands): nothing else decides them.
EXIT_OK = 0
EXIT_RUNTIME = 1  # the world failed: the cluster, the kernel, a peer, a port in use, a timeout
EXIT_USAGE = 2  # the command line, an env var, the settings file or an input file is unusable
EXIT_CHECK_FAILED = 3  # verify, demo --check, iptables check: the check ran and found problems
EXIT_NOT_EXECUTABLE = 126  # demo exec: the command exists but cannot be run (as a shell says)
EXIT_NOT_FOUND = 127  # demo exec: no such command
EXIT_INTERRUPTED = 130  # Ctrl-C (SIGINT), daemons included once they have stopped: 128 + 2


class MeshctlError(Exception):
    """Root of every error meshctl expects; rendered as ``Error: ...`` / ``Hint: ...``."""

    exit_code: int = EXIT_RUNTIME

    def __init__(
        self, message: str, *, hint: str | None = None, exit_code: int | None = None
    ) -> None:
        super().__init__(message)
        self.message = _one_line(message)
        self.hint = _one_line(hint) if hint else None
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        return self.message


class UserError(MeshctlError):
    """Bad input from the user: flags, files, env vars, annotations (exit 2)."""

    exit_code = EXIT_USAGE


class ConfigError(UserError):
    """A settings source (flag, env var, file) holds a value we cannot use."""


class KubeError(MeshctlError):
    """The Kubernetes API could not be reached or refused a request (exit 1)."""


class NetError(MeshctlError):
    """The kernel refused a network change (netns, link, iptables) (exit 1)."""


class PortInUseError(MeshctlError):
    """The port is bound already (another process, or another instance of this one): the
    machine's state, not a mistake in the command line (exit 1)."""


def listen_failed(where: str, what: str, code: int | None, detail: str = "") -> MeshctlError:
    """The one wording of "cannot listen" for every server (sockets, gRPC, hypercorn):
    ``where`` is ``HOST:PORT``, ``what`` the listener's role, ``code`` the bind's errno."""
    head = f"cannot listen on {where}" + (f" ({what})" if what else "")
    if code == errno.EADDRINUSE:
        return PortInUseError(
            f"{head}: the port is already in use",
            hint="stop what is using it (ss -ltnp shows it), or choose another port",
        )
    if code == errno.EADDRNOTAVAIL:
        host = where.rpartition(":")[0].strip("[]")
        return UserError(
            f"{head}: {host} is not an address of this host",
            hint="give one of this host's addresses, or 0.0.0.0 (or ::) for all of them",
        )
    if code == errno.EACCES:
        return UserError(
            f"{head}: permission denied",
            hint="ports below 1024 need root or CAP_NET_BIND_SERVICE; choose another port",
        )
    return MeshctlError(f"{head}: {detail or 'bind failed'}")


class CheckFailedError(MeshctlError):
    """A check ran and found problems (exit 3); the details went to stdout already."""

    exit_code = EXIT_CHECK_FAILED


_MAX_MESSAGE = 500


def format_error(message: str, hint: str | None = None) -> str:
    """The two stderr lines every entry point prints for an expected failure."""
    text = f"Error: {_one_line(message)}\n"
    if hint:
        text += f"Hint: {_one_line(hint)}\n"
    return text


def _one_line(text: str) -> str:
    """Fold a message to one line and cap its length so echoed peer bodies stay readable."""
    flat = " ".join(text.split())
    if len(flat) > _MAX_MESSAGE:
        flat = flat[: _MAX_MESSAGE - 3] + "..."
    return flat
