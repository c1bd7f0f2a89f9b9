"""The proxy as a client of the mesh CA: certificates from ``CreateCertificate`` instead of files.

Owns the workload certificate's life as ztunnel leads it: a fresh ECDSA P-256 key and CSR per
request (the SPIFFE id the only SAN; ``ImpersonatedIdentity`` only when acting for another
workload), the projected service-account token sent with every call (re-read each time, so the
kubelet's rotation is used at once), the answer checked against the mounted mesh root
(``meshctl-ca-root-cert``) before use, renewal at half the lifetime, and the roots re-read so a
new trust bundle reaches the data plane without a new certificate.
Invariants: a certificate is replaced only by a checked one; while the CA cannot be reached the
current certificate stays in use (the data plane keeps serving and reports the failing renewal),
retried with a doubling delay capped at 30 s; every new certificate goes to the data plane over
the existing channel (new handshakes use it, open connections keep theirs); no key, token or PEM
is ever logged.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path

from meshctl import rpc
from meshctl.core.pki import certs as certs_mod
from meshctl.core.pki.identity import IdentityError, SpiffeId
from meshctl.core.wire import channel
from meshctl.process import Feed
from meshctl.proto import citadel_pb2, citadel_pb2_grpc

from .file_sources import LocalConfigSource, cert_facts

log = logging.getLogger(__name__)

_FIRST_RETRY = 0.5
_MAX_RETRY = 15.0  # as ztunnel's xDS reconnects: a CA back after an outage is found quickly
_CALL_TIMEOUT = 10.0


class CaClient:
    """``CreateCertificate`` calls over one TLS channel, trusting the mounted root bundle."""

    def __init__(
        self,
        address: str,
        *,
        auth: rpc.CallAuth,
        server_name: str | None = None,
        timeout: float = _CALL_TIMEOUT,
    ) -> None:
        self.address = address
        self._auth = auth
        self._server_name = server_name
        self._timeout = timeout
        self._channel: rpc.Channel | None = None
        self._roots = b""

    async def create(
        self,
        csr_pem: str,
        *,
        roots: bytes,
        ttl_seconds: int,
        impersonate: SpiffeId | None = None,
    ) -> list[str]:
        """The chain the CA answers (leaf first); ``rpc.RpcError`` when the call fails."""
        if self._channel is None or roots != self._roots:
            await self.close()
            # No server name: grpc checks the host of ``address`` (meshctl-controlplane.<ns>.svc).
            self._channel = rpc.connect(
                self.address, root_pem=roots, auth=self._auth, server_name=self._server_name
            )
            self._roots = roots
        request = citadel_pb2.IstioCertificateRequest(csr=csr_pem, validity_duration=ttl_seconds)
        if impersonate is not None:
            request.metadata.update({"ImpersonatedIdentity": str(impersonate)})
        stub = citadel_pb2_grpc.IstioCertificateServiceStub(self._channel)
        try:
            response = await rpc.unary(
                stub.CreateCertificate(request, timeout=self._timeout),
                what="CreateCertificate",
                address=self.address,
                server_name=self._server_name,
            )
        except rpc.RpcError as exc:
            if exc.code in ("UNAVAILABLE", "DEADLINE_EXCEEDED"):
                # A fresh channel next time: grpc's own reconnect backoff (up to 2 minutes)
                # would otherwise outlast a short outage.
                await self.close()
            raise
        return list(response.cert_chain)

    async def close(self) -> None:
        if self._channel is not None:
            channel, self._channel = self._channel, None
            with contextlib.suppress(Exception):
                await channel.close()


class CaFeed(Feed):
    """Certificates from the CA (renewed at half-life) and workloads from the local config."""

    def __init__(
        self,
        *,
        client: CaClient,
        identity: SpiffeId,
        root_file: Path,
        ttl_seconds: int,
        local_config: Path | None,
        impersonate: bool = False,
        root_check_seconds: float = 2.0,
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        warn: bool = True,
    ) -> None:
        """``warn``: as ``LocalConfigSource``'s."""
        self._client = client
        self.identity = identity
        self._root_file = root_file
        self._ttl = ttl_seconds
        self._impersonate = impersonate
        self._root_check = root_check_seconds
        self._clock = clock
        self.config = LocalConfigSource(local_config, warn=warn)
        self.certs: channel.Certs | None = None
        self._key = b""
        self._served = ""
        self._roots = b""
        self._refresh_at: datetime | None = None
        self.status = channel.CertSource(source="ca", ca_address=client.address, renewing=True)
        self._pending: list[channel.Message] = []
        self.issued = 0  # certificates accepted so far (tests and logs)
        self._told = ""  # the lasting failure logged already (logged once, not every retry)

    def current(self) -> list[channel.Message]:
        out: list[channel.Message] = [self.status]
        if self.certs is not None:
            out.append(self.certs)
        out.append(self.config.workloads)
        return out

    def changes(self) -> list[channel.Message]:
        out, self._pending = self._pending, []
        return out + self.config.changes()

    async def run(self) -> None:
        failures = 0
        try:
            while True:
                delay = self._root_check
                try:
                    roots = self._read_roots()
                    self._trust(roots)
                    if self._due():
                        await self._renew(roots)
                        failures = 0
                except (rpc.RpcError, IdentityError, OSError) as exc:
                    failures += 1
                    self._failed(exc)
                    delay = min(_MAX_RETRY, _FIRST_RETRY * 2 ** (failures - 1))
                    left = self._valid_for()
                    if left is not None:  # retry more often as the expiry nears
                        delay = min(delay, max(_FIRST_RETRY, left / 4))
                if self._refresh_at is not None and failures == 0:
                    left = (self._refresh_at - self._clock()).total_seconds()
                    delay = max(0.05, min(delay, left))
                await asyncio.sleep(delay)
        finally:
            await self._client.close()

    def _valid_for(self) -> float | None:
        if not self._served:
            return None
        end = certs_mod.describe(self._served.encode())[0].not_after
        return (end - self._clock()).total_seconds()

    def _read_roots(self) -> bytes:
        return read_roots(self._root_file)

    def _due(self) -> bool:
        return self._refresh_at is None or self._clock() >= self._refresh_at

    def _trust(self, roots: bytes) -> None:
        """A changed root bundle (rotation) goes to the data plane with the current leaf."""
        if roots == self._roots:
            return
        self._roots = roots
        if self.certs is not None:
            log.info("mesh root bundle changed; sending it to the data plane")
            self._publish()

    async def _renew(self, roots: bytes) -> None:
        csr_pem, key_pem = certs_mod.new_csr(self.identity)
        started = time.monotonic()
        chain = await self._client.create(
            csr_pem,
            roots=roots,
            ttl_seconds=self._ttl,
            impersonate=self.identity if self._impersonate else None,
        )
        served = certs_mod.accept_issued(chain, roots, self.identity, key_pem, self._clock())
        self._key, self._served = key_pem, served
        self._told = ""
        self.issued += 1
        leaf = certs_mod.describe(served.encode())[0]
        now = self._clock()
        # Half of what is left from now, not from notBefore: a CA backdates for clock skew,
        # which would otherwise make a short-lived certificate due at once.
        self._refresh_at = now + (leaf.not_after - now) / 2
        self._publish()
        self.status = channel.CertSource(
            source="ca",
            ca_address=self._client.address,
            renewing=True,
            last_success=now.isoformat(),
            next_refresh=self._refresh_at.isoformat(),
        )
        self._pending.append(self.status)
        log.info(
            "certificate for %s from %s in %.0f ms, valid until %s (renewal at %s)",
            self.identity,
            self._client.address,
            (time.monotonic() - started) * 1000,
            leaf.not_after.isoformat(),
            self._refresh_at.isoformat(),
        )

    def _publish(self) -> None:
        generation = 0 if self.certs is None else self.certs.generation + 1
        roots = self._roots.decode()
        self.certs = channel.Certs(
            cert_chain=self._served,
            key=self._key.decode(),
            roots=roots,
            generation=generation,
            chain_facts=cert_facts(self._served),
            root_facts=cert_facts(roots),
        )
        self._pending.append(self.certs)

    def _failed(self, exc: Exception) -> None:
        message = exc.message if isinstance(exc, rpc.RpcError) else str(exc)
        now = self._clock()
        was = self.status
        since = was.failing_since if not was.renewing and was.failing_since else now.isoformat()
        self.status = channel.CertSource(
            source="ca",
            ca_address=self._client.address,
            renewing=False,
            last_error=message,
            failing_since=since,
            last_success=was.last_success,
            next_refresh=was.next_refresh,
        )
        self._pending.append(self.status)
        if isinstance(exc, rpc.RpcError) and exc.lasting:
            # No retry fixes this (a certificate or a setting must change): say it once, with
            # what to do; the status above keeps it visible in /config_dump.
            if message != self._told:
                log.error("%s; %s", message, exc.hint)
            self._told = message
            return
        self._told = ""
        expires = certs_mod.describe(self._served.encode())[0].not_after if self._served else None
        if expires is None:
            log.warning("no workload certificate yet: %s", message)
        elif expires <= now:
            log.error("workload certificate expired; renewal failing: %s", message)
        else:
            left = expires - now
            log.warning(
                "certificate renewal failed (current one valid %s more): %s",
                timedelta(seconds=int(left.total_seconds())),
                message,
            )


def read_roots(root_file: Path) -> bytes:
    """The mounted mesh root bundle; ``OSError`` saying what to mount when it is unusable."""
    try:
        roots = root_file.read_bytes()
    except OSError as exc:
        raise OSError(
            f"cannot read the mesh root {root_file}: {exc.strerror or exc} "
            "(mount the meshctl-ca-root-cert ConfigMap there)"
        ) from exc
    if b"-----BEGIN CERTIFICATE-----" not in roots:
        raise OSError(f"{root_file} holds no PEM certificate")
    return roots
