"""The handover from ``ztunnel run`` to the ``ztunnel-supervisor`` it execs itself into.

Owns what crosses the exec: the settings the CLI resolved, the listening descriptors by role, a
sidecar's checked certificates with the files' digest then, and the log settings, as JSON in an
inherited memfd. Invariants: ``from_json(to_json(h)) == h``, byte for byte the settings the CLI
resolved; nothing here imports the CLI's libraries (the supervisor stays lean).
"""

from __future__ import annotations

import dataclasses
import json
import os

from meshctl.core.wire import channel

from ..settings import ZtunnelSettings

COMMAND = "ztunnel-supervisor"
DATAPLANE_COMMAND = "ztunnel-dataplane"  # the workers' raw command (its fork server preloads it)


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
