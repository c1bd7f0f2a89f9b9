"""Redaction: no private key, token or Secret value survives, whatever text it hides in."""

from __future__ import annotations

import base64
import json
import re

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives import serialization as ser
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.core.bugreport.redact import (
    JWT_MARKER,
    KEY_MARKER,
    MARKER,
    redact_object,
    redact_text,
    secret_stub,
)

PEM_KEY = re.compile(r"-----BEGIN .*PRIVATE KEY-----")


def _ec_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _pem(key, fmt=ser.PrivateFormat.PKCS8) -> str:
    return key.private_bytes(ser.Encoding.PEM, fmt, ser.NoEncryption()).decode()


def _body(pem: str) -> str:
    """The base64 of a PEM block, its lines joined."""
    return "".join(pem.strip().splitlines()[1:-1])


def _jwt(claims: dict[str, object]) -> str:
    def part(value: dict[str, object]) -> str:
        return base64.urlsafe_b64encode(json.dumps(value).encode()).rstrip(b"=").decode()

    return f"{part({'alg': 'RS256', 'kid': 'k1'})}.{part(claims)}.c2lnbmF0dXJlLWJ5dGVz"


def _certificate() -> str:
    key = _ec_key()
    name = x509.Name([x509.NameAttribute(x509.oid.NameOID.COMMON_NAME, "root")])
    import datetime

    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(1)
        .not_valid_before(now)
        .not_valid_after(now + datetime.timedelta(days=1))
        .sign(key, hashes.SHA256())
    )
    return cert.public_bytes(ser.Encoding.PEM).decode()


@pytest.mark.parametrize(
    "pem",
    [
        _pem(_ec_key()),
        _pem(_ec_key(), ser.PrivateFormat.TraditionalOpenSSL),
        _pem(rsa.generate_private_key(public_exponent=65537, key_size=2048)),
        _pem(
            rsa.generate_private_key(public_exponent=65537, key_size=2048),
            ser.PrivateFormat.TraditionalOpenSSL,
        ),
    ],
    ids=["pkcs8-ec", "sec1-ec", "pkcs8-rsa", "pkcs1-rsa"],
)
def test_a_private_key_is_gone_in_every_form_it_travels_in(pem):
    body = _body(pem)
    forms = {
        "pem in a log line": f"2026 INFO loaded {pem} done",
        "pem json-escaped": json.dumps({"key": pem}),
        "base64 of the pem": base64.b64encode(pem.encode()).decode(),
        "der base64 alone": body,
    }
    for name, text in forms.items():
        out = redact_text(text)
        assert not PEM_KEY.search(out), name
        assert body[20:60] not in out, name
        assert KEY_MARKER in out, name


def test_a_key_block_cut_short_is_redacted_to_the_end():
    pem = _pem(_ec_key())
    cut = "before\n" + pem[: len(pem) // 2]
    out = redact_text(cut)
    assert out == "before\n" + KEY_MARKER


def test_certificates_stay_readable():
    cert = _certificate()
    text = f"root-cert.pem: |\n{cert}"
    assert redact_text(text) == text
    assert redact_text(_body(cert)) == _body(cert)


def test_service_account_tokens_and_bearer_credentials_are_gone():
    token = _jwt({"iss": "https://kubernetes.default.svc", "sub": "system:serviceaccount:a:b"})
    text = (
        f"token={token}\nAuthorization: Bearer {token}\n"
        "Authorization: Bearer opaque-token-12345\n"
        '{"token": "s3cr3t-value"}\npassword: hunter2hunter2\n'
        f"header only {token.split('.')[0]}\n"
    )
    out = redact_text(text)
    assert "eyJ" not in out
    assert "opaque-token-12345" not in out
    assert "s3cr3t-value" not in out
    assert "hunter2hunter2" not in out
    assert JWT_MARKER in out


def test_a_jwt_glued_after_an_escape_is_still_found():
    token = _jwt({"sub": "x"})
    assert "eyJ" not in redact_text(json.dumps(f"line one\n{token}"))


def test_a_secret_is_its_name_and_type_only():
    secret = {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": "meshctl-ca-secret",
            "namespace": "meshctl-system",
            "annotations": {"kubectl.kubernetes.io/last-applied-configuration": "{data}"},
            "labels": {"a": "b"},
        },
        "type": "istio.io/ca-root",
        "data": {"ca-key.pem": "c2VjcmV0"},
        "stringData": {"x": "y"},
    }
    stub = secret_stub(secret)
    assert stub == {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": "meshctl-ca-secret", "namespace": "meshctl-system"},
        "type": "istio.io/ca-root",
    }
    # A Secret anywhere inside other data (a List) becomes its stub too.
    listed = redact_object({"apiVersion": "v1", "kind": "List", "items": [secret]})
    assert listed["items"] == [stub]


