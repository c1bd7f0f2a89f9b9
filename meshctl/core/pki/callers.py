"""Who is calling the control plane, and which workload identities that caller may ask for.

Owns the rules Istio's CA and discovery server apply to a proxy's call: the bearer token from the
``authorization`` metadata; a TokenReview's verdict turned into a ``Caller`` (a service account,
optionally bound to a pod); and the impersonation rule for node proxies (a trusted node account
may act for a service account only when that account has a pod on the node proxy's own node).
Invariants: pure (the TokenReview answer and the pods are passed in); every refusal is a
``CallerError`` carrying the gRPC status name Istio uses (UNAUTHENTICATED for "who are you",
PERMISSION_DENIED for "not allowed") and a one-line reason that says what to fix; tokens never
appear in a message.
"""

from __future__ import annotations

import base64
import binascii
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any, Literal

from meshctl.core.pki.identity import IdentityError, SpiffeId
from meshctl.structured import InputError, load_json

# Istio's audiences for the projected token proxies send; ours too, so either can be minted.
AUDIENCES = ("istio-ca", "meshctl-ca")
# Istio's CA_TRUSTED_NODE_ACCOUNTS equivalent: the node proxy's service account.
DEFAULT_NODE_ACCOUNTS = ("meshctl-system/meshctl-ztunnel",)
# What the API server adds to a TokenReview of a token bound to a pod (Kubernetes API docs).
EXTRA_POD_NAME = "authentication.kubernetes.io/pod-name"
EXTRA_POD_UID = "authentication.kubernetes.io/pod-uid"
EXTRA_NODE_NAME = "authentication.kubernetes.io/node-name"
_SA_PREFIX = "system:serviceaccount:"

Status = Literal["UNAUTHENTICATED", "PERMISSION_DENIED", "INVALID_ARGUMENT", "UNAVAILABLE"]


class CallerError(Exception):
    """A call refused; ``status`` is the gRPC status name, ``str()`` the reason."""

    def __init__(self, status: Status, message: str) -> None:
        super().__init__(message)
        self.status: Status = status
        self.message = message


@dataclass(frozen=True, slots=True, kw_only=True)
class TokenVerdict:
    """What a TokenReview answered (``meshctl.kube.tokens`` fills it from the API)."""

    authenticated: bool
    username: str = ""
    uid: str = ""
    extra: Mapping[str, Sequence[str]] = field(default_factory=dict)
    audiences: tuple[str, ...] = ()
    error: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class Caller:
    """An authenticated caller: its service account and, for a pod-bound token, its pod."""

    namespace: str
    service_account: str
    identity: SpiffeId
    pod_name: str = ""
    pod_uid: str = ""
    node_name: str = ""  # from the token when the API server put it there; checked before use

    @property
    def account(self) -> str:
        """``namespace/service-account``, the form ``--trusted-node-accounts`` lists."""
        return f"{self.namespace}/{self.service_account}"


def bearer_token(metadata: Iterable[tuple[str, str | bytes]]) -> str:
    """The token of ``authorization: Bearer <token>`` (gRPC metadata keys are lower case)."""
    values = [v for k, v in metadata if k == "authorization"]
    if not values:
        raise CallerError(
            "UNAUTHENTICATED",
            "no authorization metadata: send 'authorization: Bearer <service-account token>' "
            "(a projected token with audience istio-ca)",
        )
    if len(values) > 1:
        raise CallerError("UNAUTHENTICATED", "more than one authorization header")
    raw = values[0]
    value = raw.decode("latin-1") if isinstance(raw, bytes) else raw
    scheme, _, token = value.strip().partition(" ")
    if scheme.lower() != "bearer" or not token.strip():
        raise CallerError(
            "UNAUTHENTICATED", "authorization metadata is not 'Bearer <token>' (RFC 6750)"
        )
    return token.strip()


REVIEWED_BY_API = "the API server's TokenReview"
_API_TOKENS = f"tokens must be service-account tokens for audience {' or '.join(AUDIENCES)}"


def caller_from_verdict(
    verdict: TokenVerdict,
    *,
    trust_domain: str,
    checked_by: str = REVIEWED_BY_API,
    expected: str = _API_TOKENS,
) -> Caller:
    """The caller a token check vouched for, or why the token is refused; ``checked_by`` names
    what judged it (a TokenReview, the standalone CA's token file) and ``expected`` what a good
    token is there, so the refusal points at the right fix."""
    if not verdict.authenticated:
        reason = verdict.error or "not authenticated"
        message = f"token refused by {checked_by}: {reason} ({expected})"
        raise CallerError("UNAUTHENTICATED", message)
    if not verdict.username.startswith(_SA_PREFIX):
        raise CallerError(
            "UNAUTHENTICATED",
            f"token identifies {verdict.username!r}, not a service account; "
            "send a service-account token",
        )
    namespace, _, account = verdict.username[len(_SA_PREFIX) :].partition(":")
    try:
        identity = SpiffeId(trust_domain, namespace, account)
    except IdentityError as exc:
        raise CallerError("UNAUTHENTICATED", f"token's service account: {exc}") from exc

    def first(key: str) -> str:
        values = verdict.extra.get(key) or ()
        return str(values[0]) if values else ""

    return Caller(
        namespace=namespace,
        service_account=account,
        identity=identity,
        pod_name=first(EXTRA_POD_NAME),
        pod_uid=first(EXTRA_POD_UID),
        node_name=first(EXTRA_NODE_NAME),
    )


