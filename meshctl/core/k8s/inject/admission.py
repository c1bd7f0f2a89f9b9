"""The injection webhook's HTTP semantics, sans I/O: one request's bytes in, one answer out.

Owns the mapping from an HTTP POST of an AdmissionReview (``admission.k8s.io/v1`` or ``v1beta1``,
https://kubernetes.io/docs/reference/access-authn-authz/extensible-admission-controllers/) to
the response the API server expects: the same apiVersion, the request's ``uid``, ``allowed``,
and for a pod to mesh ``patchType: JSONPatch`` with an RFC 6902 patch from the pod as sent to the
pod as injected. Any server (``meshctl inject webhook``, the control plane) hosts ``handle``.
Invariants: never raises for any input; protocol problems are 4xx (non-JSON content type 415,
empty or malformed body 400, unknown path 404, wrong method 405, too large 413); a pod the
injector refuses (a bad annotation) is denied with the message, not failed with a 5xx.
"""

from __future__ import annotations

import base64
import json
import logging
import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import jsonpatch

from meshctl.core.k8s.inject import kinds
from meshctl.core.k8s.inject.errors import InjectError
from meshctl.core.k8s.inject.pipeline import inject_pod
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.structured import InputError, Limits, load_json

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import AdmissionResponse, AdmissionReviewAnswer

log = logging.getLogger(__name__)

API_VERSIONS = ("admission.k8s.io/v1", "admission.k8s.io/v1beta1")
INJECT_PATH = "/inject"
MAX_BODY_BYTES = 8 << 20  # far above the API server's own object limit (~1.5 MiB in etcd)
_LIMITS = Limits(max_bytes=MAX_BODY_BYTES)

# Path-encoded proxy env, as Istio's injector reads it: /inject/<key>/<value>/... where
# "--slash--" stands for "/" and two short keys name Istio's cluster and network variables.
_PATH_ENV_ALIASES = {"cluster": "ISTIO_META_CLUSTER_ID", "net": "ISTIO_META_NETWORK"}
_SLASH = "--slash--"
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, slots=True)
class Request:
    """What a server hands over: method, path (no query), Content-Type header, body."""

    method: str
    path: str
    content_type: str | None
    body: bytes


@dataclass(frozen=True, slots=True)
class Answer:
    """What a server sends back."""

    status: int
    body: bytes
    content_type: str = "application/json"
    headers: tuple[tuple[str, str], ...] = field(default=())


def handle(request: Request, settings: InjectSettings) -> Answer:
    """The HTTP answer to one request for the injection webhook."""
    extra_env = path_env(request.path)
    if extra_env is None:
        return _plain(404, f"no handler for {request.path[:100]}; POST to {INJECT_PATH}")
    refused = _refusal(request)
    if refused is not None:
        return refused
    try:
        answer = review(_json(request.body), settings, extra_env=extra_env)
    except MalformedReviewError as exc:
        return _plain(400, str(exc))
    except Exception:
        # A bug must cost one 500, never the server or the connection.
        log.exception("injection failed for a well-formed AdmissionReview")
        return _plain(500, "internal error while injecting; see the webhook's log")
    return Answer(200, json.dumps(answer, separators=(",", ":")).encode())


def _json(body: bytes) -> Any:
    """The body by the bounded reader: a nesting no AdmissionReview needs is refused (400)
    before the pipeline's walks could run out of stack."""
    try:
        return load_json(body, "body", _LIMITS)
    except InputError as exc:
        raise MalformedReviewError(f"body is not a usable JSON document: {exc.problem}") from exc


def _refusal(request: Request) -> Answer | None:
    """The 4xx answer for a request that carries no AdmissionReview to look at, or None."""
    if request.method != "POST":
        return Answer(405, b"POST an AdmissionReview\n", "text/plain", (("Allow", "POST"),))
    media_type = (request.content_type or "").split(";", 1)[0].strip().lower()
    if media_type != "application/json":
        shown = request.content_type or "none"
        return _plain(415, f"content type {shown[:100]!r} is not application/json")
    if not request.body:
        return _plain(400, "empty body: expected an AdmissionReview")
    if len(request.body) > MAX_BODY_BYTES:
        return _plain(413, f"body larger than {MAX_BODY_BYTES} bytes")
    return None


