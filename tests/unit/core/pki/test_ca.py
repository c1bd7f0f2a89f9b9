"""The CA's pure rules: CSRs accepted and refused, TTL policy, CA bundles, chains (openssl)."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from hypothesis import given
from hypothesis import strategies as st

from meshctl.core.pki import ca
from meshctl.core.pki.identity import SpiffeId

NOW = datetime(2026, 5, 1, 12, 0, tzinfo=UTC)
ID = SpiffeId("cluster.local", "shop", "cart")


def csr_pem(
    sans: list[x509.GeneralName] | None = None,
    key: object = None,
    *,
    critical: bool = True,
    subject: x509.Name | None = None,
) -> str:
    key = key or ec.generate_private_key(ec.SECP256R1())
    builder = x509.CertificateSigningRequestBuilder().subject_name(subject or x509.Name([]))
    if sans is None:
        sans = [x509.UniformResourceIdentifier(str(ID))]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=critical)
    algorithm = None if isinstance(key, ed25519.Ed25519PrivateKey) else hashes.SHA256()
    return builder.sign(key, algorithm).public_bytes(serialization.Encoding.PEM).decode()  # type: ignore[arg-type]


def openssl_verify(tmp_path: Path, roots: str, chain: list[str]) -> str:
    (tmp_path / "roots.pem").write_text(roots)
    (tmp_path / "leaf.pem").write_text(chain[0])
    (tmp_path / "untrusted.pem").write_text("".join(chain[1:-1]) or chain[-1])
    result = subprocess.run(
        [
            "openssl",
            "verify",
            "-CAfile",
            str(tmp_path / "roots.pem"),
            "-untrusted",
            str(tmp_path / "untrusted.pem"),
            "-purpose",
            "sslclient",
            "-attime",
            str(int(NOW.timestamp())),
            str(tmp_path / "leaf.pem"),
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    return result.stdout.strip() + result.stderr.strip()


def self_signed(key_type: str = "ec-p256") -> ca.Authority:
    cert, key = ca.mint_root(trust_domain="cluster.local", now=NOW, key_type=key_type)
    return ca.load_authority(ca_cert_pem=cert.encode(), ca_key_pem=key, now=NOW)


def test_a_ztunnel_style_csr_asks_for_its_spiffe_id() -> None:
    request = ca.parse_csr(csr_pem())
    assert ca.requested_identity(request) == ID


@pytest.mark.parametrize(
    "key",
    [
        rsa.generate_private_key(public_exponent=65537, key_size=2048),
        ec.generate_private_key(ec.SECP384R1()),
        ed25519.Ed25519PrivateKey.generate(),
    ],
    ids=["rsa-2048", "p384", "ed25519"],
)
def test_rsa_p384_and_ed25519_csrs_are_accepted(key: object) -> None:
    assert ca.requested_identity(ca.parse_csr(csr_pem(key=key))) == ID


@pytest.mark.parametrize(
    ("sans", "reason"),
    [
        (
            [
                x509.UniformResourceIdentifier(str(ID)),
                x509.UniformResourceIdentifier("spiffe://cluster.local/ns/shop/sa/other"),
            ],
            "it has 2",
        ),
        (
            [x509.UniformResourceIdentifier(str(ID)), x509.DNSName("cart.shop.svc")],
            "DNSName:cart.shop.svc",
        ),
        ([x509.DNSName("cart.shop.svc")], "exactly one SAN"),
        ([], r"it has 0 \(none\)"),
        ([x509.UniformResourceIdentifier("https://example.com/x")], "not a SPIFFE ID"),
        ([x509.UniformResourceIdentifier("spiffe://cluster.local/x")], "not an Istio workload"),
    ],
    ids=["two-uris", "uri-and-dns", "dns-only", "no-san", "not-spiffe", "not-istio-path"],
)
def test_anything_but_exactly_one_spiffe_uri_san_is_refused(
    sans: list[x509.GeneralName], reason: str
) -> None:
    with pytest.raises(ca.CsrError, match=reason):
        ca.requested_identity(ca.parse_csr(csr_pem(sans)))


def test_malformed_tampered_small_key_and_huge_csrs_are_refused() -> None:
    with pytest.raises(ca.CsrError, match="not a PEM PKCS#10"):
        ca.parse_csr("-----BEGIN CERTIFICATE REQUEST-----\nAAAA\n-----END CERTIFICATE REQUEST-----")
    with pytest.raises(ca.CsrError, match="empty"):
        ca.parse_csr("  ")
    good = csr_pem()
    der = x509.load_pem_x509_csr(good.encode()).public_bytes(serialization.Encoding.DER)
    tampered = bytearray(der)
    tampered[-5] ^= 0xFF  # inside the signature
    pem = x509.load_der_x509_csr(bytes(tampered)).public_bytes(serialization.Encoding.PEM)
    with pytest.raises(ca.CsrError, match="signature does not verify"):
        ca.parse_csr(pem.decode())
    small = rsa.generate_private_key(public_exponent=65537, key_size=1024)  # noqa: S505 -- refused
    with pytest.raises(ca.CsrError, match="1024-bit RSA"):
        ca.parse_csr(csr_pem(key=small))
    with pytest.raises(ca.CsrError, match="bytes; at most"):
        ca.parse_csr(good + "x" * ca.MAX_CSR_BYTES)


@given(st.integers(min_value=-(2**63), max_value=2**63 - 1))
def test_ttl_is_the_request_up_to_the_maximum_defaults_when_unset_and_refused_beyond(
    seconds: int,
) -> None:
    maximum = timedelta(days=90)
    if seconds > maximum.total_seconds():
        with pytest.raises(ca.TtlError, match="is greater than the max allowed TTL 2160h0m0s"):
            ca.workload_ttl(seconds, default=timedelta(hours=24), maximum=maximum)
        return
    ttl = ca.workload_ttl(seconds, default=timedelta(hours=24), maximum=maximum)
    assert ttl == (timedelta(hours=24) if seconds <= 0 else timedelta(seconds=seconds))


def test_an_over_long_ttl_is_refused_in_istiods_words() -> None:
    # istiod (security/pkg/pki/ca): "requested TTL 3h0m0s is greater than the max allowed TTL
    # 2h0m0s" for 3 h against a 2 h maximum.
    with pytest.raises(ca.TtlError) as refused:
        ca.workload_ttl(3 * 3600, maximum=timedelta(hours=2))
    assert str(refused.value) == "requested TTL 3h0m0s is greater than the max allowed TTL 2h0m0s"
    assert isinstance(refused.value, ca.CsrError)  # answered INVALID_ARGUMENT, as istiod does


@pytest.mark.parametrize(
    ("seconds", "text"),
    [
        (0, "0s"),
        (30, "30s"),
        (1.5, "1.5s"),
        (300, "5m0s"),
        (3661, "1h1m1s"),
        (8_640_000, "2400h0m0s"),
        (7_776_000, "2160h0m0s"),
    ],
)
def test_durations_are_written_as_go_writes_them(seconds: float, text: str) -> None:
    assert ca.go_duration(seconds) == text


@pytest.mark.parametrize("key_type", ca.KEY_TYPES)
def test_self_signed_root_issues_leaves_openssl_verifies(tmp_path: Path, key_type: str) -> None:
    authority = self_signed(key_type)
    request = ca.parse_csr(csr_pem())
    leaf = ca.issue_workload(authority, request.public_key, ID, ttl=timedelta(hours=1), now=NOW)
    chain = [leaf, *authority.chain_pems()]
    assert len(chain) == 2
    assert chain[-1] == authority.roots_pem
    assert openssl_verify(tmp_path, authority.roots_pem, chain).endswith("OK")
    cert = x509.load_pem_x509_certificate(leaf.encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.critical
    assert san.value.get_values_for_type(x509.UniformResourceIdentifier) == [str(ID)]
    assert len(list(san.value)) == 1
    eku = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(eku) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    assert cert.subject == x509.Name([])
    assert cert.not_valid_after_utc == NOW + timedelta(hours=1)
    assert not cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca


def test_a_leaf_never_outlives_its_signing_certificate() -> None:
    authority = self_signed()
    request = ca.parse_csr(csr_pem())
    leaf = ca.issue_workload(
        authority, request.public_key, ID, ttl=timedelta(days=365 * 20), now=NOW
    )
    end = x509.load_pem_x509_certificate(leaf.encode()).not_valid_after_utc
    assert end == authority.cert.not_valid_after_utc


def _ca_cert(
    subject: str,
    key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey,
    issuer: tuple[x509.Certificate, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey] | None,
    *,
    ca_flag: bool = True,
    not_after: datetime | None = None,
) -> x509.Certificate:
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)])
    issuer_name = issuer[0].subject if issuer else name
    signer = issuer[1] if issuer else key
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - timedelta(days=1))
        .not_valid_after(not_after or NOW + timedelta(days=365))
        .add_extension(x509.BasicConstraints(ca=ca_flag, path_length=None), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(signer, hashes.SHA256())
    )


def pem(*certs: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


def key_pem(key: ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.TraditionalOpenSSL,  # ca-key.pem as Istio's tools write it
        serialization.NoEncryption(),
    )


def test_plug_in_cacerts_as_istio_writes_them_chain_leaf_intermediates_root(
    tmp_path: Path,
) -> None:
    # An RSA root (as Istio's own tooling makes), an EC intermediate, and the signing CA.
    root_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    root = _ca_cert("Root CA", root_key, None)
    mid_key = ec.generate_private_key(ec.SECP256R1())
    mid = _ca_cert("Intermediate", mid_key, (root, root_key))
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_cert("Cluster CA", ca_key, (mid, mid_key))
    authority = ca.load_authority(
        ca_cert_pem=pem(ca_cert),
        ca_key_pem=key_pem(ca_key),
        cert_chain_pem=pem(ca_cert, mid, root),  # Istio: ca-cert, intermediates, root
        root_cert_pem=pem(root),
        now=NOW,
    )
    assert not authority.self_signed
    request = ca.parse_csr(csr_pem())
    leaf = ca.issue_workload(authority, request.public_key, ID, ttl=timedelta(hours=1), now=NOW)
    chain = [leaf, *authority.chain_pems()]
    names = [x509.load_pem_x509_certificate(c.encode()).subject.rfc4514_string() for c in chain]
    assert names == ["", "CN=Cluster CA", "CN=Intermediate", "CN=Root CA"]
    assert openssl_verify(tmp_path, authority.roots_pem, chain).endswith("OK")
    assert authority.serving_chain_pem() == pem(ca_cert, mid).decode()


def test_a_rotation_bundle_with_two_roots_is_published_whole() -> None:
    old_key = ec.generate_private_key(ec.SECP256R1())
    old = _ca_cert("Old Root", old_key, None)
    new_key = ec.generate_private_key(ec.SECP256R1())
    new = _ca_cert("New Root", new_key, None)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_cert("Cluster CA", ca_key, (new, new_key))
    authority = ca.load_authority(
        ca_cert_pem=pem(ca_cert),
        ca_key_pem=key_pem(ca_key),
        cert_chain_pem=pem(ca_cert),
        root_cert_pem=pem(old, new),
        now=NOW,
    )
    assert authority.roots_pem == pem(old, new).decode()
    assert authority.chain_pems()[-1] == pem(new).decode()


def test_unusable_ca_bundles_say_what_is_wrong() -> None:
    root_key = ec.generate_private_key(ec.SECP256R1())
    root = _ca_cert("Root", root_key, None)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_cert = _ca_cert("CA", ca_key, (root, root_key))
    other_key = ec.generate_private_key(ec.SECP256R1())
    other_root = _ca_cert("Other", other_key, None)

    def load(**kwargs: bytes) -> ca.Authority:
        values = {
            "ca_cert_pem": pem(ca_cert),
            "ca_key_pem": key_pem(ca_key),
            "cert_chain_pem": pem(ca_cert, root),
            "root_cert_pem": pem(root),
        }
        values.update(kwargs)
        return ca.load_authority(now=NOW, **values)

    with pytest.raises(ca.CaError, match=r"ca-key\.pem is not the key of ca-cert\.pem"):
        load(ca_key_pem=key_pem(other_key))
    with pytest.raises(ca.CaError, match=r"not signed by any certificate of root-cert\.pem"):
        load(root_cert_pem=pem(other_root), cert_chain_pem=b"")
    with pytest.raises(ca.CaError, match=r"not self-signed and no root-cert\.pem"):
        load(root_cert_pem=b"", cert_chain_pem=b"")
    with pytest.raises(ca.CaError, match="not an unencrypted PEM private key"):
        load(ca_key_pem=b"garbage")
    with pytest.raises(ca.CaError, match="holds 2 certificates"):
        load(ca_cert_pem=pem(ca_cert, root))
    leaf_key = ec.generate_private_key(ec.SECP256R1())
    not_ca = _ca_cert("Leaf", leaf_key, (root, root_key), ca_flag=False)
    with pytest.raises(ca.CaError, match="is not a CA certificate"):
        load(ca_cert_pem=pem(not_ca), ca_key_pem=key_pem(leaf_key))
    expired = _ca_cert("Old", ca_key, (root, root_key), not_after=NOW - timedelta(seconds=1))
    with pytest.raises(ca.CaError, match="expired"):
        load(ca_cert_pem=pem(expired))
    mid_key = ec.generate_private_key(ec.SECP256R1())
    mid = _ca_cert("Mid", mid_key, (root, root_key))
    with pytest.raises(ca.CaError, match="out of order"):
        load(cert_chain_pem=pem(ca_cert, mid, root))


def test_serving_certificate_names_the_control_plane_service(tmp_path: Path) -> None:
    authority = self_signed()
    cert_pem, key = ca.issue_serving(
        authority,
        dns_names=["meshctl-controlplane.meshctl-system.svc"],
        ip_addresses=["127.0.0.1"],
        ttl=timedelta(hours=2),
        now=NOW,
    )
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["meshctl-controlplane.meshctl-system.svc"]
    assert [str(a) for a in san.get_values_for_type(x509.IPAddress)] == ["127.0.0.1"]
    assert serialization.load_pem_private_key(key, None).public_key() == cert.public_key()


def test_a_serving_name_too_long_for_a_common_name_is_only_in_the_san() -> None:
    # A revisioned Service in a long namespace: 82 characters, above X.509's 64 for a CN.
    name = "meshctl-controlplane-e2e9fa2.n-test-the-controlplane-deployment-gives-i-ec276b.svc"
    cert_pem, _ = ca.issue_serving(self_signed(), dns_names=[name], ttl=timedelta(hours=2), now=NOW)
    cert = x509.load_pem_x509_certificate(cert_pem.encode())
    assert len(cert.subject) == 0
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName)
    assert san.critical  # RFC 5280: an empty subject makes the SAN critical
    assert san.value.get_values_for_type(x509.DNSName) == [name]
    short, _ = ca.issue_serving(
        self_signed(),
        dns_names=["meshctl-controlplane.meshctl-system.svc"],
        ttl=timedelta(hours=2),
        now=NOW,
    )
    common = x509.load_pem_x509_certificate(short.encode()).subject.rfc4514_string()
    assert common == "CN=meshctl-controlplane.meshctl-system.svc"
