"""SPIFFE workload identities and the rules a peer certificate's identity must pass.

Owns: the ``spiffe://<trust-domain>/ns/<namespace>/sa/<service-account>`` form (SPIFFE ID spec,
the URI SAN Istio puts in workload certificates) and the verdicts on a peer's URI SANs. Invariant:
every function here takes values (strings, datetimes) and returns values or raises
``IdentityError`` with a one-line reason that names what to fix; nothing reads a file or a clock.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass
from datetime import datetime

SCHEME = "spiffe://"

# File names istio-agent writes for a workload (and ztunnel-style tools read), and the plug-in
# CA secret's (istio ``cacerts``). Here, not in ``certs``: readers of the names alone (the
# supervisor) must not load an X.509 library for them.
CERT_CHAIN_FILE = "cert-chain.pem"
KEY_FILE = "key.pem"
ROOT_CERT_FILE = "root-cert.pem"
CA_KEY_FILE = "ca-key.pem"
CA_CERT_FILE = "ca-cert.pem"

# SPIFFE ID spec §2.1: trust domain = lowercase letters, digits, '.', '-', '_'.
_TRUST_DOMAIN = re.compile(r"^[a-z0-9._-]+$")
# A Kubernetes namespace / service-account name (RFC 1123 label / subdomain).
_K8S_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")


def is_trust_domain(text: str) -> bool:
    """Whether ``text`` is a valid SPIFFE trust domain name (spec §2.1)."""
    return bool(_TRUST_DOMAIN.match(text))


class IdentityError(ValueError):
    """An identity string or a peer certificate failed a rule; ``str()`` is the reason."""


@dataclass(frozen=True, slots=True, order=True)
class SpiffeId:
    """An Istio workload identity: trust domain, namespace and service account."""

    trust_domain: str
    namespace: str
    service_account: str

    def __post_init__(self) -> None:
        if not _TRUST_DOMAIN.match(self.trust_domain):
            raise IdentityError(f"invalid trust domain {self.trust_domain!r}")
        names = (("namespace", self.namespace), ("service account", self.service_account))
        for what, value in names:
            if not _K8S_NAME.match(value):
                raise IdentityError(f"invalid {what} {value!r} (want a DNS-1123 name)")

    def __str__(self) -> str:
        return f"{SCHEME}{self.trust_domain}/ns/{self.namespace}/sa/{self.service_account}"

    @property
    def principal(self) -> str:
        """The form Istio's authorization policies match: the URI without ``spiffe://``."""
        return str(self)[len(SCHEME) :]

    @classmethod
    def parse(cls, uri: str) -> SpiffeId:
        """Parse a URI SAN; anything but the Istio ``/ns/<ns>/sa/<sa>`` path is refused."""
        if not uri.startswith(SCHEME):
            raise IdentityError(f"{uri!r} is not a SPIFFE ID (must start with {SCHEME})")
        trust_domain, _, path = uri[len(SCHEME) :].partition("/")
        parts = path.split("/")
        if len(parts) != 4 or parts[0] != "ns" or parts[2] != "sa":
            raise IdentityError(
                f"{uri!r} is not an Istio workload ID (want {SCHEME}<td>/ns/<ns>/sa/<sa>)"
            )
        return cls(trust_domain, parts[1], parts[3])


def parse_workload_ref(text: str) -> tuple[str, str, str]:
    """``NS/NAME/SA`` (``--workload``, ztunnel's ``PROXY_WORKLOAD_INFO``) as a triple."""
    parts = text.split("/")
    if len(parts) != 3 or not all(parts):
        raise IdentityError(f"workload {text!r} must be NAMESPACE/NAME/SERVICE_ACCOUNT")
    for value in parts:
        if not _K8S_NAME.match(value):
            raise IdentityError(f"workload {text!r}: {value!r} is not a DNS-1123 name")
    return parts[0], parts[1], parts[2]


def peer_identity(
    uri_sans: Iterable[str], *, trust_domain: str | None, expected: Collection[SpiffeId] = ()
) -> SpiffeId:
    """The identity a verified peer certificate proves, or ``IdentityError`` saying why not.

    Rules (Istio's): exactly one SPIFFE URI SAN; its trust domain must be ``trust_domain`` when
    given (the inbound check); when ``expected`` is non-empty the identity must be one of them
    (the outbound check: the destination workload's identity, or a service's subjectAltNames).
    Non-SPIFFE URI SANs are ignored.
    """
    spiffe = [u for u in uri_sans if u.startswith(SCHEME)]
    if not spiffe:
        raise IdentityError("peer certificate has no SPIFFE URI SAN")
    if len(spiffe) > 1:
        raise IdentityError(
            f"peer certificate has {len(spiffe)} SPIFFE URI SANs; exactly one allowed"
        )
    identity = SpiffeId.parse(spiffe[0])
    if trust_domain is not None and identity.trust_domain != trust_domain:
        raise IdentityError(
            f"peer identity {identity} is in trust domain {identity.trust_domain!r}, "
            f"not {trust_domain!r}"
        )
    if expected and identity not in expected:
        want = ", ".join(sorted(str(e) for e in expected))
        raise IdentityError(f"peer identity {identity} is not the expected {want}")
    return identity


def check_validity(not_before: datetime, not_after: datetime, now: datetime) -> None:
    """Refuse a certificate outside its validity window (used when loading our own certs)."""
    if now < not_before:
        raise IdentityError(f"certificate is not valid before {not_before.isoformat()}")
    if now >= not_after:
        raise IdentityError(f"certificate expired at {not_after.isoformat()}")
