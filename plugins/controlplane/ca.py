"""The CA service: Istio's ``istio.v1.auth.IstioCertificateService/CreateCertificate``.

Owns one call's path: authenticate the caller (``authn``), read the CSR and the identity it asks
for (``meshctl.core.pki.ca``), check the caller may have it (its own, or as a node proxy with
``ImpersonatedIdentity`` for a workload on its node), sign with the current authority and answer
leaf, intermediates, root. Invariants: every refusal is the gRPC status Istio uses with a
message that says why (UNAUTHENTICATED, PERMISSION_DENIED, INVALID_ARGUMENT, UNAVAILABLE), and is
counted by result with its latency; a bug in one call is INTERNAL for that call only; the CSR's
key is the leaf's key (the CA never sees a private key); signing uses the authority current when
the call started, so a CA swap never mixes chains.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Iterable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

from cryptography import x509

from meshctl import rpc
from meshctl.core.pki import ca
from meshctl.core.pki.callers import Caller, CallerError
from meshctl.core.pki.identity import IdentityError, SpiffeId
from meshctl.core.pki.issued import Issued, IssuedLedger, requester_of
from meshctl.proto import citadel_pb2, citadel_pb2_grpc

from .metrics import Metrics

log = logging.getLogger(__name__)

IMPERSONATED_IDENTITY = "ImpersonatedIdentity"  # the metadata key ztunnel sends in shared mode


class Callers(Protocol):
    """Who is calling and what it may have: ``authn.Authenticator`` (TokenReview) in a cluster,
    ``standalone.StaticTokens`` (a token file) without one."""

    async def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Caller: ...

    async def authorize(
        self, caller: Caller, requested: SpiffeId, *, impersonating: bool = False
    ) -> None: ...


class CertificateService(citadel_pb2_grpc.IstioCertificateServiceServicer):
    """Signs workload certificates for authenticated proxies."""

    def __init__(
        self,
        *,
        authenticator: Callers,
        authority: Callable[[], ca.Authority | None],
        metrics: Metrics,
        default_ttl: timedelta,
        max_ttl: timedelta,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        issued: IssuedLedger | None = None,
    ) -> None:
        """``issued``: where each signing is recorded (``proxy-status`` shows the expiry)."""
        self._authn = authenticator
        self.issued = issued if issued is not None else IssuedLedger()
        self._authority = authority
        self._metrics = metrics
        self._default_ttl = default_ttl
        self._max_ttl = max_ttl
        self._clock = clock
        self.active = 0  # calls being handled now (the drain waits for them)
        self.last_started = 0.0  # monotonic time the latest call began

    async def CreateCertificate(  # noqa: N802 -- the gRPC method name
        self,
        request: citadel_pb2.IstioCertificateRequest,
        context: Any,
    ) -> citadel_pb2.IstioCertificateResponse:
        started = time.perf_counter()
        self.active += 1
        self.last_started = time.monotonic()
        result = "internal"
        try:
            response = await self._create(request, context)
        except CallerError as exc:
            result = exc.status.lower()
            log.info("certificate refused (%s) for %s: %s", exc.status, rpc.peer(context), exc)
            await rpc.abort(context, exc.status, exc.message)
        except ca.CsrError as exc:
            result = "invalid_argument"
            log.info("certificate refused (bad CSR) for %s: %s", rpc.peer(context), exc)
            # istiod's words for a CSR it cannot sign (a TTL over the maximum included).
            await rpc.abort(context, "INVALID_ARGUMENT", f"CSR signing error ({exc})")
        except Exception:
            log.exception("CreateCertificate failed for %s", rpc.peer(context))
            await rpc.abort(context, "INTERNAL", "the CA failed to sign; see its log")
        else:
            result = "issued"
            return response
        finally:
            self.active -= 1
            self._metrics.ca_requests.labels(result).inc()
            self._metrics.ca_duration.labels(result).observe(time.perf_counter() - started)

    async def _create(
        self, request: citadel_pb2.IstioCertificateRequest, context: Any
    ) -> citadel_pb2.IstioCertificateResponse:
        try:
            caller = await self._authn.authenticate(rpc.call_metadata(context))
        except CallerError as exc:
            raise _istiod_words(exc, "request authenticate failure") from exc
        signing = ca.parse_csr(request.csr)
        wanted = ca.requested_identity(signing)
        impersonated = _impersonated(request)
        if impersonated is not None and impersonated != wanted:
            raise ca.CsrError(
                f"the CSR asks for {wanted} but ImpersonatedIdentity names {impersonated}"
            )
        try:
            await self._authn.authorize(caller, wanted, impersonating=impersonated is not None)
        except CallerError as exc:
            if impersonated is None:
                raise  # istiod has no such refusal: it signs the caller's own identity
            raise _istiod_words(exc, "request impersonation authentication failure") from exc
        authority = self._authority()
        if authority is None:
            raise CallerError("UNAVAILABLE", "the CA is not loaded yet; retry shortly")
        ttl = ca.workload_ttl(
            request.validity_duration, default=self._default_ttl, maximum=self._max_ttl
        )
        leaf = ca.issue_workload(authority, signing.public_key, wanted, ttl=ttl, now=self._clock())
        log.debug("issued %s to %s (%ss)", wanted, caller.account, int(ttl.total_seconds()))
        cert = x509.load_pem_x509_certificate(leaf.encode())
        self.issued.record(
            Issued(
                requester=requester_of(caller),
                identity=str(wanted),
                serial=format(cert.serial_number, "x"),
                not_before=cert.not_valid_before_utc,
                not_after=cert.not_valid_after_utc,
            )
        )
        return citadel_pb2.IstioCertificateResponse(cert_chain=[leaf, *authority.chain_pems()])


def _istiod_words(exc: CallerError, opening: str) -> CallerError:
    """A refusal as istiod answers it: UNAUTHENTICATED with its opening words (what a user's
    alerts on istiod's messages match), then why; UNAVAILABLE (the API server could not be
    asked, the proxy retries) stays as it is."""
    if exc.status == "UNAVAILABLE":
        return exc
    return CallerError("UNAUTHENTICATED", f"{opening}: {exc.message}")


def _impersonated(request: citadel_pb2.IstioCertificateRequest) -> SpiffeId | None:
    fields = request.metadata.fields
    if IMPERSONATED_IDENTITY not in fields:
        return None
    value = fields[IMPERSONATED_IDENTITY]
    if value.WhichOneof("kind") != "string_value":
        raise ca.CsrError(f"metadata {IMPERSONATED_IDENTITY} must be a string SPIFFE id")
    try:
        return SpiffeId.parse(value.string_value)
    except IdentityError as exc:
        raise ca.CsrError(f"metadata {IMPERSONATED_IDENTITY}: {exc}") from exc
