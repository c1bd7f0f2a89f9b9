"""Caller authentication rules: bearer metadata, TokenReview verdicts, node-proxy impersonation."""

from __future__ import annotations

import base64
import json
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.pki import callers
from meshctl.core.pki.callers import Caller, CallerError, TokenVerdict
from meshctl.core.pki.identity import SpiffeId

NODE_ACCOUNTS = frozenset({"meshctl-system/meshctl-ztunnel"})


def verdict(username: str = "system:serviceaccount:shop:cart", **extra: str) -> TokenVerdict:
    return TokenVerdict(
        authenticated=True,
        username=username,
        extra={
            {"pod": callers.EXTRA_POD_NAME, "uid": callers.EXTRA_POD_UID}[k]: (v,)
            for k, v in extra.items()
        },
    )


def test_bearer_token_is_taken_from_authorization_metadata() -> None:
    assert callers.bearer_token([("clusterid", "K"), ("authorization", "Bearer abc.def")]) == (
        "abc.def"
    )
    assert callers.bearer_token([("authorization", b"bearer  tok ")]) == "tok"


@pytest.mark.parametrize(
    ("metadata", "reason"),
    [
        ([], "no authorization metadata"),
        ([("authorization", "Basic dXNlcg==")], "not 'Bearer <token>'"),
        ([("authorization", "Bearer ")], "not 'Bearer <token>'"),
        ([("authorization", "Bearer a"), ("authorization", "Bearer b")], "more than one"),
    ],
)
def test_missing_or_malformed_authorization_is_unauthenticated(
    metadata: list[tuple[str, str]], reason: str
) -> None:
    with pytest.raises(CallerError, match=reason) as caught:
        callers.bearer_token(metadata)
    assert caught.value.status == "UNAUTHENTICATED"


def test_a_service_account_verdict_becomes_a_caller_with_its_pod() -> None:
    caller = callers.caller_from_verdict(
        verdict(pod="cart-1", uid="u-1"), trust_domain="example.org"
    )
    assert caller.identity == SpiffeId("example.org", "shop", "cart")
    assert (caller.pod_name, caller.pod_uid, caller.account) == ("cart-1", "u-1", "shop/cart")


def test_refused_tokens_and_non_service_accounts_say_why() -> None:
    refused = TokenVerdict(authenticated=False, error="service account token has expired")
    with pytest.raises(CallerError, match="TokenReview: service account token has expired"):
        callers.caller_from_verdict(refused, trust_domain="cluster.local")
    with pytest.raises(CallerError, match="not a service account") as caught:
        callers.caller_from_verdict(verdict("alice"), trust_domain="cluster.local")
    assert caught.value.status == "UNAUTHENTICATED"


def jwt(claims: dict[str, Any]) -> str:
    def part(data: dict[str, Any]) -> str:
        return base64.urlsafe_b64encode(json.dumps(data).encode()).decode().rstrip("=")

    return f"{part({'alg': 'RS256'})}.{part(claims)}.sig"


def test_token_expiry_reads_exp_without_verifying() -> None:
    assert callers.token_expiry(jwt({"exp": 1_800_000_000})) == datetime.fromtimestamp(
        1_800_000_000, UTC
    )
    assert callers.token_expiry(jwt({"sub": "x"})) is None
    assert callers.token_expiry(jwt({"exp": "soon"})) is None
    assert callers.token_expiry("opaque-token") is None


@given(st.text(max_size=200))
def test_token_expiry_never_raises(token: str) -> None:
    result = callers.token_expiry(token)
    assert result is None or result.tzinfo is not None


def caller(account: str = "shop/cart", pod: str = "p", uid: str = "u") -> Caller:
    ns, sa = account.split("/")
    return Caller(
        namespace=ns,
        service_account=sa,
        identity=SpiffeId("cluster.local", ns, sa),
        pod_name=pod,
        pod_uid=uid,
    )


def test_a_workload_may_ask_only_for_itself() -> None:
    me = caller()
    assert callers.check_identity(me, me.identity, node_accounts=NODE_ACCOUNTS) == "self"
    with pytest.raises(CallerError, match="may only ask for its own identity") as caught:
        callers.check_identity(
            me, SpiffeId("cluster.local", "shop", "admin"), node_accounts=NODE_ACCOUNTS
        )
    assert caught.value.status == "PERMISSION_DENIED"
    with pytest.raises(CallerError, match="trust domain"):
        callers.check_identity(
            me, SpiffeId("other.org", "shop", "cart"), node_accounts=NODE_ACCOUNTS
        )


def test_a_trusted_node_account_may_impersonate_pending_the_node_check() -> None:
    node = caller("meshctl-system/meshctl-ztunnel")
    wanted = SpiffeId("cluster.local", "shop", "cart")
    assert callers.check_identity(node, wanted, node_accounts=NODE_ACCOUNTS) == "impersonate"


def pod(name: str, ns: str, sa: str, node: str, uid: str = "u", phase: str = "Running") -> dict:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": uid},
        "spec": {"nodeName": node, "serviceAccountName": sa},
        "status": {"phase": phase},
    }


def test_the_node_of_a_proxy_comes_from_its_own_bound_pod() -> None:
    me = caller("meshctl-system/meshctl-ztunnel", pod="zt-1", uid="u1")
    assert (
        callers.node_of_pod(pod("zt-1", "meshctl-system", "meshctl-ztunnel", "n1", "u1"), me)
        == "n1"
    )
    with pytest.raises(CallerError, match="not bound to a pod"):
        callers.node_of_pod(None, caller(pod=""))
    with pytest.raises(CallerError, match="does not exist"):
        callers.node_of_pod(None, me)
    with pytest.raises(CallerError, match="was replaced"):
        callers.node_of_pod(pod("zt-1", "meshctl-system", "meshctl-ztunnel", "n1", "u2"), me)
    with pytest.raises(CallerError, match="not on a node"):
        callers.node_of_pod(pod("zt-1", "meshctl-system", "meshctl-ztunnel", "", "u1"), me)


def test_impersonation_needs_a_live_pod_of_that_account_on_the_same_node() -> None:
    wanted = SpiffeId("cluster.local", "shop", "cart")
    pods = [pod("a", "shop", "cart", "n2"), pod("b", "shop", "web", "n1")]
    with pytest.raises(CallerError, match="no pod of service account shop/cart runs on") as c:
        callers.check_node_has_account(pods, wanted, "n1")
    assert c.value.status == "PERMISSION_DENIED"
    with pytest.raises(CallerError):
        callers.check_node_has_account(
            [pod("c", "shop", "cart", "n1", phase="Failed")], wanted, "n1"
        )
    callers.check_node_has_account([*pods, pod("d", "shop", "cart", "n1")], wanted, "n1")


def test_trusted_node_accounts_are_namespace_slash_name() -> None:
    assert callers.parse_node_accounts(["a/b", " c/d ", ""]) == {"a/b", "c/d"}
    with pytest.raises(ValueError, match="NAMESPACE/SERVICE_ACCOUNT"):
        callers.parse_node_accounts(["ab"])
    with pytest.raises(ValueError, match="DNS-1123"):
        callers.parse_node_accounts(["A/b"])
