"""``meshctl ztunnel-supervisor``: the supervisor, without the CLI (exec'd by ``ztunnel run``).

``ztunnel run`` does everything a user sees (flags, settings, certificate and local-config
checks, binding the ports) and then replaces itself (``execv``: same pid, same signals) with
this raw command, handing over a ``Handover`` in an inherited memfd and the listening sockets as
inherited descriptors. The CLI's libraries (typer, click, pydantic) and the X.509 one stay
behind: the supervisor runs for the pod's life, and they were most of its memory.
Invariants: the supervisor sees the settings the CLI resolved, byte for byte; the X.509 library
is imported here only when certificates change; ``main`` returns the supervisor's exit code.
"""

from __future__ import annotations

import argparse
import asyncio
import dataclasses
import json
import logging
import os
import shutil
import socket
import tempfile
from pathlib import Path

from meshctl import logs
from meshctl.config import LOG_FORMATS, LOG_LEVELS
from meshctl.core import channel
from meshctl.core.identity import SpiffeId, parse_workload_ref
from meshctl.errors import UserError

from ..settings import ZtunnelSettings, seconds
from ..sources import FileFeed

log = logging.getLogger("meshctl_plugins.ztunnel.cli")  # the messages users know from 'run'

COMMAND = "ztunnel-supervisor"
DATAPLANE_COMMAND = "ztunnel-dataplane"


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Handover:
    """What ``ztunnel run`` resolved and checked, for the supervisor it becomes."""

    settings: ZtunnelSettings
    listeners: dict[str, int]  # role -> inherited descriptor
    certs: channel.Certs
    cert_digest: str
    log_level: str
    log_format: str

    def to_json(self) -> str:
        body = channel.encode(self.certs)[4:].decode()  # the channel's own form (length cut)
        return json.dumps(
            {
                "settings": dataclasses.asdict(self.settings),
                "listeners": self.listeners,
                "certs": body,
                "certDigest": self.cert_digest,
                "logLevel": self.log_level,
                "logFormat": self.log_format,
            }
        )

    @classmethod
    def from_json(cls, text: str) -> Handover:
        doc = json.loads(text)
        certs = channel.decode(doc["certs"].encode())
        if not isinstance(certs, channel.Certs):
            raise TypeError("handover without certificates")
        return cls(
            settings=ZtunnelSettings(**doc["settings"]),
            listeners={str(k): int(v) for k, v in doc["listeners"].items()},
            certs=certs,
            cert_digest=str(doc["certDigest"]),
            log_level=str(doc["logLevel"]),
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
    if handover.log_level not in LOG_LEVELS or handover.log_format not in LOG_FORMATS:
        raise UserError(f"{COMMAND}: bad log settings in the handover")
    logs.configure(handover.log_level, handover.log_format)
    return supervise(handover)


def supervise(handover: Handover) -> int:
    """Run the data-plane workers with ``handover``'s settings; the exit code."""
    from meshctl.process import Supervisor, self_command

    settings = handover.settings
    ref = settings.workload_ref()
    ns, _name, sa = parse_workload_ref(ref)
    identity = SpiffeId(settings.trust_domain, ns, sa)
    deadline = seconds(settings.drain_deadline, "drain deadline")
    handshake = seconds(settings.handshake_timeout, "handshake timeout")
    feed = FileFeed(
        cert_dir=Path(settings.cert_dir),
        local_config=Path(settings.local_config) if settings.local_config else None,
        identity=identity,
        certs=(handover.certs, handover.cert_digest),
    )
    listeners = {role: socket.socket(fileno=fd) for role, fd in handover.listeners.items()}

    def argv(channel_fd: int) -> list[str]:
        # The command name first: the data plane is a raw plugin and must not go through the
        # Typer root command, which global flags before it would (typer + pydantic: ~8 MB).
        return self_command(
            DATAPLANE_COMMAND,
            "--channel-fd",
            str(channel_fd),
            "--log-level",
            handover.log_level,
            "--log-format",
            handover.log_format,
        )

    # Every worker writes its counters here; worker 0 serves the sum (prometheus-client's
    # multiprocess mode, switched on for the children by the variable below).
    metrics_dir = tempfile.mkdtemp(prefix="meshctl-metrics-")

    def worker_exited(pid: int) -> None:
        from prometheus_client import multiprocess

        # Its live gauges no longer count (prometheus-client leaves this one unannotated).
        multiprocess.mark_process_dead(pid, metrics_dir)  # type: ignore[no-untyped-call]

    def proxy_config(worker: int, fds: dict[str, int]) -> channel.ProxyConfig:
        return channel.ProxyConfig(
            mode="sidecar",
            workload=ref,
            listeners=fds,
            cluster_id=settings.cluster_id,
            trust_domain=settings.trust_domain,
            pool_max_streams=settings.pool_max_streams,
            pool_idle_timeout=seconds(settings.pool_idle_timeout, "pool idle timeout"),
            drain_deadline=deadline,
            handshake_timeout=handshake,
            mark=settings.mark,
            worker=worker,
            workers=settings.workers,
            metrics_dir=metrics_dir,
            app_probers=settings.app_probers,
            pod_ip=settings.instance_ip,
            app_metrics=settings.app_metrics,
        )

    supervisor = Supervisor(
        argv=argv,
        config=proxy_config,
        listeners=listeners,
        feed=feed,
        drain_deadline=deadline,
        workers=settings.workers,
        extra_env={"PROMETHEUS_MULTIPROC_DIR": metrics_dir},
        on_exit=worker_exited,
        poll_interval=seconds(settings.reload_interval, "reload interval"),
    )
    log.info("serving %s as %s (pid %d)", ref, identity, os.getpid())
    try:
        return asyncio.run(supervisor.run())
    finally:
        for sock in listeners.values():
            sock.close()
        shutil.rmtree(metrics_dir, ignore_errors=True)
