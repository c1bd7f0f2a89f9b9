"""The error family every layer raises and the CLI renders.

Invariant: an expected failure is a ``MeshctlError`` with a one-line message, an optional hint and
an exit code (1 runtime, 2 usage, 3 a check found problems). Foreign exceptions are translated once,
at the adapter that caught them (``raise UserError(...) from exc``), never deeper.
"""

from __future__ import annotations

EXIT_RUNTIME = 1
EXIT_USAGE = 2
EXIT_CHECK_FAILED = 3


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
