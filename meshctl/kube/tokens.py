"""TokenReview: asking the API server who a bearer token belongs to (authentication.k8s.io/v1);
TokenRequest: minting a short-lived token for a service account.

Invariant: the token is sent only in the request body to the API server and never appears in a
message or a log; an unreachable or refusing API server is a ``KubeError`` (the caller answers
its own peer UNAVAILABLE), distinct from a verdict of "not authenticated".
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from meshctl.core.pki.callers import TokenVerdict
from meshctl.errors import KubeError
from meshctl.kube import api, objects
from meshctl.kube.client import Kube
from meshctl.kube.resources import SERVICE_ACCOUNTS, TOKEN_REVIEWS

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import TokenReviewStatus, UserInfo


def review_token(kube: Kube, token: str, audiences: Sequence[str]) -> TokenVerdict:
    """The API server's verdict on ``token`` for any of ``audiences``."""
    body = {
        "apiVersion": TOKEN_REVIEWS.api_version,
        "kind": TOKEN_REVIEWS.kind,
        "spec": {"token": token, "audiences": list(audiences)},
    }
    answer = objects.create(kube, TOKEN_REVIEWS, body)
    status: TokenReviewStatus = answer.get("status") or {}
    user: UserInfo = status.get("user") or {}
    extra = user.get("extra") or {}
    return TokenVerdict(
        authenticated=bool(status.get("authenticated")),
        username=str(user.get("username") or ""),
        uid=str(user.get("uid") or ""),
        extra={str(k): tuple(str(v) for v in values or ()) for k, values in extra.items()},
        audiences=tuple(str(a) for a in status.get("audiences") or ()),
        error=str(status.get("error") or "")[:300],
    )


def request_token(
    kube: Kube, namespace: str, service_account: str, audiences: Sequence[str], seconds: int
) -> str:
    """A short-lived token for ``namespace/service_account`` (TokenRequest, what istioctl asks
    for to call istiod); the caller needs ``create serviceaccounts/token`` there."""
    body = {
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "TokenRequest",
        "spec": {"audiences": list(audiences), "expirationSeconds": seconds},
    }
    path = SERVICE_ACCOUNTS.path(namespace, service_account, "token")
    answer = api.request(kube, "POST", path, body=body)
    status = answer.get("status")
    token = status.get("token") if isinstance(status, dict) else None
    if not isinstance(token, str) or not token:
        raise KubeError(
            f"the API server answered the TokenRequest for {namespace}/{service_account} "
            "without a token",
            hint="is the TokenRequest API enabled?",
        )
    return token
