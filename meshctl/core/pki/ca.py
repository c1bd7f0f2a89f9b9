"""The mesh certificate authority's rules: CSR checks, issuance policy, chains and CA bundles.

Owns what Istio's CA decides for ``CreateCertificate``: a CSR must be a valid, self-signed PKCS#10
request (RFC 2986) for an RSA (>= 2048 bits), ECDSA (P-256/P-384/P-521) or Ed25519 key, whose only
SAN is one URI, the SPIFFE id asked for; the leaf carries that URI SAN only (critical: the subject
is empty, RFC 5280 §4.2.1.6), EKU server + client auth, and lives for the requested time capped by
the maximum and by the signing certificate's own end; the answer's chain is leaf, intermediates,
root. Also a CA key pair as Istio keeps it (``ca-cert.pem``, ``ca-key.pem``, ``cert-chain.pem``,
``root-cert.pem``): checked to be a CA whose key matches and whose chain reaches a root of the
bundle; RSA and EC keys both sign.
Invariants: pure (times are passed in, nothing is read or written); a bad CSR is a ``CsrError``
and a bad CA bundle a ``CaError``, each with a one-line reason; private keys never enter a message.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from ipaddress import ip_address

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from meshctl.core.pki.certs import CA_KEY_USAGE, leaf_key_usage
from meshctl.core.pki.identity import IdentityError, SpiffeId

MAX_CSR_BYTES = 64 * 1024  # a P-256 CSR is ~400 bytes; Istio's are well under 4 KiB
DEFAULT_TTL = timedelta(hours=24)  # Istio's DEFAULT_WORKLOAD_CERT_TTL
MAX_TTL = timedelta(days=90)  # Istio's MAX_WORKLOAD_CERT_TTL
SELF_SIGNED_TTL = timedelta(days=3650)  # Istio's CITADEL_SELF_SIGNED_CA_CERT_TTL
_BACKDATE = timedelta(minutes=1)  # absorbs clock skew between the CA and the verifying peers
_MIN_RSA_BITS = 2048
_MAX_RSA_BITS = 8192
_CURVES = (ec.SECP256R1, ec.SECP384R1, ec.SECP521R1)
KEY_TYPES = ("ec-p256", "rsa-2048")

PublicKey = rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey
SigningKey = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey


class CsrError(ValueError):
    """The CSR cannot be signed; ``str()`` says why (the caller answers INVALID_ARGUMENT)."""


class TtlError(CsrError):
    """The requested lifetime is beyond the maximum (istiod's ``TTL_ERROR``)."""


class CaError(ValueError):
    """A CA key pair or bundle is unusable; ``str()`` says why and what to fix."""


@dataclass(frozen=True, slots=True)
class SigningRequest:
    """A checked CSR: its public key and the SANs it asks for."""

    public_key: PublicKey
    uris: tuple[str, ...]
    other_sans: tuple[str, ...]  # DNS names, IPs, emails... (refused for workload identities)


def parse_csr(pem: str) -> SigningRequest:
    """A CSR's key and SANs, once its format, signature and key are known to be acceptable."""
    data = pem.encode("utf-8", errors="replace")
    if len(data) > MAX_CSR_BYTES:
        raise CsrError(f"CSR is {len(data)} bytes; at most {MAX_CSR_BYTES} are accepted")
    if not data.strip():
        raise CsrError("CSR is empty: send a PEM PKCS#10 request")
    try:
        csr = x509.load_pem_x509_csr(data)
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise CsrError("CSR is not a PEM PKCS#10 certificate request") from exc
    try:
        valid = csr.is_signature_valid
        key = csr.public_key()
    except (ValueError, UnsupportedAlgorithm, InvalidSignature) as exc:
        raise CsrError(f"CSR cannot be checked: {exc}") from exc
    if not valid:
        raise CsrError("CSR signature does not verify with its own public key")
    public_key = _accepted_key(key)
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return SigningRequest(public_key, (), ())
    except (ValueError, x509.DuplicateExtension) as exc:
        raise CsrError(f"CSR extensions cannot be read: {exc}") from exc
    uris: list[str] = []
    others: list[str] = []
    for name in san:
        if isinstance(name, x509.UniformResourceIdentifier):
            uris.append(name.value)
        else:
            others.append(f"{type(name).__name__}:{name.value}")
    return SigningRequest(public_key, tuple(uris), tuple(others))


def _accepted_key(key: object) -> PublicKey:
    if isinstance(key, rsa.RSAPublicKey):
        if not _MIN_RSA_BITS <= key.key_size <= _MAX_RSA_BITS:
            raise CsrError(
                f"CSR has a {key.key_size}-bit RSA key; {_MIN_RSA_BITS}-{_MAX_RSA_BITS} accepted"
            )
        return key
    if isinstance(key, ec.EllipticCurvePublicKey):
        if not isinstance(key.curve, _CURVES):
            raise CsrError(f"CSR has an EC key on {key.curve.name}; use P-256, P-384 or P-521")
        return key
    if isinstance(key, ed25519.Ed25519PublicKey):
        return key
    raise CsrError(f"CSR has a {type(key).__name__} key; use ECDSA P-256 (as ztunnel) or RSA")


def requested_identity(request: SigningRequest) -> SpiffeId:
    """The one SPIFFE id the CSR asks for; anything more, less or else is refused."""
    count = len(request.uris) + len(request.other_sans)
    if count != 1 or not request.uris:
        listed = ", ".join((*request.uris, *request.other_sans)) or "none"
        raise CsrError(
            f"CSR must carry exactly one SAN, the URI spiffe://<td>/ns/<ns>/sa/<sa>; "
            f"it has {count} ({listed})"
        )
    try:
        return SpiffeId.parse(request.uris[0])
    except IdentityError as exc:
        raise CsrError(f"CSR's URI SAN: {exc}") from exc


def workload_ttl(
    requested_seconds: int, *, default: timedelta = DEFAULT_TTL, maximum: timedelta = MAX_TTL
) -> timedelta:
    """The lifetime to issue: the request's (0 or less: ``default``, capped by ``maximum``).

    A request beyond ``maximum`` is refused (``TtlError``), as istiod refuses it, rather than
    capped: a proxy that asked for 100 days and silently got 90 would renew later than it plans.
    """
    if requested_seconds <= 0:
        return min(default, maximum)
    if requested_seconds > maximum.total_seconds():
        raise TtlError(
            f"requested TTL {go_duration(requested_seconds)} is greater than the max allowed "
            f"TTL {go_duration(maximum.total_seconds())}"
        )
    return timedelta(seconds=requested_seconds)


def go_duration(seconds: float) -> str:
    """``seconds`` as Go's ``time.Duration.String`` writes it (``2160h0m0s``, ``5m0s``, ``30s``),
    so a refusal reads as istiod's does for the same request."""
    whole = int(seconds)
    fraction = f"{seconds - whole:.9f}".rstrip("0").rstrip(".")[1:] if seconds != whole else ""
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes}m{secs}{fraction}s"
    if minutes:
        return f"{minutes}m{secs}{fraction}s"
    return f"{secs}{fraction}s"


