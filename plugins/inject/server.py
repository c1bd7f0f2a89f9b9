"""``meshctl inject webhook``: HTTPS serving of the injection handler, HTTP/2 and HTTP/1.1.

Owns only I/O: TLS, HTTP framing, the body size limit, signals and the drain on shutdown. What an
AdmissionReview gets back is decided by ``meshctl.core.inject.admission.handle`` (pure), so the
control plane can host the same handler.

Why hypercorn: the API server talks HTTP/2 or HTTP/1.1 to webhooks, chosen by ALPN. Hypercorn is
a maintained ASGI server built on the sans-IO h2 and h11 libraries (the same h2 the data plane
uses), and does ALPN, HTTP/2 flow control and stream limits, keep-alive and graceful shutdown.
A thin asyncio shell over h2 + h11 of our own would repeat all that for no gain on a path that
serves a few requests per pod creation.

Invariants: listens only where told; every request gets an answer (a handler bug is a 500, see
admission.py); bodies over ``MAX_BODY_BYTES`` are refused with 413 without being read in full;
SIGTERM/SIGINT stop accepting, let in-flight requests finish for ``graceful_seconds``, and the
process is gone one second after that at the latest (idle keep-alive connections included); a
rotated certificate (the files change) serves new connections within ``reload_seconds``, while
a pair that does not load leaves the old one in service.
"""

from __future__ import annotations

import asyncio
import gc
import ipaddress
import logging
import os
import signal
import socket
import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config
from hypercorn.logging import Logger
from hypercorn.typing import ASGIReceiveCallable, ASGISendCallable, Scope

from meshctl import logs
from meshctl.core.inject.admission import MAX_BODY_BYTES, Answer, Request, handle
from meshctl.core.inject.settings import InjectSettings
from meshctl.errors import MeshctlError
from meshctl.net.sockets import address_text, listener

log = logging.getLogger(__name__)

WHAT = "injection webhook"  # how the listening and ready lines name this daemon


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


class WebhookApp:
    """The ASGI application: collects the body, calls the pure handler, sends its answer."""

    def __init__(self, settings: InjectSettings) -> None:
        self._settings = settings

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "lifespan":
            await _lifespan(receive, send)
            return
        if scope["type"] != "http":
            return  # websockets are not offered (no upgrade is ever accepted)
        content_type = None
        for name, value in scope["headers"]:
            if name.lower() == b"content-type":
                content_type = value.decode("latin-1")
        body = await _read_body(receive, MAX_BODY_BYTES)
        if body is None:
            answer = Answer(413, b"body too large\n", "text/plain")
        else:
            # Injection is CPU work of about a millisecond: running it inline on the loop is
            # cheaper than a thread hop, and keeps requests on one connection in order.
            answer = handle(
                Request(scope["method"], scope["path"], content_type, body), self._settings
            )
        headers = [
            (b"content-type", answer.content_type.encode()),
            (b"content-length", str(len(answer.body)).encode()),
            *((k.lower().encode(), v.encode()) for k, v in answer.headers),
        ]
        await send({"type": "http.response.start", "status": answer.status, "headers": headers})
        await send({"type": "http.response.body", "body": answer.body, "more_body": False})


async def _read_body(receive: ASGIReceiveCallable, limit: int) -> bytes | None:
    """The whole request body, or None once it exceeds ``limit`` (the rest is not kept)."""
    chunks: list[bytes] = []
    size = 0
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks)  # the client went away; the answer goes nowhere
        chunk = message.get("body", b"")
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
        if not message.get("more_body", False):
            return b"".join(chunks)


