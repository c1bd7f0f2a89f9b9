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
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar, cast
from urllib.parse import quote, urlsplit

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
    try:
        connection = _connection(config, url.hostname or "", url.port, url.scheme, timeout)
        try:
            headers = {"Accept": "application/json", "User-Agent": "meshctl-cni"}
            if config.token:
                headers["Authorization"] = f"Bearer {config.token}"
            connection.request("GET", url.path.rstrip("/") + path, headers=headers)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
    except (OSError, http.client.HTTPException, ssl.SSLError) as exc:
        raise ApiUnreachableError(
            f"{where} unreachable: {type(exc).__name__}: {exc}",
            hint="is the API server up and reachable from the node?",
        ) from exc
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


def _connection(
    config: RestConfig, host: str, port: int | None, scheme: str, timeout: float
) -> http.client.HTTPConnection:
    if scheme == "http":
        return http.client.HTTPConnection(host, port, timeout=timeout)
    if config.insecure:
        context = ssl._create_unverified_context()  # noqa: S323 -- the kubeconfig asks for it
    else:
        cadata = config.ca_pem.decode() if config.ca_pem else None
        context = ssl.create_default_context(cadata=cadata)
    if config.client_cert_pem and config.client_key_pem:
        _load_client_cert(context, config)
    return http.client.HTTPSConnection(host, port, timeout=timeout, context=context)


def _load_client_cert(context: ssl.SSLContext, config: RestConfig) -> None:
    keypair.load_key_pair(context, config.client_cert_pem or b"", config.client_key_pem or b"")
