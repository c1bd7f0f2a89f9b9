"""HTTPS serving of the injection webhook (HTTP/2 and HTTP/1.1), for every process that hosts it.

Owns only I/O: TLS (from files or from a key pair held in memory, swappable while serving), HTTP
framing, the body size limit and the drain on shutdown. What an AdmissionReview gets back is
decided by ``meshctl.core.k8s.inject.admission.handle`` (pure). ``meshctl inject webhook`` and the
control plane (``meshctl controlplane run``, port 15017) both serve through here.

Why hypercorn: the API server talks HTTP/2 or HTTP/1.1 to webhooks, chosen by ALPN. Hypercorn is
a maintained ASGI server built on the sans-IO h2 and h11 libraries (the same h2 the data plane
uses), and does ALPN, HTTP/2 flow control and stream limits, keep-alive and graceful shutdown.
A thin asyncio shell over h2 + h11 of our own would repeat all that for no gain on a path that
serves a few requests per pod creation.

Invariants: every request gets an answer (a handler bug is a 500, see admission.py); bodies over
``MAX_BODY_BYTES`` are refused with 413 without being read in full; ``serve`` stops accepting
when ``stop`` is set, lets in-flight requests finish for the graceful time and returns one
second after that at the latest (idle keep-alive connections included); a pair loaded with
``load_pair`` serves new connections at once while open ones keep theirs.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import socket
import ssl
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hypercorn.asyncio import serve as hypercorn_serve
from hypercorn.config import Config
from hypercorn.typing import ASGIFramework, ASGIReceiveCallable, ASGISendCallable, Scope

from meshctl import keypair
from meshctl.core.k8s.inject.admission import MAX_BODY_BYTES, Answer, Request, handle
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.errors import MeshctlError, UserError, listen_failed

log = logging.getLogger(__name__)


class WebhookApp:
    """The ASGI application: collects the body, calls the pure handler, sends its answer.

    ``settings`` is a callable so that a host can change the injection settings while serving.
    """

    def __init__(self, settings: InjectSettings | Callable[[], InjectSettings]) -> None:
        self._settings = settings if callable(settings) else (lambda: settings)

    async def __call__(
        self, scope: Scope, receive: ASGIReceiveCallable, send: ASGISendCallable
    ) -> None:
        if scope["type"] == "lifespan":
            await lifespan(receive, send)
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
                Request(scope["method"], scope["path"], content_type, body), self._settings()
            )
        headers = [
            (b"content-type", answer.content_type.encode()),
            (b"content-length", str(len(answer.body)).encode()),
            *((k.lower().encode(), v.encode()) for k, v in answer.headers),
        ]
        try:
            await send({"type": "http.response.start", "status": answer.status, "headers": headers})
            await send({"type": "http.response.body", "body": answer.body, "more_body": False})
        except OSError as exc:  # ssl.SSLError included: the peer broke the connection first
            log.info("webhook client went away before its answer: %s", exc)


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


async def lifespan(receive: ASGIReceiveCallable, send: ASGISendCallable) -> None:
    """The ASGI lifespan protocol for an app with nothing to set up or tear down."""
    while True:
        message = await receive()
        if message["type"] == "lifespan.startup":
            await send({"type": "lifespan.startup.complete"})
        elif message["type"] == "lifespan.shutdown":
            await send({"type": "lifespan.shutdown.complete"})
            return


@dataclass(frozen=True, slots=True)
class Pair:
    """A PEM certificate chain (leaf first) and its PEM key, held in memory."""

    cert_chain_pem: bytes
    key_pem: bytes


class BoundConfig(Config):
    """hypercorn's configuration over a socket we bound ourselves (``fd://``): a port in use
    is a one-line error when the configuration is made, not a failure inside a server task."""

    where = ""  # "host:port", for messages

    def bind_to(self, host: str, port: int) -> None:
        family = socket.AF_INET6 if ":" in host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        shown = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
        try:
            sock.bind((host, port))
            sock.listen(self.backlog)
        except OSError as exc:
            sock.close()
            raise listen_failed(shown, "", exc.errno, exc.strerror or str(exc)) from exc
        self.use(sock)

    def use(self, sock: socket.socket) -> None:
        """Serve on ``sock``, bound and listening already (by a caller with its own errors)."""
        host, port = sock.getsockname()[:2]
        self.where = f"[{host}]:{port}" if sock.family == socket.AF_INET6 else f"{host}:{port}"
        # hypercorn wraps the descriptor in a socket of its own; ours lets go of it.
        self.bind = [f"fd://{sock.detach()}"]


class TlsConfig(BoundConfig):
    """hypercorn's configuration, remembering the TLS contexts it hands out so that a rotated
    certificate can be loaded into them: new handshakes get it, open connections keep theirs.
    The pair comes from ``certfile``/``keyfile`` or, when ``pair`` is set, from memory."""

    def __init__(self, pair: Pair | None = None) -> None:
        super().__init__()
        self.contexts: list[ssl.SSLContext] = []
        self.pair = pair

    @property
    def ssl_enabled(self) -> bool:
        return self.pair is not None or super().ssl_enabled

    def create_ssl_context(self) -> ssl.SSLContext | None:
        context = super().create_ssl_context()
        if context is not None:
            if self.pair is not None:
                load_into(context, self.pair)
            self.contexts.append(context)
        return context

    def load_pair(self, pair: Pair) -> None:
        """Serve ``pair`` on new connections (raises ``MeshctlError`` if it does not load)."""
        check = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        load_into(check, pair)
        self.pair = pair
        for context in self.contexts:
            load_into(context, pair)


def load_into(context: ssl.SSLContext, pair: Pair) -> None:
    try:
        keypair.load_key_pair(context, pair.cert_chain_pem, pair.key_pem)
    except ssl.SSLError as exc:
        raise MeshctlError(
            f"the serving certificate does not load: {exc}",
            hint="the key must belong to the first certificate of the chain",
        ) from exc


def plain_config(address: str, port: int, *, graceful_seconds: float = 1.0) -> BoundConfig:
    """A plain-HTTP configuration (HTTP/1.1, h2c) bound now, for status and metrics ports."""
    config = BoundConfig()
    config.bind_to(str(ipaddress.ip_address(address)), port)
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = graceful_seconds
    config.include_server_header = False
    return config


def config_for(
    address: str,
    port: int,
    *,
    tls_cert: Path | None = None,
    tls_key: Path | None = None,
    pair: Pair | None = None,
    graceful_seconds: float = 5.0,
    read_timeout_seconds: int = 30,
    sock: socket.socket | None = None,
) -> TlsConfig:
    """The hypercorn configuration: TLS with ALPN h2 then http/1.1, no access log; serving
    ``sock`` (bound and listening) when given, else bound to ``address``:``port`` now."""
    if pair is None:
        if tls_cert is None or tls_key is None:
            raise MeshctlError("no serving certificate", hint="pass --tls-cert and --tls-key")
        check_tls_files(tls_cert, tls_key)
    config = TlsConfig(pair)
    if sock is not None:
        config.use(sock)
    else:
        config.bind_to(str(ipaddress.ip_address(address)), port)
    if pair is None:
        config.certfile = str(tls_cert)
        config.keyfile = str(tls_key)
    config.alpn_protocols = ["h2", "http/1.1"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")  # our handlers and format
    config.graceful_timeout = graceful_seconds
    config.read_timeout = read_timeout_seconds  # a client that stops mid-request is dropped
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
        # A password callback, so an encrypted key is an error here, never a terminal prompt.
        context.load_cert_chain(str(cert), str(key), password=lambda: b"")
    except ssl.SSLError as exc:
        raise _unusable_pair(cert, key) from exc
    except OSError as exc:
        raise UserError(
            f"cannot read the TLS certificate {cert} or key {key}: {exc.strerror or exc}",
            hint="both must be readable PEM files",
        ) from exc


def _unusable_pair(cert: Path, key: Path) -> UserError:
    """Which file is wrong and why, in words (OpenSSL says ``PEM lib (_ssl.c:3926)``)."""
    from meshctl.core.pki.certs import pair_problem

    hint = "--tls-cert: the PEM certificate (chain), --tls-key: its PEM private key"
    try:
        found = pair_problem(cert.read_bytes(), key.read_bytes())
    except OSError as exc:
        return UserError(f"cannot read {cert} or {key}: {exc.strerror or exc}", hint=hint)
    where, reason = found or ("pair", "OpenSSL cannot use them together")
    if where == "cert":
        return UserError(f"TLS certificate file {cert} {reason}", hint=hint)
    if where == "key":
        return UserError(f"TLS key file {key} {reason}", hint=hint)
    return UserError(f"TLS key file {key} and certificate {cert}: {reason}", hint=hint)


def _peer_errors_in_one_line(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """A connection a client broke (TLS garbage, data after close_notify, a reset) ends inside
    hypercorn's connection task: one line at info, not asyncio's traceback at error. Anything
    else goes to asyncio's default handler."""
    error = context.get("exception")
    causes = error.exceptions if isinstance(error, BaseExceptionGroup) else (error,)
    if error is not None and all(isinstance(e, OSError) for e in causes):
        log.info("webhook connection closed by a peer error: %s", causes[0])
        return
    loop.default_exception_handler(context)