def test_objects_lose_credential_values_env_and_managed_fields():
    pem = _pem(_ec_key())
    deployment = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": "x", "managedFields": [{"manager": "kubectl"}]},
        "spec": {
            "template": {
                "spec": {
                    "containers": [
                        {
                            "name": "c",
                            "env": [
                                {"name": "API_TOKEN", "value": "plain-token-value"},
                                {"name": "LOG_LEVEL", "value": "info"},
                                {"name": "TLS_KEY", "value": pem},
                                {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {}}},
                                {"name": "AUTH_TOKEN", "value": "/var/run/secrets/tokens/t"},
                            ],
                        }
                    ]
                }
            }
        },
    }
    out = redact_object(deployment)
    env = out["spec"]["template"]["spec"]["containers"][0]["env"]
    assert env[0] == {"name": "API_TOKEN", "value": MARKER}
    assert env[1] == {"name": "LOG_LEVEL", "value": "info"}
    assert env[2]["value"].strip() == KEY_MARKER  # by the text rules: the name says nothing
    assert env[3] == {"name": "FROM_SECRET", "valueFrom": {"secretKeyRef": {}}}
    # A file's path says where the token is, not what it is: kept for the reader.
    assert env[4] == {"name": "AUTH_TOKEN", "value": "/var/run/secrets/tokens/t"}
    assert "managedFields" not in out["metadata"]
    kubeconfig = {"users": [{"user": {"token": "abc", "client-key-data": "LS0t"}}]}
    assert redact_object(kubeconfig) == {
        "users": [{"user": {"token": MARKER, "client-key-data": MARKER}}]
    }
    config_map = {"apiVersion": "v1", "kind": "ConfigMap", "binaryData": {"blob": "AAAA"}}
    assert redact_object(config_map)["binaryData"] == {"blob": "[binary, 3 bytes]"}


# --- properties -----------------------------------------------------------------------------

_PLAIN = st.text(
    alphabet=st.characters(
        whitelist_categories=("Ll", "Lu", "Nd", "Zs"), whitelist_characters=".:,;()_\n"
    ),
    max_size=200,
)
_KEYS = [_pem(_ec_key()), _pem(_ec_key(), ser.PrivateFormat.TraditionalOpenSSL)]
_TOKENS = [_jwt({"sub": "system:serviceaccount:ns:sa", "n": n}) for n in range(3)]


@given(before=_PLAIN, after=_PLAIN, key=st.sampled_from(_KEYS), token=st.sampled_from(_TOKENS))
@settings(max_examples=200, deadline=None)
def test_no_key_or_token_survives_any_surrounding_text(before, after, key, token):
    out = redact_text(before + key + " " + token + after)
    assert not PEM_KEY.search(out)
    assert _body(key)[10:50] not in out
    assert token.split(".")[1] not in out


@given(text=st.text(max_size=300))
@settings(max_examples=300, deadline=None)
def test_redaction_is_idempotent(text):
    once = redact_text(text)
    assert redact_text(once) == once


@given(text=_PLAIN)
@settings(max_examples=300, deadline=None)
def test_text_without_secrets_is_left_as_it_was(text):
    # Words from the credential list followed by ':' or '=' are the only plain text touched.
    if re.search(r"(?i)(token|password|passwd|secret|key|bearer|basic)", text):
        return
    assert redact_text(text) == text


def test_an_object_nested_without_end_is_cut_not_recursed_into():
    deep: object = "leaf"
    for _ in range(5000):
        deep = [deep]
    out = redact_object({"a": deep})
    depth = 0
    node = out["a"]
    while isinstance(node, list):
        node, depth = node[0], depth + 1
    assert node == "[cut: nested deeper than 200 levels]"
    assert depth == 200
