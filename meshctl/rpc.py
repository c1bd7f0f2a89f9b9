"""The gRPC adapter: TLS servers and channels the way Istio's control plane and proxies use them.

Owns grpcio (``grpc.aio``): a server whose TLS certificate can be swapped while it runs
(``Server``), a client channel to a control plane with its trust roots, alternate server name and
the per-call ``authorization: Bearer <token>`` / ``clusterid`` headers Istio's proxies send
(``connect``), and the translation of a failed call into a one-line ``RpcError`` (``unary``,
``read``: no caller outside this module handles a grpc exception or sentinel; a status travels as
its name, servers abort with ``abort``). Invariants: every
listener is TLS-only (a plaintext client fails the handshake); messages above the configured limit
are refused with RESOURCE_EXHAUSTED by grpcio before any handler runs; a token file is read on every
call, so a rotated projected token is used as soon as the kubelet writes it; no token, key or PEM is
ever logged.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NoReturn, TypeAlias, TypeVar

# As in meshctl/proto/__init__.py: grpc's C core would log next to our one-line errors (a failed
# bind, a refused handshake) unless asked to (GRPC_VERBOSITY). Must run before grpc loads.
os.environ.setdefault("GRPC_VERBOSITY", "NONE")

import grpc
import grpc.aio

from meshctl.errors import MeshctlError, listen_failed

log = logging.getLogger(__name__)

T = TypeVar("T")
# grpc's types, named here so that callers annotate with them without importing grpc.
Channel: TypeAlias = grpc.aio.Channel
ServicerContext: TypeAlias = grpc.aio.ServicerContext

# Istio's limits and keepalives (ztunnel: 200 MiB decoded messages, ping every 30 s, 10 s timeout).
DEFAULT_MAX_MESSAGE = 200 * 1024 * 1024
KEEPALIVE_MS = 30_000
MAX_PENDING_CALLS = 10_000  # calls waiting for this process before grpc starts to shed them
KEEPALIVE_TIMEOUT_MS = 10_000


class RpcError(MeshctlError):
    """A gRPC call failed; ``code`` is the gRPC status name (``UNAVAILABLE``, ...), ``detail``
    the peer's (or grpc's) own text. ``lasting``: retrying cannot help until a certificate or a
    setting changes (say it once)."""

    def __init__(
        self,
        message: str,
        *,
        code: str,
        hint: str | None = None,
        lasting: bool = False,
        detail: str = "",
    ) -> None:
        super().__init__(message, hint=hint)
        self.code = code
        self.lasting = lasting
        self.detail = detail


# grpc's own words when the server's certificate does not name the host dialled.
_HOSTNAME_CHECK = "Hostname Verification Check failed"


def hostname_mismatch(detail: str, address: str, server_name: str | None) -> tuple[str, str] | None:
    """(reason, hint) when ``detail`` says the server's certificate does not name the host we
    dialled (``server_name`` or the host of ``address``): a failure no retry can fix."""
    if _HOSTNAME_CHECK not in detail:
        return None
    host = server_name or address.rpartition(":")[0].strip("[]")
    reason = f"the server's TLS certificate does not name {host!r} (hostname verification)"
    hint = (
        f"start the server with --serving-names {host} (controlplane ca/run), or dial a name "
        "its certificate has (ALT_CA_HOSTNAME / ALT_XDS_HOSTNAME)"
    )
    return reason, hint


@dataclass(frozen=True, slots=True)
class KeyPair:
    """A PEM certificate chain (leaf first) and its PEM private key."""

    cert_chain_pem: bytes
    key_pem: bytes


def _server_config(pair: KeyPair) -> Any:
    return grpc.ssl_server_certificate_configuration([(pair.key_pem, pair.cert_chain_pem)])


def _bind_errno(address: str) -> int | None:
    """Why grpcio could not bind ``host:port`` (it says only that it failed): the errno of the
    same bind tried with a plain socket, closed at once."""
    host, _, port = address.rpartition(":")
    host = host.strip("[]") or "0.0.0.0"  # noqa: S104 -- grpcio's own reading of ":PORT"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((host, int(port)))
        except OSError as exc:
            return exc.errno
        except ValueError:
            return None
    return None


class Server:
    """A ``grpc.aio`` server on TLS listeners whose serving pair can change at run time.

    ``add`` registers generated servicers (``add_XServicer_to_server``); ``set_key_pair`` makes
    new handshakes use another certificate (open connections keep theirs).
    """

    def __init__(
        self,
        key_pair: KeyPair,
        *,
        max_message_bytes: int = DEFAULT_MAX_MESSAGE,
        options: Sequence[tuple[str, Any]] = (),
    ) -> None:
        self._lock = threading.Lock()
        self._pending: KeyPair | None = None
        self._server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", max_message_bytes),
                ("grpc.max_send_message_length", DEFAULT_MAX_MESSAGE),
                # Proxies ping every 30 s; accept that without a "too_many_pings" GOAWAY.
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.so_reuseport", 0),
                # Calls this process has not picked up yet: past grpc's soft limit (1,000) it
                # cancels new ones at random (all past 3,000). A burst of pods starting at once
                # reaches that (2,000 at once: ~10 % CANCELLED, bench_ca --burst); queue them.
                ("grpc.server.max_pending_requests", MAX_PENDING_CALLS),
                ("grpc.server.max_pending_requests_hard_limit", 2 * MAX_PENDING_CALLS),
                *options,
            ]
        )
        self._credentials = grpc.dynamic_ssl_server_credentials(
            _server_config(key_pair), self._fetch_config, require_client_authentication=False
        )

    def _fetch_config(self) -> Any:
        # Called by grpc's core on a handshake; returning None keeps the current configuration.
        with self._lock:
            pair, self._pending = self._pending, None
        return None if pair is None else _server_config(pair)

    def set_key_pair(self, key_pair: KeyPair) -> None:
        with self._lock:
            self._pending = key_pair

    def add(self, register: Callable[[Any, Any], None], servicer: Any) -> None:
        """Register a generated servicer; its requests are decoded by ``_Decoding`` (a message
        that is not the method's type ends the call with INVALID_ARGUMENT, not grpcio's
        UNKNOWN and a logged traceback)."""
        shim = _Registrar(self._server)
        register(servicer, shim)
        shim.finish()

    def listen(self, address: str) -> int:
        """Bind a TLS listener (``host:port``; port 0 picks one); returns the bound port."""
        try:
            port = self._server.add_secure_port(address, self._credentials)
        except RuntimeError:  # grpcio's only signal for a failed bind
            port = 0
        if port == 0:
            raise listen_failed(address, "gRPC", _bind_errno(address))
        return port

    async def start(self) -> None:
        await self._server.start()

    async def stop(self, grace_seconds: float) -> None:
        """Stop accepting, let in-flight calls finish for up to ``grace_seconds``, then cancel.

        grpcio sends every client a GOAWAY, so proxies reconnect elsewhere.
        """
        await self._server.stop(grace_seconds)

    async def wait(self) -> None:
        await self._server.wait_for_termination()


@dataclass(frozen=True, slots=True, kw_only=True)
class CallAuth:
    """What a proxy sends with each call: a bearer token (file read per call), a cluster id."""

    token_file: Path | None = None
    token: str | None = None
    cluster_id: str = "Kubernetes"

    @classmethod
    def from_setting(cls, value: str, *, cluster_id: str) -> CallAuth:
        """ztunnel's ``AUTH_TOKEN``: a path (it has a ``/``, or names an existing file) is read
        on every call, so a rotated projected token is used at once; anything else is the
        token itself."""
        if "/" in value or Path(value).exists():
            return cls(token_file=Path(value), cluster_id=cluster_id)
        return cls(token=value, cluster_id=cluster_id)

    def headers(self) -> tuple[tuple[str, str], ...]:
        token = self.token
        if self.token_file is not None:
            try:
                token = self.token_file.read_text().strip()
            except OSError as exc:
                raise RpcError(
                    f"cannot read the service-account token {self.token_file}: {exc.strerror}",
                    code="UNAUTHENTICATED",
                    hint="mount a projected token there (audience istio-ca) or pass another path",
                ) from exc
        if not token:
            return ()
        return (("authorization", f"Bearer {token}"), ("clusterid", self.cluster_id))


class _AuthPlugin(grpc.AuthMetadataPlugin):
    def __init__(self, auth: CallAuth) -> None:
        self._auth = auth

    def __call__(
        self, context: grpc.AuthMetadataContext, callback: grpc.AuthMetadataPluginCallback
    ) -> None:
        try:
            callback(self._auth.headers(), None)
        except RpcError as exc:
            callback((), exc)


def connect(
    address: str,
    *,
    root_pem: bytes,
    auth: CallAuth | None = None,
    server_name: str | None = None,
    max_message_bytes: int = DEFAULT_MAX_MESSAGE,
) -> grpc.aio.Channel:
    """A TLS channel to ``host:port`` trusting ``root_pem``; ``server_name`` is the SAN to check.

    Istio's proxies send no client certificate: the caller is authenticated by its token.
    """
    credentials = grpc.ssl_channel_credentials(root_certificates=root_pem)
    if auth is not None:
        credentials = grpc.composite_channel_credentials(
            credentials, grpc.metadata_call_credentials(_AuthPlugin(auth))
        )
    options: list[tuple[str, Any]] = [
        ("grpc.max_receive_message_length", max_message_bytes),
        ("grpc.keepalive_time_ms", KEEPALIVE_MS),
        ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
        ("grpc.keepalive_permit_without_calls", 1),
        # One connection per channel, never shared with another channel in this process.
        ("grpc.use_local_subchannel_pool", 1),
    ]
    if server_name:
        options.append(("grpc.ssl_target_name_override", server_name))
    return grpc.aio.secure_channel(address, credentials, options=options)


def translate(
    exc: grpc.aio.AioRpcError, *, what: str, address: str, server_name: str | None = None
) -> RpcError:
    """One line for a failed call: what was asked, where, the status and the peer's message."""
    code = exc.code().name
    detail = exc.details() or ""
    mismatch = hostname_mismatch(detail, address, server_name)
    if mismatch is not None:
        reason, hint = mismatch
        return RpcError(
            f"{what} at {address} failed: {reason}",
            code=code,
            hint=hint,
            lasting=True,
            detail=detail,
        )
    hints = {
        "UNAVAILABLE": f"is the control plane running and reachable at {address}?",
        "UNAUTHENTICATED": "check the service-account token (audience istio-ca) and its path",
        "PERMISSION_DENIED": "the control plane refused this identity; see its message",
        "DEADLINE_EXCEEDED": f"the control plane at {address} did not answer in time",
    }
    if code == "UNAUTHENTICATED" and "impersonation" in detail:
        # istiod's code for a refused ImpersonatedIdentity: the token was fine, the node was not.
        hints[code] = "the control plane refused to issue for this workload here; see its message"
    return RpcError(
        f"{what} at {address} failed: {code}: {detail}",
        code=code,
        hint=hints.get(code),
        detail=detail,
    )