@dataclass(frozen=True, slots=True)
class Authority:
    """A signing CA: its certificate and key, the intermediates above it, the trusted roots.

    What every signature repeats (the chain's PEM, the issuer's key identifier) is computed once.
    """

    cert: x509.Certificate
    key: SigningKey
    intermediates: tuple[x509.Certificate, ...]  # above ``cert``, below the root
    anchor: x509.Certificate  # the root ``cert``'s chain ends at (``cert`` itself if self-signed)
    roots: tuple[x509.Certificate, ...]  # the whole trust bundle (several during a rotation)
    _chain: tuple[str, ...] = field(init=False, repr=False, compare=False)
    _key_id: x509.AuthorityKeyIdentifier = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        middle = [] if self.self_signed else [self.cert, *self.intermediates]
        object.__setattr__(self, "_chain", (*(_pem(c) for c in middle), _pem(self.anchor)))
        try:
            ski = self.cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
            key_id = x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski)
        except x509.ExtensionNotFound:
            key_id = x509.AuthorityKeyIdentifier.from_issuer_public_key(self.key.public_key())
        object.__setattr__(self, "_key_id", key_id)

    @property
    def self_signed(self) -> bool:
        return self.cert == self.anchor

    @property
    def key_id(self) -> x509.AuthorityKeyIdentifier:
        """The AuthorityKeyIdentifier extension every certificate it signs carries."""
        return self._key_id

    def cert_pem(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.PEM)

    def key_pem(self) -> bytes:
        """The signing key as PKCS#8 PEM (to store it back where it came from; never logged)."""
        return self.key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    @property
    def roots_pem(self) -> str:
        """The trust bundle as published in ``meshctl-ca-root-cert`` / ``root-cert.pem``."""
        return "".join(_pem(c) for c in self.roots)

    def chain_pems(self) -> list[str]:
        """What follows a leaf in a ``CreateCertificate`` answer: intermediates, then the root."""
        return list(self._chain)

    def serving_chain_pem(self) -> str:
        """What a TLS server this CA certified sends after its leaf: the intermediates only."""
        return "".join(self._chain[:-1])


