"""Key pairs load into ssl from memory: never a file, never a passphrase prompt."""

from __future__ import annotations

import contextlib
import datetime
import ssl
import tempfile

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from meshctl import keypair


def _pair(name: str = "gw.example") -> tuple[bytes, bytes, ec.EllipticCurvePrivateKey]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(hours=1))
        .sign(key, hashes.SHA256())
    )
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), pem, key


def test_a_pair_loads_and_serves_without_a_writable_temp_dir(monkeypatch, tmp_path):
    monkeypatch.setenv("TMPDIR", str(tmp_path / "absent"))  # a read-only root has no /tmp
    monkeypatch.setattr(tempfile, "tempdir", None)
    chain, key, _ = _pair()
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    keypair.load_key_pair(context, chain, key)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    client.load_verify_locations(cadata=chain.decode())
    server_in, server_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    client_in, client_out = ssl.MemoryBIO(), ssl.MemoryBIO()
    server = context.wrap_bio(server_in, server_out, server_side=True)
    peer = client.wrap_bio(client_in, client_out, server_hostname="gw.example")
    for _ in range(10):  # the handshake in memory, both ends
        for end in (peer, server):
            with contextlib.suppress(ssl.SSLWantReadError):
                end.do_handshake()
        server_in.write(client_out.read())
        client_in.write(server_out.read())
    assert peer.getpeercert()["subject"] == ((("commonName", "gw.example"),),)
    assert list(tmp_path.iterdir()) == []


def test_a_key_of_another_certificate_is_refused():
    chain, _, _ = _pair()
    _, other_key, _ = _pair()
    with pytest.raises(ssl.SSLError):
        keypair.load_key_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), chain, other_key)


def test_an_encrypted_key_is_refused_not_prompted_for():
    chain, _, key = _pair()
    encrypted = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.BestAvailableEncryption(b"secret"),
    )
    with pytest.raises(ssl.SSLError):
        keypair.load_key_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), chain, encrypted)


def test_garbage_is_refused():
    with pytest.raises(ssl.SSLError):
        keypair.load_key_pair(ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER), b"junk", b"junk")
