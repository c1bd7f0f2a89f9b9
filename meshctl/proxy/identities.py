"""Per-pod identities for the node proxy: certificates issued per service account, cached, rotated.

Owns the node proxy's certificate state (ztunnel's secret manager): one certificate per SPIFFE
identity that an enrolled pod carries, issued when the first pod with that identity arrives,
rotated at half its lifetime, forgotten when the last such pod leaves. Issuance goes through an
``Issuer``: ``LocalCa`` mints from a development CA directory (``meshctl ztunnel certs``, as
ztunnel's fake-CA mode does); a control-plane CA client asks by impersonation (the proxy's own
token, the pod's identity as ``ImpersonatedIdentity``). Invariants: a pod's certificate carries
the pod's identity, never the node's; a failed issuance or rotation is retried with backoff while
the current certificate (if any) stays in use; PEM key material never reaches a log.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

from meshctl.core.pki import certs as certs_mod
from meshctl.core.pki.identity import SpiffeId
from meshctl.core.wire import channel
from meshctl.errors import UserError

if TYPE_CHECKING:
    from .ca_client import CaClient

log = logging.getLogger(__name__)

_RETRY_FIRST = 0.2
_RETRY_CAP = 30.0


@dataclass(frozen=True, slots=True)
class Issued:
    """A certificate chain (leaf first), its key and the roots peers are verified against."""

    chain: str
    key: str
    roots: str


class Issuer(Protocol):
    """Where certificates come from; ``issue`` raises ``OSError``/``UserError`` on failure."""

    name: str

    async def issue(self, identity: SpiffeId, ttl: timedelta) -> Issued: ...


def read_signing_ca(ca_dir: Path, trust_domain: str) -> certs_mod.SigningCa:
    """The CA in ``ca_dir`` in Istio's plug-in CA layout (``ca-cert.pem``, ``ca-key.pem``, RSA or
    EC; ``root-cert.pem`` and ``cert-chain.pem`` beside an intermediate), checked before it
    signs; a ``UserError`` naming the directory and the file otherwise."""

    def read(name: str, *, required: bool) -> bytes | None:
        path = ca_dir / name
        try:
            return path.read_bytes()
        except FileNotFoundError as exc:
            if not required:
                return None
            raise UserError(
                f"cannot read the CA in {ca_dir}: {name} is missing",
                hint="mint one with 'meshctl ztunnel certs --out DIR --workload NS/NAME/SA' "
                "(its CA lands in DIR/../ca), or give --ca-address",
            ) from exc
        except OSError as exc:
            raise UserError(
                f"cannot read the CA in {ca_dir}: {exc.strerror or exc}",
                hint="make the CA files readable by the proxy",
            ) from exc

    try:
        return certs_mod.signing_ca(
            ca_cert=read(certs_mod.CA_CERT_FILE, required=True) or b"",
            ca_key=read(certs_mod.CA_KEY_FILE, required=True) or b"",
            root_cert=read(certs_mod.ROOT_CERT_FILE, required=False),
            cert_chain=read(certs_mod.CERT_CHAIN_FILE, required=False),
            trust_domain=trust_domain,
        )
    except certs_mod.CaError as exc:
        raise UserError(
            f"the CA in {ca_dir} cannot sign: {exc}",
            hint="point --ca-dir at a CA in Istio's cacerts layout (or one minted by "
            "'meshctl ztunnel certs')",
        ) from exc


class LocalCa:
    """A CA on disk in Istio's plug-in CA layout (``read_signing_ca``): a development CA from
    ``meshctl ztunnel certs``, or the user's own root or intermediate (RSA or EC)."""

    def __init__(self, ca_dir: Path, trust_domain: str) -> None:
        self.name = f"local CA {ca_dir}"
        self._ca = read_signing_ca(ca_dir, trust_domain)

    async def issue(self, identity: SpiffeId, ttl: timedelta) -> Issued:
        # Key generation and signing take milliseconds: off the event loop.
        leaf = await asyncio.get_running_loop().run_in_executor(None, self._mint, identity, ttl)
        return Issued(
            chain=(leaf.cert_pem + self._ca.chain_pem).decode(),
            key=leaf.key_pem.decode(),
            roots=self._ca.root_pem.decode(),
        )

    def _mint(self, identity: SpiffeId, ttl: timedelta) -> certs_mod.KeyPair:
        return certs_mod.mint_workload(self._ca.signer, identity, now=datetime.now(UTC), ttl=ttl)


