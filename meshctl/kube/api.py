"""JSON requests and watch streams through a connected client's pool, as plain dicts.

Why not the generated ``*Api`` classes: every caller here wants the wire JSON (TypedDict-shaped
dicts, never ``V1*`` models), for any kind including custom resources, and a watch needs the raw
response to read line by line and to stop from another thread. The client's own urllib3 pool
carries its TLS, client certificates and bearer token (refreshed through the client's hook, so an
in-cluster token rotated by the kubelet is used as soon as it is written).
Invariants: every request has a timeout; a failure is ``ApiUnreachableError`` (no answer) or
``ApiStatusError`` (non-2xx, with the Status ``reason``), both one-line ``KubeError`` naming the
verb and path; bodies echoed into messages are truncated; tokens never appear in messages.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import Any
from urllib.parse import urlencode

import urllib3

from meshctl import __version__
from meshctl.kube.client import Kube
from meshctl.kube.rest import ApiStatusError, ApiUnreachableError

Query = Sequence[tuple[str, str]]
_USER_AGENT = f"meshctl/{__version__}"
_CONNECT_TIMEOUT = 10.0


def _url(kube: Kube, path: str, query: Query) -> str:
    host = str(kube.api.configuration.host).rstrip("/")
    return host + path + (f"?{urlencode(list(query))}" if query else "")


def _headers(kube: Kube, content_type: str | None) -> dict[str, str]:
    headers = {"Accept": "application/json", "User-Agent": _USER_AGENT}
    if content_type:
        headers["Content-Type"] = content_type
    # auth_settings() runs the client's refresh hook (in-cluster: re-reads the token file).
    for auth in kube.api.configuration.auth_settings().values():
        if auth.get("in") == "header" and auth.get("value"):
            headers[str(auth["key"])] = str(auth["value"])
    return headers


def _status_error(method: str, path: str, status: int, body: bytes, where: str) -> ApiStatusError:
    reason, message = "", body[:300].decode(errors="replace")
    try:
        answer = json.loads(body)
    except ValueError:
        answer = None
    if isinstance(answer, dict) and answer.get("kind") == "Status":
        reason = str(answer.get("reason") or "")
        message = str(answer.get("message") or message)[:300]
    hint = None
    if status in (401, 403):
        hint = "check the credentials and the RBAC rules of the identity in use"
    return ApiStatusError(
        f"{method} {path} on the API server ({where}) answered {status}: {message}",
        status=status,
        reason=reason,
        hint=hint,
    )


def _send(
    kube: Kube,
    method: str,
    path: str,
    query: Query,
    data: bytes | None,
    content_type: str | None,
    *,
    read: float,
    preload: bool,
    what: str,
) -> Any:
    """One urllib3 request on the client's pool; no answer is ``ApiUnreachableError``."""
    try:
        return kube.api.rest_client.pool_manager.request(
            method,
            _url(kube, path, query),
            body=data,
            headers=_headers(kube, content_type if data is not None else None),
            timeout=urllib3.Timeout(connect=min(_CONNECT_TIMEOUT, read), read=read),
            retries=False,
            preload_content=preload,
        )
    except (urllib3.exceptions.HTTPError, OSError) as exc:
        where = f"{what} {path}: API server {kube.server} ({kube.source})"
        raise unreachable(where, exc, read) from exc


def unreachable(where: str, exc: BaseException, timeout: float) -> ApiUnreachableError:
    """One line for a request that got no answer, in words (``connection refused``, ``did not
    answer within 30s``, ``TLS failed``), never urllib3's class names; ``where`` names the
    request or the server. ``version --server`` and ``verify`` say the same through this."""
    from meshctl.values import format_duration

    reason = exc.reason if isinstance(exc, urllib3.exceptions.MaxRetryError) and exc.reason else exc
    errors = urllib3.exceptions
    # NewConnectionError (refused, no route) subclasses ConnectTimeoutError in urllib3 2.
    if isinstance(reason, errors.TimeoutError | TimeoutError) and not isinstance(
        reason, errors.NewConnectionError
    ):
        return ApiUnreachableError(
            f"{where} did not answer within {format_duration(timeout)}",
            hint="is the cluster up and reachable from here? if it is only slow, "
            "raise --request-timeout",
        )
    if isinstance(reason, errors.SSLError):
        return ApiUnreachableError(
            f"{where}: TLS failed ({_cause(reason)})",
            hint="check the kubeconfig's certificate-authority and server address",
        )
    return ApiUnreachableError(
        f"{where} unreachable: {_cause(reason)}",
        hint="is the cluster running and the kubeconfig's server address right?",
    )


