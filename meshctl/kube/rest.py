"""A minimal Kubernetes REST reader for the CNI plugin's start-up-critical path.

Why not the ``kubernetes`` client: importing it costs ~280 ms, twice the CNI plugin's whole ADD
budget; one authenticated GET needs only ``http.client`` and ``ssl``. Long-running commands keep
using ``meshctl.kube.client.connect``.
Invariants: every request has a timeout; failures are ``ApiUnreachableError`` (transport: retry
or fail closed) or ``ApiStatusError`` (the server answered non-2xx), both ``KubeError``s naming the
server; bodies echoed into messages are truncated; tokens and keys never appear in messages.
"""

from __future__ import annotations

import base64
import http.client
import json
import ssl
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast
from urllib.parse import SplitResult, quote, urlsplit

from meshctl import inputs, keypair
from meshctl.errors import ConfigError, KubeError
from meshctl.structured import InputError, load_json

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Kubeconfig, KubeconfigUser

_Named = TypeVar("_Named", bound=Mapping[str, object])


class ApiUnreachableError(KubeError):
    """No answer from the API server (refused, reset, timed out, TLS failed)."""


class ApiStatusError(KubeError):
    """The API server answered with a non-2xx status; ``reason`` is its Status ``reason``
    (``AlreadyExists``, ``Conflict``, ``NotFound``, ``Expired``...) when it sent one."""

    def __init__(
        self, message: str, *, status: int, hint: str | None = None, reason: str = ""
    ) -> None:
        super().__init__(message, hint=hint)
        self.status = status
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class RestConfig:
    """The current context of a kubeconfig, reduced to what one GET needs."""

    server: str
    token: str = ""
    ca_pem: bytes | None = None
    insecure: bool = False
    client_cert_pem: bytes | None = None
    client_key_pem: bytes | None = None
    source: str = ""


def load(path: str) -> RestConfig:
    """The current context of the kubeconfig at ``path`` (JSON, or YAML as a fallback)."""
    limits = inputs.limits()
    try:
        raw = inputs.read_bytes(path, f"kubeconfig {path}", limits)
    except OSError as exc:
        raise ConfigError(
            f"kubeconfig {path}: {exc.strerror or exc}",
            hint="is 'meshctl cni install' running on this node?",
        ) from exc
    except InputError as exc:
        raise ConfigError(exc.message, hint=exc.hint) from exc
    try:
        data = load_json(raw, f"kubeconfig {path}", limits)
    except InputError:
        from meshctl import yamlread  # deferred: the installer writes JSON (the plugin's path)

        try:
            data = yamlread.load_yaml(raw, f"kubeconfig {path}", limits)
        except InputError as exc:
            raise ConfigError(f"kubeconfig {path} cannot be parsed: {exc.problem}") from exc
    try:
        # Read as the view says; what is missing or mistyped fails a lookup, caught here.
        config = _current(cast("Kubeconfig", data), path)
    except (KeyError, TypeError, ValueError, StopIteration, OSError) as exc:
        raise ConfigError(
            f"kubeconfig {path} is incomplete: {type(exc).__name__}",
            hint="it needs a current-context naming a cluster with a server",
        ) from exc
    if config.client_cert_pem and config.client_key_pem:
        # Checked here, so a bad pair is named as the kubeconfig's fault, not as "unreachable".
        try:
            _load_client_cert(ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT), config)
        except ssl.SSLError as exc:
            raise ConfigError(
                f"kubeconfig {path}: the client certificate and key do not load "
                f"({exc.reason or exc})",
                hint="client-certificate(-data) and client-key(-data) must be a PEM "
                "certificate and its own private key, unencrypted",
            ) from exc
    return config


def _named(items: Sequence[_Named], name: str) -> _Named:
    """The entry of a kubeconfig list called ``name`` (``StopIteration`` when none is)."""
    return next(i for i in items if i["name"] == name)


def _current(data: Kubeconfig, path: str) -> RestConfig:
    context = _named(data["contexts"], data["current-context"])["context"]
    cluster = _named(data["clusters"], context["cluster"])["cluster"]
    user: KubeconfigUser = (
        _named(data["users"], context["user"])["user"] if context.get("user") else {}
    )
    token = str(user.get("token", ""))
    if not token and user.get("tokenFile"):
        token = Path(user["tokenFile"]).read_text(encoding="utf-8").strip()
    return RestConfig(
        server=str(cluster["server"]).rstrip("/"),
        token=token,
        ca_pem=_data_or_file(cluster, "certificate-authority"),
        insecure=bool(cluster.get("insecure-skip-tls-verify", False)),
        client_cert_pem=_data_or_file(user, "client-certificate"),
        client_key_pem=_data_or_file(user, "client-key"),
        source=f"kubeconfig {path}",
    )


def _data_or_file(section: Mapping[str, object], key: str) -> bytes | None:
    """The ``KEY-data`` (base64) or the file ``KEY`` names; ``TypeError`` (``load`` says the
    kubeconfig is incomplete) when the value is not text."""
    data = section.get(f"{key}-data")
    if data:
        if not isinstance(data, str):
            raise TypeError(f"{key}-data is not text")
        return base64.b64decode(data)
    file = section.get(key)
    if file:
        if not isinstance(file, str):
            raise TypeError(f"{key} is not a file name")
        return Path(file).read_bytes()
    return None


