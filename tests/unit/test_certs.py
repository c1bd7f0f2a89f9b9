"""The development CA: minted certificates carry the facts the data plane relies on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from cryptography import x509

from meshctl.core import certs
from meshctl.core.identity import SpiffeId

NOW = datetime(2030, 1, 1, tzinfo=UTC)
WHO = SpiffeId("cluster.local", "default", "web")


def test_workload_cert_has_the_spiffe_san_and_chains_to_the_root():
    root = certs.mint_root(trust_domain="cluster.local", now=NOW, ttl=timedelta(days=10))
    leaf = certs.mint_workload(root, WHO, now=NOW, ttl=timedelta(hours=24))
    (facts,) = certs.describe(leaf.cert_pem)
    assert facts.uri_sans == (str(WHO),)
    assert not facts.is_ca
    assert facts.not_after == NOW + timedelta(hours=24)
    assert facts.not_before < NOW
    (root_facts,) = certs.describe(root.cert_pem)
    assert root_facts.is_ca
    leaf_cert = x509.load_pem_x509_certificate(leaf.cert_pem)
    root_cert = x509.load_pem_x509_certificate(root.cert_pem)
    leaf_cert.verify_directly_issued_by(root_cert)  # raises if the signature does not chain
    assert certs.key_matches(leaf.cert_pem, leaf.key_pem)
    assert not certs.key_matches(leaf.cert_pem, root.key_pem)


def test_not_before_override_mints_expired_certificates_for_tests():
    root = certs.mint_root(trust_domain="cluster.local", now=NOW, ttl=timedelta(days=10))
    old = certs.mint_workload(
        root, WHO, now=NOW, ttl=timedelta(hours=1), not_before=NOW - timedelta(days=2)
    )
    (facts,) = certs.describe(old.cert_pem)
    assert facts.not_after < NOW