def _pem(cert: x509.Certificate) -> str:
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def load_authority(
    *,
    ca_cert_pem: bytes,
    ca_key_pem: bytes,
    cert_chain_pem: bytes = b"",
    root_cert_pem: bytes = b"",
    now: datetime,
) -> Authority:
    """Check and load a CA: self-signed (no ``root_cert_pem``) or an intermediate under a root
    of ``root_cert_pem`` (Istio's plug-in ``cacerts``; ``cert_chain_pem`` may repeat the CA and
    the root, as Istio's own tooling writes it)."""
    cert = _one_cert(ca_cert_pem, "ca-cert.pem")
    key = _signing_key(ca_key_pem)
    if _spki(key.public_key()) != _spki(cert.public_key()):
        raise CaError("ca-key.pem is not the key of ca-cert.pem")
    _check_ca(cert, "ca-cert.pem", now)
    if root_cert_pem.strip():
        roots = tuple(_certs(root_cert_pem, "root-cert.pem"))
    else:
        if cert.issuer != cert.subject:
            raise CaError(
                "ca-cert.pem is not self-signed and no root-cert.pem was given "
                "(a plug-in CA needs ca-cert.pem, ca-key.pem, cert-chain.pem and root-cert.pem)"
            )
        roots = (cert,)
    for root in roots:
        _check_ca(root, "root-cert.pem", now)
    chain = _certs(cert_chain_pem, "cert-chain.pem") if cert_chain_pem.strip() else []
    intermediates = tuple(c for c in chain if c != cert and c not in roots)
    anchor = _anchor(cert, intermediates, roots)
    return Authority(cert=cert, key=key, intermediates=intermediates, anchor=anchor, roots=roots)


def _one_cert(pem: bytes, name: str) -> x509.Certificate:
    certs = _certs(pem, name)
    if len(certs) != 1:
        raise CaError(f"{name} holds {len(certs)} certificates; exactly one expected")
    return certs[0]


def _certs(pem: bytes, name: str) -> list[x509.Certificate]:
    try:
        certs = x509.load_pem_x509_certificates(pem)
    except ValueError as exc:
        raise CaError(f"{name} is not PEM certificates: {exc}") from exc
    if not certs:
        raise CaError(f"{name} holds no certificate")
    return certs


def _signing_key(pem: bytes) -> SigningKey:
    try:
        key = serialization.load_pem_private_key(pem, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as exc:
        raise CaError(
            "ca-key.pem is not an unencrypted PEM private key (PKCS#1, SEC 1 or PKCS#8)"
        ) from exc
    if isinstance(key, rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey | ed25519.Ed25519PrivateKey):
        return key
    raise CaError(f"ca-key.pem is a {type(key).__name__}; use an RSA or EC key")


def _spki(key: object) -> bytes:
    if not isinstance(key, rsa.RSAPublicKey | ec.EllipticCurvePublicKey | ed25519.Ed25519PublicKey):
        raise CaError(f"unsupported CA key type {type(key).__name__}")
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _check_ca(cert: x509.Certificate, name: str, now: datetime) -> None:
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        constraints = None
    if constraints is None or not constraints.ca:
        raise CaError(f"{name} ({cert.subject.rfc4514_string()}) is not a CA certificate")
    try:
        usage = cert.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        usage = None
    if usage is not None and not usage.key_cert_sign:
        raise CaError(f"{name} may not sign certificates (no keyCertSign key usage)")
    if now >= cert.not_valid_after_utc:
        raise CaError(f"{name} expired at {cert.not_valid_after_utc.isoformat()}")


def _signed_by(child: x509.Certificate, parent: x509.Certificate) -> bool:
    if child.issuer != parent.subject:
        return False
    try:
        child.verify_directly_issued_by(parent)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def _anchor(
    cert: x509.Certificate,
    intermediates: Sequence[x509.Certificate],
    roots: Sequence[x509.Certificate],
) -> x509.Certificate:
    """The root the signing cert's chain ends at; every link must verify."""
    current = cert
    for parent in intermediates:
        if not _signed_by(current, parent):
            raise CaError(
                f"cert-chain.pem is out of order: {current.subject.rfc4514_string()} is not "
                f"signed by {parent.subject.rfc4514_string()}"
            )
        current = parent
    for root in roots:
        if current == root or _signed_by(current, root):
            return root
    raise CaError(
        f"{current.subject.rfc4514_string()} is not signed by any certificate of "
        "root-cert.pem; the chain must end at a root of the bundle"
    )


def issue_workload(
    authority: Authority,
    public_key: PublicKey,
    identity: SpiffeId,
    *,
    ttl: timedelta,
    now: datetime,
) -> str:
    """A leaf for ``identity`` over ``public_key``, as PEM."""
    uri = x509.UniformResourceIdentifier(str(identity))
    return _issue(
        authority,
        public_key,
        x509.Name([]),
        [uri],
        ttl=ttl,
        now=now,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH],
    )


