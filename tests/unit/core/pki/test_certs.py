"""The development CA: minted certificates carry the facts the data plane relies on."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ed25519

from meshctl.core.pki import certs
from meshctl.core.pki.identity import SpiffeId
from tests.harness.cacerts import write_istio_cacerts

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


# -- a CA the user brings (Istio's cacerts layout) -----------------------------------------------


def _files(folder):
    names = ("ca-cert.pem", "ca-key.pem", "root-cert.pem", "cert-chain.pem")
    return {n: (folder / n).read_bytes() if (folder / n).exists() else None for n in names}


def _signing(files, trust_domain="cluster.local"):
    return certs.signing_ca(
        ca_cert=files["ca-cert.pem"],
        ca_key=files["ca-key.pem"],
        root_cert=files["root-cert.pem"],
        cert_chain=files["cert-chain.pem"],
        trust_domain=trust_domain,
    )


@pytest.mark.parametrize("kind", ["rsa", "ec"])
@pytest.mark.parametrize("intermediate", [True, False], ids=["intermediate", "root"])
def test_an_istio_plug_in_ca_signs_workloads_that_chain_to_its_root(tmp_path, kind, intermediate):
    ca = _signing(_files(write_istio_cacerts(tmp_path, kind, intermediate=intermediate)))
    leaf = certs.mint_workload(ca.signer, WHO, now=NOW, ttl=timedelta(hours=1))
    chain = x509.load_pem_x509_certificates(leaf.cert_pem + ca.chain_pem)
    root = x509.load_pem_x509_certificate(ca.root_pem)
    for child, parent in zip(chain, [*chain[1:], root], strict=False):
        child.verify_directly_issued_by(parent)  # leaf <- intermediate <- root
    assert chain[0].subject.rfc4514_string() == "O=cluster.local"
    assert certs.describe(leaf.cert_pem)[0].uri_sans == (str(WHO),)


def test_ca_files_that_cannot_sign_are_refused_naming_the_file(tmp_path):
    files = _files(write_istio_cacerts(tmp_path / "ok"))
    other = _files(write_istio_cacerts(tmp_path / "other"))
    encrypted = serialization.load_pem_private_key(files["ca-key.pem"], None).private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    ed = ed25519.Ed25519PrivateKey.generate().private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    leaf = certs.mint_workload(
        _signing(files).signer, WHO, now=datetime.now(UTC), ttl=timedelta(hours=1)
    )
    cases = [
        ({"ca-key.pem": encrypted}, "ca-key.pem is encrypted"),
        ({"ca-key.pem": ed}, "ca-key.pem holds a"),
        ({"ca-key.pem": b"junk"}, "ca-key.pem is not a PEM private key"),
        ({"ca-key.pem": other["ca-key.pem"]}, "ca-key.pem is not the key of ca-cert.pem"),
        ({"ca-cert.pem": b"junk"}, "ca-cert.pem is not a PEM certificate"),
        ({"ca-cert.pem": leaf.cert_pem, "ca-key.pem": leaf.key_pem}, "not a CA certificate"),
        ({"root-cert.pem": None, "cert-chain.pem": None}, "root-cert.pem must be beside it"),
        ({"cert-chain.pem": b"junk"}, "cert-chain.pem holds no PEM certificate"),
    ]
    for change, reason in cases:
        with pytest.raises(certs.CaError, match=reason):
            _signing({**files, **change})


def test_a_development_root_signs_only_for_its_own_trust_domain():
    root = certs.mint_root(trust_domain="cluster.local", now=NOW, ttl=timedelta(days=10))
    files = {"ca-cert.pem": root.cert_pem, "ca-key.pem": root.key_pem}
    files |= {"root-cert.pem": None, "cert-chain.pem": None}
    assert _signing(files).chain_pem == b""  # a root: the leaf alone, the root as root-cert.pem
    with pytest.raises(certs.CaError, match="another trust domain"):
        _signing(files, trust_domain="example.org")