async def _lifespan(receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


class _ReloadableConfig(Config):
    """hypercorn's configuration, remembering the TLS contexts it hands out so that a rotated
    certificate can be loaded into them: new handshakes get it, open connections keep theirs."""

    def __init__(self) -> None:
        super().__init__()
        self.contexts: list[ssl.SSLContext] = []

    def create_ssl_context(self) -> ssl.SSLContext | None:
        context = super().create_ssl_context()
        if context is not None:
            self.contexts.append(context)
        return context


class _ReadyLog(Logger):
    """hypercorn's log, whose "Running on ..." (sockets served, TLS on) becomes our one ready
    line; the listening line was logged when we bound the socket."""

    async def info(self, message: str, *args: Any, **kwargs: Any) -> None:
        if message.startswith("Running on"):
            logs.ready(log, WHAT, "serving /inject over HTTP/2 and HTTP/1.1")
            return
        await super().info(message, *args, **kwargs)


def config_for(options: ServeOptions, sock: socket.socket | None = None) -> _ReloadableConfig:
    """The hypercorn configuration: TLS with ALPN h2 then http/1.1, no access log; serving
    ``sock`` (already listening) when given, else binding ``options.address``."""
    check_tls_files(options.tls_cert, options.tls_key)
    config = _ReloadableConfig()
    if sock is not None:
        # hypercorn wraps the descriptor in its own socket object and closes it at shutdown.
        config.bind = [f"fd://{sock.detach()}"]
        config.logger_class = _ReadyLog
    else:
        config.bind = [_bind_name(options.address, options.port)]
    config.certfile = str(options.tls_cert)
    config.keyfile = str(options.tls_key)
    config.alpn_protocols = ["h2", "http/1.1"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # our handlers and format
    config.graceful_timeout = options.graceful_seconds
    config.read_timeout = options.read_timeout_seconds
    config.include_server_header = False
    return config


def check_tls_files(cert: Path, key: Path) -> None:
    """Fails with a one-line error unless ``cert`` and ``key`` load as a matching pair."""
    for what, path in (("certificate", cert), ("key", key)):
        if not path.is_file():  # ssl's own error names no file ("None")
            raise MeshctlError(
                f"TLS {what} file {path} does not exist",
                hint="pass the webhook's serving certificate and key with --tls-cert and --tls-key",
            )
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(str(cert), str(key))
    except (OSError, ssl.SSLError) as exc:
        raise MeshctlError(
            f"cannot load the TLS certificate {cert} with key {key}: {exc.strerror or exc}",
            hint="both must be PEM files, and the key must belong to the certificate",
        ) from exc


def _stamp(paths: tuple[Path, ...]) -> tuple[tuple[int, int, int], ...] | None:
    """What changes when a file is rewritten or a Secret volume swaps its ``..data`` link."""
    try:
        return tuple((st.st_ino, st.st_mtime_ns, st.st_size) for st in map(os.stat, paths))
    except OSError:
        return None  # mid-rotation: look again next time


async def _reload_certificates(config: _ReloadableConfig, options: ServeOptions) -> None:
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


def _bind_name(host: str, port: int) -> str:
    if ":" in host:  # an IPv6 literal needs brackets in hypercorn's bind syntax
        host = f"[{ipaddress.ip_address(host)}]"
    return f"{host}:{port}"


def serve(settings: InjectSettings, options: ServeOptions) -> None:
    """Serves until SIGTERM or SIGINT, then drains for at most ``options.graceful_seconds``;
    a rotated certificate is picked up within ``options.reload_seconds``. Logs one line once
    listening and one once serving (at info, the daemons' default level)."""
    check_tls_files(options.tls_cert, options.tls_key)  # before the port is taken
    sock = listener(
        options.address, options.port, what=WHAT, in_use_hint="stop what uses it, or give --port"
    )
    where = address_text(sock)
    logs.listening(log, WHAT, [f"https://{where}/inject"])
    config = config_for(options, sock)
    try:
        asyncio.run(_serve(WebhookApp(settings), config, options))
    except OSError as exc:
        raise MeshctlError(f"the {WHAT} on {where} failed: {exc.strerror or exc}") from exc


async def _serve(app: WebhookApp, config: _ReloadableConfig, options: ServeOptions) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    # Everything imported so far lives as long as the process: keep it out of the collector's
    # full passes, which otherwise show up as the slowest requests (the p99 tail).
    gc.freeze()
    serving = asyncio.ensure_future(hypercorn_serve(app, config, shutdown_trigger=stop.wait))
    reloading = asyncio.ensure_future(_reload_certificates(config, options))
    serving.add_done_callback(lambda _: reloading.cancel())
    stopping = asyncio.ensure_future(stop.wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    if serving.done():  # failed to start (a bind error): report it
        stopping.cancel()
        serving.result()
        return
    # hypercorn stops accepting and lets in-flight requests finish for graceful_timeout. An idle
    # keep-alive client (the API server keeps them) can then still hold the TLS close for
    # asyncio's 30 s SSL shutdown timeout: the drain deadline ends that wait. Returning cancels
    # what is left (asyncio.run cancels remaining tasks).
    done, _ = await asyncio.wait({serving}, timeout=config.graceful_timeout + 1.0)
    if not done:
        log.warning("drain deadline passed: closing the remaining connections")
        serving.cancel()
    log.info("%s stopped", WHAT)
