"""A plug-in CA directory in Istio's ``cacerts`` layout, as its self-signed Makefile makes one.

``root-cert.pem`` (a self-signed root), ``ca-cert.pem`` + ``ca-key.pem`` (an intermediate that
signs, its key in the traditional PKCS#1/SEC1 PEM form ``openssl genrsa``/``ecparam`` write)
and ``cert-chain.pem`` (the intermediate, then the root). RSA by default, as Istio's are.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import NameOID

Key = rsa.RSAPrivateKey | ec.EllipticCurvePrivateKey


def _key(kind: str) -> Key:
    if kind == "rsa":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    return ec.generate_private_key(ec.SECP384R1())


def _ca(subject: str, key: Key, issuer: x509.Name | None, signer: Key) -> x509.Certificate:
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Istio"),
            x509.NameAttribute(NameOID.COMMON_NAME, subject),
        ]
    )
    now = datetime.now(UTC)
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer or name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(days=1))
        .not_valid_after(now + timedelta(days=30))
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .sign(signer, hashes.SHA256())
    )


def write_istio_cacerts(folder: Path, kind: str = "rsa", *, intermediate: bool = True) -> Path:
    """Write the four files into ``folder`` (``kind``: rsa or ec); returns ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    root_key = _key(kind)
    root = _ca("Root CA", root_key, None, root_key)
    pem = serialization.Encoding.PEM
    if intermediate:
        ca_key = _key(kind)
        ca = _ca("Intermediate CA", ca_key, root.subject, root_key)
    else:
        ca_key, ca = root_key, root
    key_pem = ca_key.private_bytes(
        pem, serialization.PrivateFormat.TraditionalOpenSSL, serialization.NoEncryption()
    )
    (folder / "root-cert.pem").write_bytes(root.public_bytes(pem))
    (folder / "ca-cert.pem").write_bytes(ca.public_bytes(pem))
    (folder / "ca-key.pem").write_bytes(key_pem)
    if intermediate:
        (folder / "cert-chain.pem").write_bytes(ca.public_bytes(pem) + root.public_bytes(pem))
    return folder
