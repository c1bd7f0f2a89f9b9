"""Redaction: what a bug report must never carry, taken out of text and of Kubernetes objects.

Owns the rules: a Secret is reduced to its name, namespace and type (``secret_stub``); in text
(logs, config dumps, ConfigMap values, env values, annotations) every PEM private-key block,
base64 of a PEM private key, base64 DER of a private key (PKCS#1, PKCS#8, SEC 1), JWT (service-
account and projected tokens), bearer/basic credential and ``token:``/``password:``-style value
is replaced with a ``[REDACTED ...]`` marker; in objects, values under credential keys
(kubeconfig's ``token``, ``client-key-data``...) and env values of credential-named variables
are replaced whole. Invariants: pure; ``redact_text`` is idempotent (a marker matches no rule)
and leaves text without a secret unchanged; an unterminated private-key block (a log cut
short) is redacted to the end of the text rather than left half-visible.
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any

MARKER = "[REDACTED]"
KEY_MARKER = "[REDACTED private key]"
JWT_MARKER = "[REDACTED token]"

# RFC 7468's labels: "PRIVATE KEY", "RSA PRIVATE KEY", "EC PRIVATE KEY", "ENCRYPTED PRIVATE
# KEY", "OPENSSH PRIVATE KEY". JSON-escaped text (``\n`` as two characters) matches too.
_PEM_KEY = re.compile(
    r"-----BEGIN ([A-Z0-9 ]*?)PRIVATE KEY-----.*?(?:-----END \1PRIVATE KEY-----|\Z)", re.DOTALL
)
# A JWT (RFC 7519, compact JWS): header and payload are base64url JSON, so both start "eyJ".
# Matched anywhere: two dot-joined "eyJ" parts do not happen by chance inside other base64.
_JWT = re.compile(r"eyJ[A-Za-z0-9_-]{4,}\.eyJ[A-Za-z0-9_-]*(?:\.[A-Za-z0-9_-]*)?")
# Any other base64url JSON that starts a token (a JWT cut short, a token's header alone).
_JSON_B64_TOKEN = re.compile(r"(?<![A-Za-z0-9+/_-])eyJ[A-Za-z0-9_+/=-]{6,}")
_BEARER = re.compile(r"(?i)\b(bearer|basic)([ \t]+)[A-Za-z0-9._~+/=-]{8,}")
# ``token: x``, ``"password": "x"``, ``client-key-data=x`` in free text (YAML, JSON, logs).
_CREDENTIAL_WORDS = (
    r"token|id-token|refresh-token|access-token|client-key-data|client-key|password|passwd|"
    r"secret|api-?key|private-?key|privatekey"
)
_KEY_VALUE = re.compile(
    r"(?i)(?<![A-Za-z0-9_-])([\"']?(?:" + _CREDENTIAL_WORDS + r")[\"']?[ \t]*[:=][ \t]*)"
    r"([\"']?)([^\s\"',{}\[\]]{4,})"
)
_BASE64_RUN = re.compile(r"[A-Za-z0-9+/]{48,}={0,2}")
# base64 of "-----BEGIN": a PEM block base64-encoded whole (a kubeconfig's client-key-data).
_PEM_B64_PREFIX = "LS0tLS1CRUdJTi"

# Keys whose string value is a credential wherever they appear in an object (kubeconfig's
# user fields, common config spellings).
SENSITIVE_KEYS = frozenset(
    {
        "token",
        "id-token",
        "refresh-token",
        "access-token",
        "client-key-data",
        "client-key",
        "password",
        "passwd",
        "privatekey",
        "private-key",
        "private_key",
        "tokenfile",
    }
)
_FILE_PATH = re.compile(r"^/[\w./-]*$")
MAX_DEPTH = 200  # nesting levels of an object kept
# Env variables whose value is taken to be a credential by name.
_SENSITIVE_ENV = re.compile(r"(?i)token|secret|passw|credential|private_?key|api_?key")


def redact_text(text: str) -> str:
    """``text`` with every secret the rules know replaced by a marker."""
    text = _PEM_KEY.sub(KEY_MARKER, text)
    text = _BASE64_RUN.sub(_base64_run, text)
    text = _JWT.sub(JWT_MARKER, text)
    text = _JSON_B64_TOKEN.sub(JWT_MARKER, text)
    text = _BEARER.sub(lambda m: f"{m.group(1)}{m.group(2)}{MARKER}", text)
    return _KEY_VALUE.sub(lambda m: f"{m.group(1)}{m.group(2)}{MARKER}", text)


def _base64_run(match: re.Match[str]) -> str:
    run = match.group(0)
    if run.startswith(_PEM_B64_PREFIX):
        decoded = _b64(run)
        if decoded is None or b"PRIVATE KEY" in decoded:
            return KEY_MARKER
        return run
    head = _b64(run[:12])
    return KEY_MARKER if head is not None and is_der_private_key(head) else run


def _b64(text: str) -> bytes | None:
    text = text[: len(text) - len(text) % 4] if not text.endswith("=") else text
    try:
        return base64.b64decode(text, validate=True)
    except (binascii.Error, ValueError):
        return None


def is_der_private_key(head: bytes) -> bool:
    """Whether DER starting with ``head`` is a private key: a SEQUENCE whose first element is
    the small INTEGER version (0: PKCS#1 RSA and PKCS#8; 1: SEC 1 EC). A certificate's first
    element is a SEQUENCE (its TBSCertificate), a public key's too."""
    if len(head) < 5 or head[0] != 0x30:
        return False
    length = head[1]
    at = 2 if length < 0x80 else 2 + (length & 0x7F)
    return head[at : at + 3] in (b"\x02\x01\x00", b"\x02\x01\x01")


def secret_stub(secret: Mapping[str, Any]) -> dict[str, Any]:
    """A Secret as a bug report lists it: name, namespace, type and age, never its data (nor
    labels or annotations, which could carry it: ``last-applied-configuration``)."""
    meta = secret.get("metadata") or {}
    kept = {k: meta[k] for k in ("name", "namespace", "creationTimestamp") if k in meta}
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": kept,
        "type": str(secret.get("type") or "Opaque"),
    }