async def serve(app: ASGIFramework, config: Config, stop: asyncio.Event) -> None:
    """Serve ``app`` (the webhook, or any ASGI app on a plain ``Config``) until ``stop`` is
    set, then drain for at most the graceful time (+1 s).

    A bind failure raises ``MeshctlError`` naming the address.
    """
    asyncio.get_running_loop().set_exception_handler(_peer_errors_in_one_line)
    serving = asyncio.ensure_future(hypercorn_serve(app, config, shutdown_trigger=stop.wait))
    stopping = asyncio.ensure_future(stop.wait())
    try:
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    except asyncio.CancelledError:
        serving.cancel()
        stopping.cancel()
        raise
    if serving.done():  # failed to start (a bind error): report it
        stopping.cancel()
        try:
            serving.result()
        except OSError as exc:
            where = getattr(config, "where", "") or config.bind[0]
            raise MeshctlError(
                f"serving on {where} failed: {exc.strerror or exc}",
                hint="choose a free port, or stop what is using it",
            ) from exc
        return
    # hypercorn stops accepting and lets in-flight requests finish for graceful_timeout. An idle
    # keep-alive client (the API server keeps them) can then still hold the TLS close for
    # asyncio's 30 s SSL shutdown timeout: the drain deadline ends that wait.
    done, _ = await asyncio.wait({serving}, timeout=config.graceful_timeout + 1.0)
    if not done:
        log.warning("webhook drain deadline passed: closing the remaining connections")
        serving.cancel()
        # hypercorn may end a cancelled serve with an error of its own; it is over either way.
        await asyncio.wait({serving}, timeout=1.0)
        if serving.done() and not serving.cancelled():
            serving.exception()