class CaIssuer:
    """The mesh CA (``CreateCertificate``), asked by impersonation: the node proxy's own token,
    the pod's identity as ``ImpersonatedIdentity`` (ztunnel's shared mode); the answer checked
    against the mounted mesh root before it is used."""

    def __init__(self, client: CaClient, *, root_file: Path) -> None:
        self.name = f"the CA at {client.address}"
        self._client = client
        self._root_file = root_file

    async def issue(self, identity: SpiffeId, ttl: timedelta) -> Issued:
        from .ca_client import read_roots

        roots = read_roots(self._root_file)
        from meshctl import rpc  # grpc (~20 MB) only in a proxy that talks to a CA

        csr_pem, key_pem = certs_mod.new_csr(identity)
        try:
            chain = await self._client.create(
                csr_pem, roots=roots, ttl_seconds=int(ttl.total_seconds()), impersonate=identity
            )
        except rpc.RpcError as exc:
            raise OSError(exc.message) from exc
        served = certs_mod.accept_issued(chain, roots, identity, key_pem, datetime.now(UTC))
        return Issued(chain=served, key=key_pem.decode(), roots=roots.decode())

    async def close(self) -> None:
        await self._client.close()


@dataclass(slots=True)
class _Entry:
    users: int = 0
    certs: channel.Certs | None = None
    task: asyncio.Task[None] | None = None
    failures: int = 0
    problem: str = ""


class Identities:
    """The certificates of the identities enrolled pods use; ``publish`` gets every new one."""

    def __init__(
        self,
        issuer: Issuer,
        *,
        ttl: timedelta,
        publish: Callable[[channel.Certs], None],
        refresh_at: float = 0.5,
    ) -> None:
        self.issuer = issuer
        self._ttl = ttl
        self._publish = publish
        self._refresh_at = refresh_at  # fraction of the lifetime after which to rotate
        self._entries: dict[SpiffeId, _Entry] = {}
        self._generation = 0

    def current(self) -> list[channel.Certs]:
        """Every certificate in use (what a new data plane needs)."""
        return [e.certs for e in self._entries.values() if e.certs is not None]

    def acquire(self, identity: SpiffeId) -> None:
        """A pod with ``identity`` arrived: issue a certificate unless one is held."""
        entry = self._entries.setdefault(identity, _Entry())
        entry.users += 1
        if entry.task is None:
            entry.task = asyncio.ensure_future(self._keep_fresh(identity, entry))

    def release(self, identity: SpiffeId) -> None:
        """A pod with ``identity`` left; the last one takes the certificate with it."""
        entry = self._entries.get(identity)
        if entry is None:
            return
        entry.users -= 1
        if entry.users <= 0:
            del self._entries[identity]
            if entry.task is not None:
                entry.task.cancel()

    def state(self, identity: SpiffeId) -> str:
        entry = self._entries.get(identity)
        if entry is None:
            return "Unknown"
        if entry.certs is None:
            return f"Initializing ({entry.problem})" if entry.problem else "Initializing"
        return "Available"

    def close(self) -> None:
        for entry in self._entries.values():
            if entry.task is not None:
                entry.task.cancel()
        self._entries.clear()

    async def _keep_fresh(self, identity: SpiffeId, entry: _Entry) -> None:
        while True:
            try:
                issued = await self.issuer.issue(identity, self._ttl)
                certs = self._certs(identity, issued)
            except (OSError, ValueError, UserError, TimeoutError) as exc:
                entry.failures += 1
                entry.problem = str(exc)
                delay = min(_RETRY_CAP, _RETRY_FIRST * 2 ** (entry.failures - 1))
                log.warning(
                    "certificate for %s from %s failed (%s); retrying in %.1fs",
                    identity,
                    self.issuer.name,
                    exc,
                    delay,
                )
                await asyncio.sleep(delay)
                continue
            entry.failures, entry.problem = 0, ""
            entry.certs = certs
            log.info("certificate for %s issued (generation %d)", identity, certs.generation)
            self._publish(certs)
            await asyncio.sleep(self._rotation_delay(certs))

    def _certs(self, identity: SpiffeId, issued: Issued) -> channel.Certs:
        from .file_sources import certs_message  # the one place PEMs become a Certs message

        self._generation += 1
        return certs_message(
            issued.chain, issued.key, issued.roots, identity, self._generation, named=True
        )

    def _rotation_delay(self, certs: channel.Certs) -> float:
        leaf = certs.chain_facts[0]
        start = datetime.fromisoformat(leaf["validFrom"])
        end = datetime.fromisoformat(leaf["expirationTime"])
        due = start + (end - start) * self._refresh_at
        return max(1.0, (due - datetime.now(UTC)).total_seconds())


async def cancel(task: asyncio.Task[None] | None) -> None:
    if task is not None:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