def redact_object(obj: Any, depth: int = 0) -> Any:
    """A JSON value (a Kubernetes object, a config dump) with every secret taken out: a Secret
    becomes its stub, ``managedFields`` go (noise), a ConfigMap's ``binaryData`` becomes sizes,
    credential keys and credential-named env values become markers, every other string goes
    through ``redact_text``; anything nested deeper than ``MAX_DEPTH`` becomes a marker (a
    peer's answer cannot make this recurse without end)."""
    if depth > MAX_DEPTH and isinstance(obj, Mapping | list):
        return f"[cut: nested deeper than {MAX_DEPTH} levels]"
    if isinstance(obj, Mapping):
        if obj.get("kind") == "Secret" and "apiVersion" in obj:
            return secret_stub(obj)
        out: dict[str, Any] = {}
        for key, value in obj.items():
            if key == "managedFields":
                continue
            if key == "binaryData" and isinstance(value, Mapping) and obj.get("kind"):
                out[key] = {k: f"[binary, {len(str(v)) * 3 // 4} bytes]" for k, v in value.items()}
            elif str(key).lower() in SENSITIVE_KEYS and isinstance(value, str) and value:
                out[key] = MARKER
            else:
                out[key] = redact_object(value, depth + 1)
        if _is_env_var(out):
            out["value"] = MARKER
        return out
    if isinstance(obj, list):
        return [redact_object(item, depth + 1) for item in obj]
    if isinstance(obj, str):
        return redact_text(obj)
    return obj


def _is_env_var(item: Mapping[str, Any]) -> bool:
    """A container's ``env`` entry whose name says it holds a credential."""
    name, value = item.get("name"), item.get("value")
    return (
        set(item) <= {"name", "value", "valueFrom"}
        and isinstance(name, str)
        and isinstance(value, str)
        and bool(value)
        and value != MARKER
        and not _FILE_PATH.match(value)  # where a credential is kept, not the credential
        and bool(_SENSITIVE_ENV.search(name))
    )
