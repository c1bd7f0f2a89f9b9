"""``meshctl ztunnel-supervisor``: the supervisor, without the CLI (exec'd by ``ztunnel run``).

``ztunnel run`` does everything a user sees (flags, settings, the checks of every source its mode
uses, binding the ports) and then replaces itself (``execv``: same pid, same signals) with
this raw command, handing over a ``Handover`` in an inherited memfd and the listening sockets as
inherited descriptors. The CLI's libraries (typer, click, pydantic) and the X.509 one stay
behind: the supervisor runs for the pod's life, and they were most of its memory. Both modes
(sidecar, node) run here; ``modes`` builds their sources.
Invariants: the supervisor sees the settings the CLI resolved, byte for byte; a sidecar with
mounted certificates imports the X.509 library only when they change; ``main`` returns the
supervisor's exit code.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from meshctl import logs
from meshctl.config import LOG_FORMATS, LOG_LEVELS
from meshctl.core.wire import channel
from meshctl.errors import UserError

from ..settings import ZtunnelSettings

COMMAND = "ztunnel-supervisor"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Handover:
    """What ``ztunnel run`` resolved and checked, for the supervisor it becomes."""

    settings: ZtunnelSettings
    listeners: dict[str, int]  # role -> inherited descriptor
    # A sidecar's mounted certificates, read and checked, with the files' digest then; None
    # when they come from elsewhere (the CA, node mode's issuer).
    certs: channel.Certs | None
    cert_digest: str
    log_level: str  # the supervisor's
    dataplane_log_level: str  # its workers' (at info they log every connection)
    log_format: str

    def to_json(self) -> str:
        # The channel's own form of the certificates (the length prefix cut).
        body = None if self.certs is None else channel.encode(self.certs)[4:].decode()
        return json.dumps(
            {
                "settings": dataclasses.asdict(self.settings),
                "listeners": self.listeners,
                "certs": body,
                "certDigest": self.cert_digest,
                "logLevel": self.log_level,
                "dataplaneLogLevel": self.dataplane_log_level,
                "logFormat": self.log_format,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Handover:
        doc = json.loads(text)
        certs = None if doc["certs"] is None else channel.decode(doc["certs"].encode())
        if certs is not None and not isinstance(certs, channel.Certs):
            raise TypeError("handover with something else than certificates")
        return cls(
            settings=ZtunnelSettings(**doc["settings"]),
            listeners={str(k): int(v) for k, v in doc["listeners"].items()},
            certs=certs,
            cert_digest=str(doc["certDigest"]),
            log_level=str(doc["logLevel"]),
            dataplane_log_level=str(doc["dataplaneLogLevel"]),
            log_format=str(doc["logFormat"]),
        )


def become_supervisor(handover: Handover) -> None:
    """Replace this process with the lean supervisor (never returns; raises only if exec fails).

    The handover goes through a memfd (no file on disk, no pipe that a large certificate
    chain could fill before the exec); the listeners are inherited at their numbers.
    """
    from meshctl.process import self_command

    fd = os.memfd_create("meshctl-ztunnel-handover", 0)  # inheritable: no MFD_CLOEXEC
    os.write(fd, handover.to_json().encode())
    os.lseek(fd, 0, os.SEEK_SET)
    argv = self_command(COMMAND, "--handover-fd", str(fd))
    os.execv(argv[0], argv)  # noqa: S606 (our own binary, argv built here)


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
    from . import modes

    if handover.settings.node_mode:
        return modes.run_node(handover)
    return modes.run_sidecar(handover)
