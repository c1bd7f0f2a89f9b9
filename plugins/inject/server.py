"""``meshctl inject webhook``: the injection webhook served from certificate files.

Owns what only the standalone command does: certificate files given by flags and their rotation
(checked every ``reload_seconds``), signals, and the process's life. Serving itself (TLS, HTTP/2
and HTTP/1.1, body limit, drain) is ``meshctl.webhook``, shared with the control plane.

Invariants: listens only where told; SIGTERM/SIGINT stop accepting, let in-flight requests finish
for ``graceful_seconds``, and the process is gone one second after that at the latest; a rotated
certificate (the files change) serves new connections within ``reload_seconds``, while a pair
that does not load leaves the old one in service.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypercorn.logging import Logger

from meshctl import logs, webhook
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.errors import MeshctlError
from meshctl.net.sockets import listener
from meshctl.shutdown import StopSignals

log = logging.getLogger(__name__)
WHAT = "injection webhook"  # how the listening and ready lines name this daemon

# Kept importable from here for callers of the standalone server.
WebhookApp = webhook.WebhookApp
check_tls_files = webhook.check_tls_files


@dataclass(frozen=True, slots=True, kw_only=True)
class ServeOptions:
    """Where and how to listen."""

    address: str
    port: int
    tls_cert: Path
    tls_key: Path
    graceful_seconds: float = 5.0
    read_timeout_seconds: int = 30  # a client that stops sending mid-request is dropped
    reload_seconds: float = 2.0  # how often the certificate files are checked for a rotation


class _ReadyLog(Logger):
    """hypercorn's log, whose "Running on ..." (sockets served, TLS on) becomes our one ready
    line; the listening line was logged when we bound the socket."""

    async def info(self, message: str, *args: Any, **kwargs: Any) -> None:
        if message.startswith("Running on"):
            logs.ready(log, WHAT, "serving /inject over HTTP/2 and HTTP/1.1")
            return
        await super().info(message, *args, **kwargs)


def config_for(options: ServeOptions) -> webhook.TlsConfig:
    """The hypercorn configuration for ``options`` (TLS from the files, ALPN h2, http/1.1).

    The files are checked before the port is taken, and the socket is bound here with an error
    that says why it could not be (port taken, not this host's address, privileged port)."""
    check_tls_files(options.tls_cert, options.tls_key)
    sock = listener(
        options.address, options.port, what=WHAT, in_use_hint="stop what uses it, or give --port"
    )
    config = webhook.config_for(
        options.address,
        options.port,
        tls_cert=options.tls_cert,
        tls_key=options.tls_key,
        graceful_seconds=options.graceful_seconds,
        read_timeout_seconds=options.read_timeout_seconds,
        sock=sock,
    )
    config.logger_class = _ReadyLog
    return config


def _stamp(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int], ...] | None:
    """What changes when a file is rewritten or a Secret volume swaps its ``..data`` link."""
    try:
        return tuple((st.st_ino, st.st_mtime_ns, st.st_size) for st in map(os.stat, paths))
    except OSError:
        return None  # mid-rotation: look again next time


async def _reload_certificates(config: webhook.TlsConfig, options: ServeOptions) -> None:
    """Load a rotated serving certificate (cert-manager, a Secret update) without a restart.

    A pair that does not load (half written, key not matching) is refused with a warning and
    the old certificate stays in service; the files are tried again when they change again.
    """
    paths = (options.tls_cert, options.tls_key)
    seen = _stamp(paths)
    while True:
        await asyncio.sleep(options.reload_seconds)
        stamp = _stamp(paths)
        if stamp is None or stamp == seen:
            continue
        seen = stamp
        try:
            check_tls_files(options.tls_cert, options.tls_key)
            for context in config.contexts:
                context.load_cert_chain(str(options.tls_cert), str(options.tls_key))
        except (MeshctlError, OSError, ssl.SSLError) as exc:
            message = exc.message if isinstance(exc, MeshctlError) else str(exc)
            log.warning("rotated certificate not loaded, still serving the old one: %s", message)
            continue
        log.info("serving certificate reloaded from %s", options.tls_cert)


def serve(settings: InjectSettings, options: ServeOptions) -> int:
    """Serves until SIGTERM or SIGINT, then drains for at most ``options.graceful_seconds``;
    a rotated certificate is picked up within ``options.reload_seconds``. Logs one line once
    listening and one once serving (at info, the daemons' default level)."""
    config = config_for(options)
    logs.listening(log, WHAT, [f"https://{config.where}/inject"])
    return asyncio.run(_serve(webhook.WebhookApp(settings), config, options))


async def _serve(app: webhook.WebhookApp, config: webhook.TlsConfig, options: ServeOptions) -> int:
    stop = asyncio.Event()
    signals = StopSignals(stop.set)
    signals.install()
    # Everything imported so far lives as long as the process: keep it out of the collector's
    # full passes, which otherwise show up as the slowest requests (the p99 tail).
    gc.freeze()
    reloading = asyncio.ensure_future(_reload_certificates(config, options))
    try:
        await webhook.serve(app, config, stop)
    finally:
        reloading.cancel()
        signals.remove()
    log.info("%s stopped", WHAT)
    return signals.exit_code()