class MalformedReviewError(ValueError):
    """The body is JSON but not an AdmissionReview this handler can answer."""


def review(
    document: object, settings: InjectSettings, *, extra_env: tuple[tuple[str, str], ...] = ()
) -> AdmissionReviewAnswer:
    """The AdmissionReview answering ``document`` (raises ``MalformedReviewError``)."""
    if not isinstance(document, dict):
        raise MalformedReviewError("expected an AdmissionReview object")
    api_version = document.get("apiVersion")
    if document.get("kind") != "AdmissionReview" or api_version not in API_VERSIONS:
        raise MalformedReviewError(
            f"expected kind AdmissionReview, apiVersion {' or '.join(API_VERSIONS)}"
        )
    request = document.get("request")
    if not isinstance(request, dict) or not isinstance(request.get("uid"), str):
        raise MalformedReviewError("AdmissionReview without a request uid")
    response = admit(request, settings, extra_env=extra_env)
    return {"apiVersion": api_version, "kind": "AdmissionReview", "response": response}


def admit(
    request: Mapping[str, object],
    settings: InjectSettings,
    *,
    extra_env: tuple[tuple[str, str], ...] = (),
) -> AdmissionResponse:
    """The ``response`` for one admission ``request``: allowed, with a patch when injecting."""
    uid = request.get("uid")
    if not isinstance(uid, str):
        raise MalformedReviewError("AdmissionReview without a request uid")
    allowed: AdmissionResponse = {"uid": uid, "allowed": True}
    kind = request.get("kind")
    kind_name = kind.get("kind") if isinstance(kind, dict) else "Pod"
    operation = request.get("operation", "CREATE")
    # Only new pods are injected: a pod's containers cannot change after creation.
    if kind_name != "Pod" or operation != "CREATE" or request.get("subResource"):
        return allowed
    pod = request.get("object")
    if not isinstance(pod, dict):
        raise MalformedReviewError("AdmissionReview request without a pod object")
    namespace = request.get("namespace")
    if not isinstance(namespace, str) or not namespace:
        metadata = pod.get("metadata")
        namespace = metadata.get("namespace") if isinstance(metadata, dict) else None
    try:
        outcome = inject_pod(
            pod,
            settings,
            workload_name=kinds.workload_name_of_pod(pod),
            namespace=namespace if isinstance(namespace, str) else None,
            extra_env=extra_env,
        )
    except InjectError as exc:
        message = exc.message + (f" ({exc.hint})" if exc.hint else "")
        return {"uid": uid, "allowed": False, "status": {"code": 400, "message": message}}
    if outcome.skipped is not None:
        return allowed
    if outcome.warnings:
        # Shown by kubectl as "Warning: ..." lines (admission.k8s.io/v1 AdmissionResponse).
        allowed["warnings"] = list(outcome.warnings)
    patch = jsonpatch.make_patch(pod, outcome.pod).patch
    if not patch:
        return allowed
    encoded = base64.b64encode(json.dumps(patch, separators=(",", ":")).encode()).decode()
    return {**allowed, "patchType": "JSONPatch", "patch": encoded}


def path_env(path: str) -> tuple[tuple[str, str], ...] | None:
    """Proxy env encoded in the path (``/inject/k/v/...``); None when not an inject path."""
    if path != INJECT_PATH and not path.startswith(INJECT_PATH + "/"):
        return None
    parts = [p for p in path[len(INJECT_PATH) :].split("/") if p]
    pairs: list[tuple[str, str]] = []
    # An odd part out (a key without a value) is ignored, as Istio does.
    for key, value in zip(parts[::2], parts[1::2], strict=False):
        name = _PATH_ENV_ALIASES.get(key, key.replace(_SLASH, "/"))
        if _ENV_NAME.match(name):
            pairs.append((name, value.replace(_SLASH, "/")))
    return tuple(pairs)


def _plain(status: int, message: str) -> Answer:
    return Answer(status, (message + "\n").encode(), "text/plain; charset=utf-8")