async def unary(
    call: Awaitable[T], *, what: str, address: str, server_name: str | None = None
) -> T:
    """The answer of a unary call (a generated stub's method, called); ``RpcError`` if it failed
    (``translate``'s, with the same arguments)."""
    try:
        return await call
    except grpc.aio.AioRpcError as exc:
        raise translate(exc, what=what, address=address, server_name=server_name) from exc


async def read(call: Any, *, what: str, address: str, server_name: str | None = None) -> Any | None:
    """The next message of a streaming call, or None once the peer ended it with OK;
    ``RpcError`` when it ended with another status."""
    try:
        message = await call.read()
    except grpc.aio.AioRpcError as exc:
        raise translate(exc, what=what, address=address, server_name=server_name) from exc
    return None if message is grpc.aio.EOF else message


def call_metadata(context: grpc.aio.ServicerContext[Any, Any]) -> tuple[tuple[str, Any], ...]:
    """The caller's metadata (keys lower case, as gRPC sends them)."""
    return tuple((str(k), v) for k, v in (context.invocation_metadata() or ()))


async def abort(context: grpc.aio.ServicerContext[Any, Any], status: str, message: str) -> NoReturn:
    """End the call with gRPC status ``status`` (a name: ``PERMISSION_DENIED``...) and a reason."""
    await context.abort(grpc.StatusCode[status], message)
    raise AssertionError("grpc's abort returned")  # it raises; this keeps the type checker honest