def token_expiry(token: str) -> datetime | None:
    """The ``exp`` claim of a JWT, read without verifying it (the TokenReview did), or None.

    Used only to bound how long a TokenReview's answer may be reused (RFC 7519 §4.1.4).
    """
    parts = token.split(".")
    if len(parts) != 3:
        return None
    payload = parts[1] + "=" * (-len(parts[1]) % 4)
    try:
        claims = load_json(base64.urlsafe_b64decode(payload), "token")
        exp = claims["exp"]
    except (binascii.Error, ValueError, KeyError, TypeError, InputError):
        return None
    if isinstance(exp, bool) or not isinstance(exp, int | float):
        return None
    try:
        return datetime.fromtimestamp(exp, UTC)
    except (OverflowError, OSError, ValueError):
        return None


def parse_node_accounts(values: Iterable[str]) -> frozenset[str]:
    """``ns/sa`` entries of ``--trusted-node-accounts``; a malformed one is a ``ValueError``."""
    out = set()
    for raw in values:
        text = raw.strip()
        if not text:
            continue
        namespace, slash, account = text.partition("/")
        if not slash:
            raise ValueError(f"{text!r} is not NAMESPACE/SERVICE_ACCOUNT")
        try:
            SpiffeId("cluster.local", namespace, account)
        except IdentityError as exc:
            raise ValueError(f"{text!r}: {exc}") from exc
        out.add(text)
    return frozenset(out)


def is_node_proxy(caller: Caller, node_accounts: frozenset[str]) -> bool:
    return caller.account in node_accounts


def check_identity(
    caller: Caller, requested: SpiffeId, *, node_accounts: frozenset[str]
) -> Literal["self", "impersonate"]:
    """Whether ``caller`` may ask for ``requested``: itself always; another identity only as a
    node proxy (which then still needs ``check_node_has_account``)."""
    if requested.trust_domain != caller.identity.trust_domain:
        raise CallerError(
            "PERMISSION_DENIED",
            f"{requested} is not in this control plane's trust domain "
            f"{caller.identity.trust_domain!r}",
        )
    if requested == caller.identity:
        return "self"
    if not is_node_proxy(caller, node_accounts):
        raise CallerError(
            "PERMISSION_DENIED",
            f"caller {caller.identity} asked for {requested}: a workload may only ask for its "
            "own identity (only node proxies listed in --trusted-node-accounts may impersonate)",
        )
    return "impersonate"


def require_impersonation(caller: Caller, requested: SpiffeId, *, impersonating: bool) -> None:
    """A node proxy acting for another identity must say so (Istio's ``ImpersonatedIdentity``
    metadata): a request for another identity without it is refused, so a misrouted CSR never
    gets a workload's certificate by accident."""
    if not impersonating:
        raise CallerError(
            "PERMISSION_DENIED",
            f"node proxy {caller.account} asked for {requested} without the "
            "ImpersonatedIdentity metadata; send it to act for a workload on its node",
        )


def node_of_pod(pod: Mapping[str, Any] | None, caller: Caller) -> str:
    """The node the caller's own pod runs on, after checking the pod is the token's pod."""
    if not caller.pod_name:
        raise CallerError(
            "PERMISSION_DENIED",
            f"node proxy {caller.account} sent a token that is not bound to a pod; "
            "impersonation needs a projected service-account token",
        )
    if pod is None:
        raise CallerError(
            "PERMISSION_DENIED",
            f"the token's pod {caller.namespace}/{caller.pod_name} does not exist (any more)",
        )
    uid = str((pod.get("metadata") or {}).get("uid") or "")
    if caller.pod_uid and uid != caller.pod_uid:
        raise CallerError(
            "PERMISSION_DENIED",
            f"the token's pod {caller.namespace}/{caller.pod_name} was replaced "
            "(its uid changed); use a token of the running pod",
        )
    spec = pod.get("spec") or {}
    node = str(spec.get("nodeName") or "")
    if not node:
        raise CallerError(
            "PERMISSION_DENIED",
            f"the token's pod {caller.namespace}/{caller.pod_name} is not on a node yet",
        )
    account = str(spec.get("serviceAccountName") or "default")
    if account != caller.service_account:
        raise CallerError(
            "PERMISSION_DENIED",
            f"the token's pod {caller.namespace}/{caller.pod_name} runs as {account!r}, "
            f"not {caller.service_account!r}",
        )
    return node


_DONE_PHASES = ("Succeeded", "Failed")


def check_node_has_account(
    pods_on_node: Iterable[Mapping[str, Any]], requested: SpiffeId, node: str
) -> None:
    """Refuse unless a live pod of ``requested``'s service account runs on ``node``."""
    for pod in pods_on_node:
        spec = pod.get("spec") or {}
        meta = pod.get("metadata") or {}
        status = pod.get("status") or {}
        if (
            spec.get("nodeName") == node
            and meta.get("namespace") == requested.namespace
            and str(spec.get("serviceAccountName") or "default") == requested.service_account
            and status.get("phase") not in _DONE_PHASES
        ):
            return
    raise CallerError(
        "PERMISSION_DENIED",
        f"node proxy on {node} asked for {requested}, but no pod of service account "
        f"{requested.namespace}/{requested.service_account} runs on that node",
    )