def get_json(config: RestConfig, path: str, *, timeout: float) -> dict[str, object]:
    """``GET <server><path>`` as JSON; raises ``ApiUnreachableError`` or ``ApiStatusError``."""
    url = urlsplit(config.server)
    where = f"API server {config.server} ({config.source})"
    headers = {"Accept": "application/json", "User-Agent": "meshctl-cni"}
    if config.token:
        headers["Authorization"] = f"Bearer {config.token}"
    target = url.path.rstrip("/") + path
    try:
        response, body = _IDLE.exchange(config, url, target, headers, timeout)
    except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
        raise ApiUnreachableError(
            f"{where} unreachable: {type(exc).__name__}: {exc}",
            hint="is the API server up and reachable from the node?",
        ) from exc
    if len(body) > MAX_BODY_BYTES:
        raise ApiStatusError(
            f"{where} sent more than {MAX_BODY_BYTES} bytes for GET {path}",
            status=response.status,
        )
    if not 200 <= response.status < 300:
        detail = body[:200].decode(errors="replace")
        raise ApiStatusError(
            f"{where} answered {response.status} {response.reason} for GET {path}: {detail}",
            status=response.status,
            hint="check the plugin's RBAC (get pods)" if response.status in (401, 403) else None,
        )
    try:
        data = json.loads(body)
    except ValueError as exc:
        raise ApiStatusError(
            f"{where} sent a body that is not JSON", status=response.status
        ) from exc
    if not isinstance(data, dict):
        raise ApiStatusError(f"{where} sent a JSON {type(data).__name__}", status=response.status)
    return data


def pod_path(namespace: str, name: str) -> str:
    return f"/api/v1/namespaces/{quote(namespace, safe='')}/pods/{quote(name, safe='')}"


def namespace_path(name: str) -> str:
    return f"/api/v1/namespaces/{quote(name, safe='')}"


MAX_BODY_BYTES = 4 * 1024 * 1024  # a Pod or Namespace is a few KiB; bounded memory regardless
_IDLE_PER_SERVER = 4
_CONTEXTS_KEPT = 8


class _IdleConnections:
    """Kept-alive connections per API server and credentials, so the node agent's second and
    later GETs skip the TCP and TLS handshakes (~10 ms each, most of a CNI ADD's lookup).
    Thread-safe: a connection is used by one request at a time, then put back if still open."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._idle: dict[tuple[object, ...], list[http.client.HTTPConnection]] = {}
        self._contexts: dict[tuple[object, ...], ssl.SSLContext] = {}

    def exchange(
        self,
        config: RestConfig,
        url: SplitResult,
        target: str,
        headers: Mapping[str, str],
        timeout: float,
    ) -> tuple[http.client.HTTPResponse, bytes]:
        key = (
            config.server,
            config.ca_pem,
            config.insecure,
            config.client_cert_pem,
            config.client_key_pem,
        )
        with self._lock:
            idle = self._idle.get(key, [])
            reused = idle.pop() if idle else None
        if reused is not None:
            try:
                return self._send(key, reused, target, headers, timeout)
            except TimeoutError:
                raise  # a server that does not answer in time: no second wait
            except (OSError, http.client.HTTPException):
                pass  # it closed the idle connection meanwhile (its right): once more, on a new one
        connection = _connection(self._context(key, config, url), url, timeout)
        return self._send(key, connection, target, headers, timeout)

    def _send(
        self,
        key: tuple[object, ...],
        connection: http.client.HTTPConnection,
        target: str,
        headers: Mapping[str, str],
        timeout: float,
    ) -> tuple[http.client.HTTPResponse, bytes]:
        try:
            connection.timeout = timeout
            if connection.sock is not None:
                connection.sock.settimeout(timeout)
            connection.request("GET", target, headers=dict(headers))
            response = connection.getresponse()
            body = response.read(MAX_BODY_BYTES + 1)
        except BaseException:
            connection.close()
            raise
        kept = False
        if not response.will_close and response.isclosed():  # the whole body read, and no more
            with self._lock:
                idle = self._idle.setdefault(key, [])
                if len(idle) < _IDLE_PER_SERVER:
                    idle.append(connection)
                    kept = True
        if not kept:
            connection.close()
        return response, body

    def _context(
        self, key: tuple[object, ...], config: RestConfig, url: SplitResult
    ) -> ssl.SSLContext | None:
        if url.scheme == "http":
            return None
        with self._lock:
            context = self._contexts.get(key)
        if context is None:
            context = _tls_context(config)
            with self._lock:
                if len(self._contexts) >= _CONTEXTS_KEPT:  # kubeconfigs that changed: forget
                    self._contexts.clear()
                    stale, self._idle = self._idle, {}
                    for connection in (c for idle in stale.values() for c in idle):
                        connection.close()
                self._contexts[key] = context
        return context

    def close(self) -> None:
        with self._lock:
            for connection in (c for idle in self._idle.values() for c in idle):
                connection.close()
            self._idle.clear()


_IDLE = _IdleConnections()


def close_idle_connections() -> None:
    """Close every kept-alive connection (the next GET opens a new one)."""
    _IDLE.close()


def _connection(
    context: ssl.SSLContext | None, url: SplitResult, timeout: float
) -> http.client.HTTPConnection:
    if context is None:
        return http.client.HTTPConnection(url.hostname or "", url.port, timeout=timeout)
    return http.client.HTTPSConnection(
        url.hostname or "", url.port, timeout=timeout, context=context
    )


def _tls_context(config: RestConfig) -> ssl.SSLContext:
    if config.insecure:
        context = ssl._create_unverified_context()  # noqa: S323 -- the kubeconfig asks for it
    else:
        cadata = config.ca_pem.decode() if config.ca_pem else None
        context = ssl.create_default_context(cadata=cadata)
    if config.client_cert_pem and config.client_key_pem:
        _load_client_cert(context, config)
    return context


def _load_client_cert(context: ssl.SSLContext, config: RestConfig) -> None:
    keypair.load_key_pair(context, config.client_cert_pem or b"", config.client_key_pem or b"")