_MAX_COMMON_NAME = 64  # RFC 5280's ub-common-name


def issue_serving(
    authority: Authority,
    *,
    dns_names: Sequence[str],
    ip_addresses: Sequence[str] = (),
    ttl: timedelta,
    now: datetime,
) -> tuple[str, bytes]:
    """A TLS server certificate (PEM) and its fresh P-256 key (PKCS#8 PEM) for our own ports."""
    key = ec.generate_private_key(ec.SECP256R1())
    names: list[x509.GeneralName] = [x509.DNSName(d) for d in dns_names]
    names += [x509.IPAddress(ip_address(a)) for a in ip_addresses]
    # The CN is for old tools only (clients check the SAN); X.509 caps it at 64 characters
    # (ub-common-name), which a Service name in a long namespace exceeds: then no subject.
    subject = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, dns_names[0])]
        if len(dns_names[0]) <= _MAX_COMMON_NAME
        else []
    )
    cert = _issue(
        authority,
        key.public_key(),
        subject,
        names,
        ttl=ttl,
        now=now,
        usages=[ExtendedKeyUsageOID.SERVER_AUTH],
    )
    return cert, key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def _issue(
    authority: Authority,
    public_key: PublicKey,
    subject: x509.Name,
    sans: Sequence[x509.GeneralName],
    *,
    ttl: timedelta,
    now: datetime,
    usages: Sequence[x509.ObjectIdentifier],
) -> str:
    start = now - _BACKDATE
    end = min(now + ttl, authority.cert.not_valid_after_utc)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(authority.cert.subject)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            leaf_key_usage(key_encipherment=isinstance(public_key, rsa.RSAPublicKey)),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage(list(usages)), critical=False)
        # RFC 5280 §4.2.1.6: with an empty subject the SAN extension must be critical.
        .add_extension(x509.SubjectAlternativeName(list(sans)), critical=not subject)
        .add_extension(authority.key_id, critical=False)
    )
    cert = builder.sign(authority.key, _digest(authority.key))
    return cert.public_bytes(serialization.Encoding.PEM).decode()


def _digest(key: SigningKey) -> hashes.SHA256 | hashes.SHA384 | None:
    if isinstance(key, ed25519.Ed25519PrivateKey):
        return None  # Ed25519 signs the message itself (RFC 8410)
    if isinstance(key, ec.EllipticCurvePrivateKey) and key.curve.key_size > 256:
        return hashes.SHA384()
    return hashes.SHA256()


def mint_root(*, trust_domain: str, now: datetime, key_type: str = "ec-p256") -> tuple[str, bytes]:
    """A self-signed root for the mesh (Istio's: O=<trust domain>, ten years), and its key."""
    key: SigningKey
    if key_type == "rsa-2048":
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    elif key_type == "ec-p256":
        key = ec.generate_private_key(ec.SECP256R1())
    else:
        raise CaError(f"unknown CA key type {key_type!r}; use one of {', '.join(KEY_TYPES)}")
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, trust_domain)])
    public = key.public_key()
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _BACKDATE)
        .not_valid_after(now + SELF_SIGNED_TTL)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(CA_KEY_USAGE, critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, _digest(key))
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    return cert.public_bytes(serialization.Encoding.PEM).decode(), key_pem