def peer(context: grpc.aio.ServicerContext[Any, Any]) -> str:
    """The caller's address as grpc names it (``ipv4:10.0.0.1:5555``), for logs."""
    return str(context.peer() or "unknown")


# --- requests that are not the method's message --------------------------------------------


class _Registrar:
    """What generated ``add_XServicer_to_server`` functions call, registering each method with
    bytes in and the message decoded inside the call (``_decoding``)."""

    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server
        self._generic: list[Any] = []
        self._registered = False

    def add_generic_rpc_handlers(self, handlers: Sequence[Any]) -> None:
        self._generic.extend(handlers)  # registered as they are only if nothing better comes

    def add_registered_method_handlers(
        self, service: str, handlers: Mapping[str, grpc.RpcMethodHandler[Any, Any]]
    ) -> None:
        wrapped = {
            name: _decoding(handler, f"/{service}/{name}") for name, handler in handlers.items()
        }
        self._server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(service, wrapped),)
        )
        self._server.add_registered_method_handlers(service, wrapped)
        self._registered = True

    def finish(self) -> None:
        if not self._registered and self._generic:  # an older generator: no method table
            self._server.add_generic_rpc_handlers(tuple(self._generic))


def _decoding(handler: Any, method: str) -> Any:
    """``handler`` taking raw bytes: a request that does not decode ends the call with
    INVALID_ARGUMENT (the peer's mistake, said once in one line) before the servicer sees it."""
    decode = handler.request_deserializer
    if decode is None:
        return handler

    async def parse(raw: bytes, context: Any) -> Any:
        try:
            return decode(raw)
        except Exception as exc:  # noqa: BLE001 -- protobuf's DecodeError and kin, from a peer
            log.info("%s: refused a request that is not its message: %s", method, exc)
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, f"the request is not a valid message for {method}"
            )

    if handler.unary_unary is not None:
        behavior = handler.unary_unary

        async def unary(raw: bytes, context: Any) -> Any:
            return await behavior(await parse(raw, context), context)

        return grpc.unary_unary_rpc_method_handler(
            unary, response_serializer=handler.response_serializer
        )
    if handler.stream_stream is not None:
        stream = handler.stream_stream

        async def streaming(raws: Any, context: Any) -> Any:
            async def requests() -> Any:
                async for raw in raws:
                    yield await parse(raw, context)

            return await stream(requests(), context)

        serialize = handler.response_serializer

        def encode(message: Any) -> bytes:
            # Bytes are a response the servicer encoded already (one full state shared by many
            # streams: encoded once, not once per stream).
            return message if isinstance(message, bytes) else serialize(message)

        return grpc.stream_stream_rpc_method_handler(
            streaming, response_serializer=encode if serialize is not None else None
        )
    return handler  # unary-stream and stream-unary: none of ours