def _cause(exc: BaseException) -> str:
    """The innermost OS reason (``connection refused``) rather than urllib3's wrapper text."""
    inner: BaseException | None = exc
    while inner is not None:
        if isinstance(inner, OSError) and inner.strerror:
            return inner.strerror.lower()
        inner = inner.__cause__ or inner.__context__
    text = str(exc)
    # urllib3 prefixes its own text with the connection object's repr: keep what follows.
    return text.rsplit(": ", 1)[-1] if ": " in text else (text or "no answer")


def request(
    kube: Kube,
    method: str,
    path: str,
    *,
    query: Query = (),
    body: object = None,
    content_type: str = "application/json",
    timeout: float | None = None,
) -> dict[str, object]:
    """One request; the JSON answer (an empty dict for an empty body)."""
    read = kube.request_timeout if timeout is None else timeout
    data = None if body is None else json.dumps(body).encode()
    response = _send(
        kube, method, path, query, data, content_type, read=read, preload=True, what=method
    )
    raw: bytes = response.data
    if not 200 <= response.status < 300:
        raise _status_error(method, path, response.status, raw, kube.source)
    if not raw:
        return {}
    try:
        answer = json.loads(raw)
    except ValueError as exc:
        raise ApiStatusError(
            f"{method} {path}: the API server sent a body that is not JSON",
            status=response.status,
        ) from exc
    if not isinstance(answer, dict):
        raise ApiStatusError(
            f"{method} {path}: the API server sent a JSON {type(answer).__name__}",
            status=response.status,
        )
    return answer


def request_text(kube: Kube, path: str, *, query: Query = (), timeout: float | None = None) -> str:
    """``GET path`` whose answer is text, not JSON (a pod's metrics through ``pods/proxy``, a
    container's log)."""
    read = kube.request_timeout if timeout is None else timeout
    response = _send(kube, "GET", path, query, None, None, read=read, preload=True, what="GET")
    raw: bytes = response.data
    if not 200 <= response.status < 300:
        raise _status_error("GET", path, response.status, raw, kube.source)
    return raw.decode(errors="replace")


class Stream:
    """An open streaming GET (a watch): newline-delimited JSON objects until the server ends it.

    ``shutdown`` may be called from any thread; a read blocked in ``events`` then ends at once.
    """

    def __init__(self, response: Any, path: str) -> None:
        self._response = response
        self._path = path
        self._shut = False

    def events(self) -> Iterator[dict[str, object]]:
        """Each JSON line as a dict; ends when the server closes the response."""
        pending = b""
        chunks = self._response.stream(64 * 1024, decode_content=True)
        while True:
            try:
                chunk = next(chunks, None)
            except Exception as exc:
                if self._shut:  # shut down from another thread: whatever the read tripped on
                    return
                if not isinstance(exc, urllib3.exceptions.HTTPError | OSError | ValueError):
                    raise
                raise ApiUnreachableError(
                    f"watch {self._path}: stream broken: {type(exc).__name__}"
                ) from exc
            if chunk is None:
                break
            pending += chunk
            *lines, pending = pending.split(b"\n")
            for line in lines:
                if line.strip():
                    yield self._decode(line)
        if pending.strip():
            yield self._decode(pending)

    def _decode(self, line: bytes) -> dict[str, object]:
        try:
            event = json.loads(line)
        except ValueError as exc:
            raise ApiStatusError(f"watch {self._path}: a line is not JSON", status=200) from exc
        if not isinstance(event, dict):
            raise ApiStatusError(f"watch {self._path}: a line is not a JSON object", status=200)
        return event

    def shutdown(self) -> None:
        self._shut = True
        # urllib3 >= 2.3 interrupts a read blocked in another thread; close() alone may not.
        shutdown = getattr(self._response, "shutdown", None)
        if shutdown is not None:
            shutdown()
        self._response.close()

    def close(self) -> None:
        self._response.release_conn()
        self._response.close()


def open_stream(kube: Kube, path: str, *, query: Query, read_timeout: float) -> Stream:
    """Start a streaming GET; the status is checked before any line is read."""
    response = _send(
        kube, "GET", path, query, None, None, read=read_timeout, preload=False, what="watch"
    )
    if not 200 <= response.status < 300:
        body = response.read(64 * 1024)
        response.release_conn()
        raise _status_error("GET", path, response.status, body, kube.source)
    return Stream(response, path)
