"""SPIFFE identities and the peer-certificate identity rules."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.pki.identity import (
    IdentityError,
    SpiffeId,
    check_validity,
    parse_workload_ref,
    peer_identity,
)

names = st.from_regex(r"[a-z0-9]([a-z0-9-]{0,20}[a-z0-9])?", fullmatch=True)
domains = st.from_regex(r"[a-z0-9][a-z0-9.-]{0,20}", fullmatch=True)

A = SpiffeId("cluster.local", "default", "client")
B = SpiffeId("cluster.local", "prod", "server")


@given(domains, names, names)
def test_spiffe_id_round_trips_through_its_uri(td, ns, sa):
    sid = SpiffeId(td, ns, sa)
    assert SpiffeId.parse(str(sid)) == sid
    assert str(sid) == f"spiffe://{td}/ns/{ns}/sa/{sa}"
    assert sid.principal == f"{td}/ns/{ns}/sa/{sa}"


@pytest.mark.parametrize(
    "uri",
    [
        "http://cluster.local/ns/a/sa/b",
        "spiffe://cluster.local/ns/a",
        "spiffe://cluster.local/ns/a/sa/b/extra",
        "spiffe://cluster.local/sa/a/ns/b",
        "spiffe://Cluster.Local/ns/a/sa/b",
        "spiffe://cluster.local/ns/A/sa/b",
    ],
)
def test_malformed_spiffe_ids_are_refused(uri):
    with pytest.raises(IdentityError):
        SpiffeId.parse(uri)


def test_peer_identity_accepts_the_one_spiffe_san_and_ignores_others():
    assert peer_identity(["https://example.com", str(A)], trust_domain="cluster.local") == A


def test_peer_identity_refuses_a_foreign_trust_domain():
    with pytest.raises(IdentityError, match=r"trust domain 'evil\.org'"):
        peer_identity(["spiffe://evil.org/ns/default/sa/client"], trust_domain="cluster.local")


def test_peer_identity_refuses_an_unexpected_san_on_the_outbound_side():
    with pytest.raises(IdentityError, match="not the expected"):
        peer_identity([str(A)], trust_domain=None, expected=[B])
    assert peer_identity([str(B)], trust_domain=None, expected=[A, B]) == B


@pytest.mark.parametrize("sans", [[], ["dns:x"], [str(A), str(B)]])
def test_peer_identity_needs_exactly_one_spiffe_san(sans):
    with pytest.raises(IdentityError):
        peer_identity(sans, trust_domain=None)


def test_validity_window_is_enforced_at_both_ends():
    now = datetime(2030, 1, 1, tzinfo=UTC)
    check_validity(now - timedelta(1), now + timedelta(1), now)
    with pytest.raises(IdentityError, match="expired"):
        check_validity(now - timedelta(2), now - timedelta(1), now)
    with pytest.raises(IdentityError, match="not valid before"):
        check_validity(now + timedelta(1), now + timedelta(2), now)


def test_workload_ref_is_namespace_name_service_account():
    assert parse_workload_ref("default/web/web-sa") == ("default", "web", "web-sa")
    for bad in ("default/web", "a/b/c/d", "a//c", "A/b/c"):
        with pytest.raises(IdentityError):
            parse_workload_ref(bad)
