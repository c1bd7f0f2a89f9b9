"""``meshctl ztunnel-supervisor``: the supervisor, without the CLI (exec'd by ``ztunnel run``).

``ztunnel run`` does everything a user sees (flags, settings, the checks of every source its mode
uses, binding the ports) and then replaces itself (``execv``: same pid, same signals) with
this raw command, handing over a ``Handover`` (``handover.py``) in an inherited memfd and the
listening sockets as inherited descriptors. The CLI's libraries (typer, click, pydantic) and the
X.509 one stay behind: the supervisor runs for the pod's life, and they were most of its memory.
Both modes (sidecar, node) run here; ``modes`` builds their sources.
Invariants: the supervisor sees the settings the CLI resolved, byte for byte; a sidecar with
mounted certificates imports the X.509 library only when they change; ``main`` returns the
supervisor's exit code.
"""

from __future__ import annotations

import argparse
import logging
import os

from meshctl import logs
from meshctl.config import LOG_FORMATS, LOG_LEVELS
from meshctl.errors import UserError

from .handover import COMMAND, DATAPLANE_COMMAND, Handover

log = logging.getLogger(__name__)


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UserError(
            f"{COMMAND}: {message}", hint="this command is started by 'meshctl ztunnel run'"
        )


def main(argv: list[str]) -> int:
    """Read the handover and supervise the data plane until drained."""
    parser = _Parser(prog=f"meshctl {COMMAND}", description=__doc__.splitlines()[0])
    parser.add_argument("--handover-fd", type=int, required=True)
    args = parser.parse_args(argv)
    try:
        with os.fdopen(args.handover_fd, "r") as handle:
            handover = Handover.from_json(handle.read())
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise UserError(
            f"{COMMAND}: unreadable handover: {exc}",
            hint="this command is started by 'meshctl ztunnel run'",
        ) from exc
    levels = (handover.log_level, handover.dataplane_log_level)
    if not set(levels) <= set(LOG_LEVELS) or handover.log_format not in LOG_FORMATS:
        raise UserError(f"{COMMAND}: bad log settings in the handover")
    logs.configure(handover.log_level, handover.log_format)
    return supervise(handover)


def supervise(handover: Handover) -> int:
    """Run the data-plane workers of ``handover``'s mode; the exit code."""
    from meshctl.forkserver import ForkServer
    from meshctl.process import start_fork_server

    # First, before this process starts a thread or an event loop: a fork of it that keeps what
    # it has imported and imports the data plane while this process builds its sources (side by
    # side on two cores); the workers are then forks of that, not fresh starts.
    raise_fd_limit()  # before the fork server: it and the workers inherit it
    server: ForkServer | None = None
    try:
        server = start_fork_server(DATAPLANE_COMMAND)
    except OSError as exc:
        log.warning("no fork server (%s): each data-plane worker starts afresh", exc)
    from . import modes

    if handover.settings.node_mode:
        return modes.run_node(handover, server)
    return modes.run_sidecar(handover, server)


def raise_fd_limit() -> None:
    """Take the hard descriptor limit as the soft one. In node mode this process holds every
    served pod's netns and listeners (4 descriptors a pod, 7 with IPv6), and a descriptor it
    cannot receive drops the node agent's connection: under systemd's default soft limit of 1024
    a node stopped at 250 pods (bench_scale_nodeproxy)."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < hard:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
        except (OSError, ValueError) as exc:  # an unlimited hard limit above fs.nr_open
            log.warning("descriptor limit left at %d (cannot raise it: %s)", soft, exc)
