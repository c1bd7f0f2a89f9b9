"""A development certificate authority and the facts we read back from PEM certificates.

Owns: minting a self-signed root and SPIFFE workload certificates (ECDSA P-256 keys, as Istio's
CSRs; the URI SAN is the SPIFFE ID, RFC 5280 §4.2.1.6), signed by our root or by a CA the user
brings in Istio's plug-in CA layout (``ca-cert.pem``/``ca-key.pem``, RSA or EC, with
``root-cert.pem``/``cert-chain.pem`` for an intermediate), and ``describe`` which turns a PEM
into plain facts (serial, validity, URI SANs) for validation and ``/config_dump``. Invariants:
pure computation, no files or clocks (``now`` is passed in); private keys leave only as PEM
bytes returned to the caller, never in a message or a log.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta

from cryptography import x509
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509 import verification
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from meshctl.core.pki.identity import (
    CA_CERT_FILE,
    CA_KEY_FILE,
    CERT_CHAIN_FILE,
    KEY_FILE,
    ROOT_CERT_FILE,
    IdentityError,
    SpiffeId,
    peer_identity,
)

__all__ = [
    "CA_CERT_FILE",
    "CA_KEY_FILE",
    "CA_KEY_USAGE",
    "CERT_CHAIN_FILE",
    "KEY_FILE",
    "ROOT_CERT_FILE",
    "CaError",
    "CertFacts",
    "KeyPair",
    "SigningCa",
    "accept_issued",
    "describe",
    "key_matches",
    "leaf_key_usage",
    "mint_root",
    "mint_workload",
    "new_csr",
    "signing_ca",
]
_DEV_ROOT_CN = "meshctl development root ({})"  # the subject CN of the roots minted here

# What a root may do: sign certificates and CRLs (RFC 5280 §4.2.1.3), and its own signatures.
CA_KEY_USAGE = x509.KeyUsage(
    digital_signature=True,
    content_commitment=False,
    key_encipherment=False,
    data_encipherment=False,
    key_agreement=False,
    key_cert_sign=True,
    crl_sign=True,
    encipher_only=False,
    decipher_only=False,
)


def leaf_key_usage(*, key_encipherment: bool) -> x509.KeyUsage:
    """A workload certificate's key usage: signatures (TLS 1.3), and RSA key transport when the
    key is RSA (RFC 5280 §4.2.1.3)."""
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=key_encipherment,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=False,
        crl_sign=False,
        encipher_only=False,
        decipher_only=False,
    )


# Backdating absorbs clock skew between the host that minted and the host that verifies.
_BACKDATE = timedelta(minutes=5)


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyPair:
    """A certificate (PEM) and its private key (PKCS#8 PEM)."""

    cert_pem: bytes
    key_pem: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class SigningCa:
    """A CA that signs workload certificates, with what its workloads must carry besides."""

    signer: KeyPair  # ca-cert.pem + ca-key.pem: a root, or an intermediate
    chain_pem: bytes  # what follows a workload's leaf in its cert-chain.pem (empty for a root)
    root_pem: bytes  # the workload's root-cert.pem


class CaError(ValueError):
    """CA material that cannot sign workload certificates; ``str()`` says which file and why."""


@dataclass(frozen=True, slots=True, kw_only=True)
class CertFacts:
    """What ``/config_dump`` and the validation rules need from one certificate."""

    serial: str
    subject: str
    not_before: datetime
    not_after: datetime
    uri_sans: tuple[str, ...]
    is_ca: bool


def mint_root(*, trust_domain: str, now: datetime, ttl: timedelta) -> KeyPair:
    """A self-signed root CA for ``trust_domain``, valid from ``now`` (minus skew) for ``ttl``."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, trust_domain),
            x509.NameAttribute(NameOID.COMMON_NAME, _DEV_ROOT_CN.format(trust_domain)),
        ]
    )
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + ttl)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key))


def mint_workload(
    ca: KeyPair,
    identity: SpiffeId,
    *,
    now: datetime,
    ttl: timedelta,
    not_before: datetime | None = None,
) -> KeyPair:
    """A leaf certificate for ``identity`` signed by ``ca``: client and server auth, URI SAN only.

    ``not_before`` overrides the start (tests mint expired or not-yet-valid certificates with it).
    """
    ca_cert = x509.load_pem_x509_certificate(ca.cert_pem)
    ca_key = _signing_key(ca.key_pem)
    key = ec.generate_private_key(ec.SECP256R1())
    start = not_before if not_before is not None else now - _BACKDATE
    cert = (
        x509.CertificateBuilder()
        # Istio leaves the subject empty; an O= keeps OpenSSL's printers readable.
        .subject_name(
            x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, identity.trust_domain)])
        )
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(start + ttl if not_before is not None else now + ttl)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(leaf_key_usage(key_encipherment=True), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(str(identity))]),
            critical=True,  # RFC 5280: critical when the subject is empty-ish, as Istio's are
        )
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    return KeyPair(cert_pem=cert.public_bytes(serialization.Encoding.PEM), key_pem=_key_pem(key))


def signing_ca(
    *,
    ca_cert: bytes,
    ca_key: bytes,
    trust_domain: str,
    root_cert: bytes | None = None,
    cert_chain: bytes | None = None,
) -> SigningCa:
    """The CA of an Istio plug-in CA directory (``cacerts``), checked before it signs anything.

    ``ca_cert``/``ca_key`` sign (RSA or EC, as Istio's tools make them); ``root_cert`` is the
    root workloads trust and ``cert_chain`` what follows their leaf, Istio's file names both;
    for a self-signed ``ca_cert`` neither is needed. Raises ``CaError`` naming the file.
    """
    try:
        cert = x509.load_pem_x509_certificate(ca_cert)
    except ValueError as exc:
        raise CaError(f"{CA_CERT_FILE} is not a PEM certificate") from exc
    _signing_key(ca_key)
    if not key_matches(ca_cert, ca_key):
        raise CaError(f"{CA_KEY_FILE} is not the key of {CA_CERT_FILE}")
    try:
        is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
    except x509.ExtensionNotFound:
        is_ca = False
    if not is_ca:
        raise CaError(f"{CA_CERT_FILE} is not a CA certificate (basicConstraints CA:FALSE)")
    # Only roots minted here name their trust domain; any other CA may sign for any of them.
    prefix = _DEV_ROOT_CN.partition("(")[0]
    for cn in cert.subject.get_attributes_for_oid(NameOID.COMMON_NAME):
        value = str(cn.value)
        if value.startswith(prefix) and value != _DEV_ROOT_CN.format(trust_domain):
            raise CaError(f"{CA_CERT_FILE} is a development root for another trust domain")
    self_signed = cert.issuer == cert.subject
    if root_cert is None and not self_signed:
        raise CaError(f"{CA_CERT_FILE} is an intermediate: {ROOT_CERT_FILE} must be beside it")
    for name, pem in ((ROOT_CERT_FILE, root_cert), (CERT_CHAIN_FILE, cert_chain)):
        if pem is not None and not _certificates(pem):
            raise CaError(f"{name} holds no PEM certificate")
    # Without cert-chain.pem a root adds nothing after the leaf, an intermediate adds itself.
    default_chain = b"" if self_signed else ca_cert
    return SigningCa(
        signer=KeyPair(cert_pem=ca_cert, key_pem=ca_key),
        chain_pem=cert_chain if cert_chain is not None else default_chain,
        root_pem=root_cert if root_cert is not None else ca_cert,
    )


def _signing_key(pem: bytes) -> ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except TypeError as exc:
        raise CaError(f"{CA_KEY_FILE} is encrypted; store it unencrypted for signing") from exc
    except ValueError as exc:
        raise CaError(f"{CA_KEY_FILE} is not a PEM private key") from exc
    if not isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey):
        raise CaError(f"{CA_KEY_FILE} holds a {type(key).__name__}; RSA or EC keys can sign")
    return key


def _certificates(pem: bytes) -> list[x509.Certificate]:
    try:
        return x509.load_pem_x509_certificates(pem)
    except ValueError:
        return []


def describe(pem: bytes) -> list[CertFacts]:
    """Facts about every certificate in a PEM bundle, in order (leaf first for a chain)."""
    facts = []
    for cert in x509.load_pem_x509_certificates(pem):
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
            uris = tuple(san.get_values_for_type(x509.UniformResourceIdentifier))
        except x509.ExtensionNotFound:
            uris = ()
        try:
            is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        facts.append(
            CertFacts(
                serial=format(cert.serial_number, "x"),
                subject=cert.subject.rfc4514_string(),
                not_before=cert.not_valid_before_utc,
                not_after=cert.not_valid_after_utc,
                uri_sans=uris,
                is_ca=is_ca,
            )
        )
    return facts


def key_matches(cert_pem: bytes, key_pem: bytes) -> bool:
    """Whether ``key_pem`` is the private key of the first certificate in ``cert_pem``."""
    cert = x509.load_pem_x509_certificates(cert_pem)[0]
    key = serialization.load_pem_private_key(key_pem, password=None)
    return bool(
        cert.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        == key.public_key().public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )


def pair_problem(cert_pem: bytes, key_pem: bytes) -> tuple[str, str] | None:
    """What keeps a certificate file and a key file from serving TLS, as (``"cert"``, ``"key"``
    or ``"pair"``, the reason in words), or None when they make a pair; for messages that name
    the file at fault instead of OpenSSL's ``PEM lib``."""
    try:
        x509.load_pem_x509_certificates(cert_pem)
    except ValueError:
        return "cert", "holds no PEM certificate"
    try:
        serialization.load_pem_private_key(key_pem, password=None)
    except TypeError:
        return "key", "holds an encrypted private key (give it unencrypted)"
    except (ValueError, UnsupportedAlgorithm):
        return "key", "holds no PEM private key"
    if not key_matches(cert_pem, key_pem):
        return "pair", "the key does not belong to the certificate"
    return None


def new_csr(identity: SpiffeId) -> tuple[str, bytes]:
    """A CSR as ztunnel sends one (fresh ECDSA P-256 key, SHA-256, empty subject, the SPIFFE id
    as the only SAN, not critical as in its default build), and the key (PKCS#8 PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    request = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name([]))
        .add_extension(
            x509.SubjectAlternativeName([x509.UniformResourceIdentifier(str(identity))]),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    return request.public_bytes(serialization.Encoding.PEM).decode(), _key_pem(key)


def accept_issued(
    chain: Sequence[str], roots_pem: bytes, identity: SpiffeId, key_pem: bytes, now: datetime
) -> str:
    """The chain to serve (leaf, then the intermediates; the roots left out) from a CA's answer,
    after checking that ``chain[0]`` is a valid certificate for ``identity`` over our key that
    verifies up ``chain`` to one of ``roots_pem`` (RFC 5280 path validation, as a TLS peer will
    do it). Raises ``IdentityError`` with the reason."""
    if not chain:
        raise IdentityError("the CA answered an empty certificate chain")
    try:
        certs = [x509.load_pem_x509_certificate(c.encode()) for c in chain]
        roots = x509.load_pem_x509_certificates(roots_pem)
    except ValueError as exc:
        raise IdentityError(f"the CA's answer is not PEM certificates: {exc}") from exc
    leaf = certs[0]
    if not key_matches(leaf.public_bytes(serialization.Encoding.PEM), key_pem):
        raise IdentityError("the issued certificate is not for the key we sent")
    uris = describe(leaf.public_bytes(serialization.Encoding.PEM))[0].uri_sans
    peer_identity(uris, trust_domain=identity.trust_domain, expected=[identity])
    try:
        verifier = (
            verification.PolicyBuilder()
            .store(verification.Store(roots))
            .time(now)
            .build_client_verifier()
        )
        intermediates = [c for c in certs[1:] if c not in roots]
        verifier.verify(leaf, intermediates)
    except (verification.VerificationError, ValueError) as exc:
        raise IdentityError(f"the issued certificate does not verify to our roots: {exc}") from exc
    return "".join(
        c.public_bytes(serialization.Encoding.PEM).decode() for c in (leaf, *intermediates)
    )


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
