"""Which CA signs: the user's plug-in Secret ``cacerts``, else our self-signed root, and changes.

Owns the CA's life in the cluster: on start, ``cacerts`` in the control plane's namespace (Istio's
name and keys: ``ca-cert.pem``, ``ca-key.pem``, ``cert-chain.pem``, ``root-cert.pem``) makes the
control plane an intermediate; without it the root lives in ``meshctl-ca-secret`` (``ca-cert.pem``,
``ca-key.pem``), minted once and written create-only, so replicas racing on first start all end
up signing with the one root that won. A later change of ``cacerts`` (watched) is loaded in place
and announced to subscribers (serving certificates, root distribution, webhook caBundle).
Invariants: nothing of the user's is ever overwritten (an existing Secret is read, never
replaced); an unusable ``cacerts`` at start is a ``UserError`` naming the Secret and the reason,
and after start it is refused with an error log while the previous CA keeps signing; a deleted
``cacerts`` leaves the current CA in place until restart, and a deleted ``meshctl-ca-secret`` is
written back from memory (so no root changes by surprise, and replicas never split roots).
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from meshctl.core.pki import ca
from meshctl.errors import KubeError, UserError
from meshctl.kube import objects
from meshctl.kube.client import Kube
from meshctl.kube.informer import Informers
from meshctl.kube.resources import SECRETS
from meshctl.kube.rest import ApiStatusError
from meshctl.kube.watch import WatchEvent

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Secret

log = logging.getLogger(__name__)

SELF_SIGNED_SECRET = "meshctl-ca-secret"  # noqa: S105 -- a Secret's name
PLUG_IN_SECRET = "cacerts"  # noqa: S105 -- Istio's plug-in CA Secret name
_KEYS = ("ca-cert.pem", "ca-key.pem", "cert-chain.pem", "root-cert.pem")


class AuthorityStore:
    """The current signing ``Authority`` and who wants to hear when it changes."""

    def __init__(
        self,
        kube: Kube,
        informers: Informers,
        *,
        namespace: str,
        trust_domain: str,
        key_type: str = "ec-p256",
        clock: Callable[[], datetime] = lambda: datetime.now(UTC),
        retry_seconds: float = 2.0,
    ) -> None:
        self._kube = kube
        self._plug_in = informers.informer(
            SECRETS, namespace=namespace, field_selector=f"metadata.name={PLUG_IN_SECRET}"
        )
        self._own = informers.informer(
            SECRETS, namespace=namespace, field_selector=f"metadata.name={SELF_SIGNED_SECRET}"
        )
        self._namespace = namespace
        self._trust_domain = trust_domain
        self._key_type = key_type
        self._clock = clock
        self._retry = retry_seconds
        self._subscribers: list[Callable[[ca.Authority], None]] = []
        self.current: ca.Authority | None = None
        self.source = ""
        self.loaded = asyncio.Event()
        self._failure: BaseException | None = None

    def subscribe(self, callback: Callable[[ca.Authority], None]) -> None:
        self._subscribers.append(callback)

    async def wait_loaded(self) -> ca.Authority:
        """The first authority; raises what made loading impossible (a ``UserError``)."""
        await self.loaded.wait()
        if self._failure is not None:
            raise self._failure
        assert self.current is not None  # noqa: S101 -- set before loaded
        return self.current

    async def run(self) -> None:
        """Load the CA, then follow ``cacerts`` and ``meshctl-ca-secret`` until cancelled."""
        try:
            await asyncio.gather(self._follow_plug_in(), self._follow_own())
        except BaseException as exc:
            if not self.loaded.is_set():
                self._failure = exc
                self.loaded.set()
            raise

    async def _follow_plug_in(self) -> None:
        async with self._plug_in.subscribe() as events:
            async for event in events:
                await self._on_event(event)

    async def _follow_own(self) -> None:
        """While our own root signs: a deleted ``meshctl-ca-secret`` is written back from memory
        (a replica restarting then reads the root the others sign with, instead of minting a
        second one); a valid replacement written by the user is taken up by every replica."""
        where = f"Secret {self._namespace}/{SELF_SIGNED_SECRET}"
        async with self._own.subscribe() as events:
            async for event in events:
                current = self.current
                if self.source != SELF_SIGNED_SECRET or current is None:
                    continue
                if event.type == "DELETED":
                    log.warning("%s was deleted; writing the root in use back", where)
                    await self._restore(current, where)
                elif event.type in ("ADDED", "MODIFIED"):
                    try:
                        authority = _from_secret(event.object, where, self._clock())
                    except ca.CaError as exc:
                        log.error(  # noqa: TRY400 -- expected; the reason is the message
                            "%s changed but is unusable, still signing with the CA in use: %s",
                            where,
                            exc,
                        )
                        continue
                    if authority.cert != current.cert or authority.roots != current.roots:
                        self._use(authority, SELF_SIGNED_SECRET)

    async def _restore(self, authority: ca.Authority, where: str) -> None:
        body = _self_signed_secret(authority.cert_pem(), authority.key_pem())
        while True:
            try:
                await asyncio.to_thread(objects.create, self._kube, SECRETS, body, self._namespace)
            except ApiStatusError as exc:
                if objects.is_conflict(exc):
                    return  # another replica (or the user) wrote it first: the watch tells
                log.warning("%s: %s; retrying in %.0fs", where, exc.message, self._retry)
            except KubeError as exc:
                log.warning("%s: %s; retrying in %.0fs", where, exc.message, self._retry)
            else:
                return
            await asyncio.sleep(self._retry)

    async def _on_event(self, event: WatchEvent[Secret]) -> None:
        where = f"Secret {self._namespace}/{PLUG_IN_SECRET}"
        if event.type == "SYNCED":
            if not self.loaded.is_set():  # no cacerts at start: our own root
                self._use(await self._self_signed(), SELF_SIGNED_SECRET)
            return
        if event.type == "DELETED":
            log.warning("%s was deleted; still signing with the CA it held until restart", where)
            return
        try:
            authority = _from_secret(event.object, where, self._clock())
        except ca.CaError as exc:
            if not self.loaded.is_set():
                raise UserError(
                    f"{where} is unusable: {exc}",
                    hint="fix or delete the Secret (Istio's plug-in CA keys: "
                    + ", ".join(_KEYS)
                    + ")",
                ) from exc
            log.error(  # noqa: TRY400 -- expected; the reason is the message, no traceback
                "%s changed but is unusable, still signing with the previous CA: %s", where, exc
            )
            return
        self._use(authority, PLUG_IN_SECRET)

    def _use(self, authority: ca.Authority, source: str) -> None:
        changed = self.current is not None
        self.current = authority
        self.source = source
        subject = authority.cert.subject.rfc4514_string()
        log.info(
            "%s CA from Secret %s (%s)",
            "switched to the" if changed else "signing with the",
            source,
            subject,
        )
        self.loaded.set()
        for callback in self._subscribers:
            try:
                callback(authority)
            except Exception:
                log.exception("a CA subscriber failed")

    async def _self_signed(self) -> ca.Authority:
        """``meshctl-ca-secret``: read it, or mint a root and create it (create-only)."""
        where = f"Secret {self._namespace}/{SELF_SIGNED_SECRET}"
        while True:
            try:
                return await asyncio.to_thread(self._read_or_create, where)
            except KubeError as exc:
                log.warning("%s: %s; retrying in %.0fs", where, exc.message, self._retry)
            await asyncio.sleep(self._retry)

    def _read_or_create(self, where: str) -> ca.Authority:
        existing = objects.get(self._kube, SECRETS, SELF_SIGNED_SECRET, self._namespace)
        if existing is None:
            cert, key = ca.mint_root(
                trust_domain=self._trust_domain, now=self._clock(), key_type=self._key_type
            )
            body = _self_signed_secret(cert.encode(), key)
            try:
                existing = objects.create(self._kube, SECRETS, body, self._namespace)
                log.info("minted the mesh root CA into %s", where)
            except ApiStatusError as exc:
                if not objects.is_conflict(exc):
                    raise
                # Another replica won the race: sign with its root, never ours.
                existing = objects.get(self._kube, SECRETS, SELF_SIGNED_SECRET, self._namespace)
                if existing is None:
                    raise KubeError(f"{where} vanished right after being created") from exc
        try:
            return _from_secret(existing, where, self._clock())
        except ca.CaError as exc:
            raise UserError(
                f"{where} is unusable: {exc}",
                hint="fix ca-cert.pem / ca-key.pem, or stop every replica and delete it to mint "
                "a new root (every workload certificate then changes)",
            ) from exc


def _self_signed_secret(cert_pem: bytes, key_pem: bytes) -> Secret:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {
            "name": SELF_SIGNED_SECRET,
            "labels": {"app.kubernetes.io/managed-by": "meshctl"},
        },
        "type": "Opaque",
        "data": {
            "ca-cert.pem": base64.b64encode(cert_pem).decode(),
            "ca-key.pem": base64.b64encode(key_pem).decode(),
        },
    }


def _from_secret(secret: Secret, where: str, now: datetime) -> ca.Authority:
    data = secret.get("data") or {}
    values: dict[str, bytes] = {}
    for key in _KEYS:
        raw = data.get(key)
        if not raw:
            values[key] = b""
            continue
        try:
            values[key] = base64.b64decode(raw, validate=True)
        except (binascii.Error, ValueError) as exc:
            raise ca.CaError(f"{key} is not base64") from exc
    for key in ("ca-cert.pem", "ca-key.pem"):
        if not values[key].strip():
            raise ca.CaError(f"{where} has no {key}")
    return ca.load_authority(
        ca_cert_pem=values["ca-cert.pem"],
        ca_key_pem=values["ca-key.pem"],
        cert_chain_pem=values["cert-chain.pem"],
        root_cert_pem=values["root-cert.pem"],
        now=now,
    )
