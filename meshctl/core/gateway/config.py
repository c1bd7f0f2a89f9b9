"""What one gateway proxy is given to serve: its route table, the certificates its HTTPS
listeners name, and the endpoints of the Services its routes send to.

Owns the seam between whoever computes a gateway's configuration (the control plane's
controller, which sends it over Delta xDS; or ``meshctl gateway run --config`` reading local
files) and the proxy that serves it. Invariants: a value is complete on its own (the proxy
needs nothing else to answer a request); certificates and endpoints are keyed exactly as the
table names them (``SecretRef`` of a listener, ``Backend.namespace/name/port``); a backend with
no entry in ``endpoints`` has no ready endpoint (503), which is not the same as an unresolved
backend (500, ``Backend.problem``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from .model import Backend, RouteTable, SecretRef


@dataclass(frozen=True, slots=True, kw_only=True)
class KeyPair:
    """A ``kubernetes.io/tls`` Secret's certificate chain and private key (PEM)."""

    chain_pem: bytes
    key_pem: bytes


@dataclass(frozen=True, slots=True, kw_only=True)
class Endpoint:
    """One ready endpoint of a Service port.

    ``address`` and ``port`` are where the workload listens (the Service's targetPort resolved).
    With ``hbone`` the proxy reaches it through the HBONE tunnel on the workload's port 15008
    (sidecar or ambient: the mesh's mTLS, checked against ``identity``); otherwise it connects in
    plaintext (an unmeshed workload)."""

    address: str
    port: int
    hbone: bool = False
    identity: str = ""  # spiffe://<trust domain>/ns/<ns>/sa/<sa> when hbone
    workload: str = ""  # "<namespace>/<name>" for logs and metrics labels ("" when unknown)


@dataclass(frozen=True, slots=True)
class BackendKey:
    namespace: str
    name: str
    port: int

    @classmethod
    def of(cls, backend: Backend) -> BackendKey:
        return cls(backend.namespace, backend.name, backend.port)

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}:{self.port}"


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayConfig:
    """One proxy's whole configuration (a new value replaces the old one atomically)."""

    name: str  # "<namespace>/<gateway>", or "ingress" for the Ingress classes' proxy
    version: str = ""  # the sender's version of this value (xDS nonce/version, a file's digest)
    table: RouteTable = field(default_factory=RouteTable)
    certificates: Mapping[SecretRef, KeyPair] = field(default_factory=dict)
    endpoints: Mapping[BackendKey, tuple[Endpoint, ...]] = field(default_factory=dict)

    def endpoints_of(self, backend: Backend) -> tuple[Endpoint, ...]:
        """The ready endpoints of ``backend`` (empty: none ready, or none known)."""
        return self.endpoints.get(BackendKey.of(backend), ())
