"""Caller authentication for every gRPC service of the control plane (CA and discovery).

Owns turning a call's ``authorization: Bearer`` metadata into a ``Caller`` with a real
TokenReview (audiences ``istio-ca`` and ``meshctl-ca``), cached by the token's SHA-256 for the
token's remaining validity as Istio does (so a proxy's renewals and its discovery stream cost one
review per token), one review in flight per token however many calls carry it; and checking a
requested identity: the caller's own, or (node proxies listed in ``--trusted-node-accounts``)
one with a pod on the proxy's own node, both read from the API.
Invariants: the API's answer is trusted only as the TokenReview gives it (the token is never
parsed for identity, only for its ``exp`` to bound the cache); an unreachable API server is
UNAVAILABLE (the proxy retries), never "unauthenticated"; refusals are not cached, so a fixed
RBAC or a recreated pod counts at once; tokens are never logged.

Interface used by the services (keep it stable): ``await authenticate(metadata) -> Caller``,
``await authorize(caller, identity, impersonating=...)``, ``await node_of(caller) -> str``,
``is_node_proxy(caller)``; every refusal raises ``CallerError`` (``.status``: the gRPC status).
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import ParamSpec, TypeVar

from meshctl.core.pki import callers
from meshctl.core.pki.callers import Caller, CallerError
from meshctl.core.pki.identity import SpiffeId
from meshctl.errors import KubeError
from meshctl.kube import objects
from meshctl.kube.client import Kube
from meshctl.kube.resources import PODS
from meshctl.kube.tokens import review_token

log = logging.getLogger(__name__)

P = ParamSpec("P")
R = TypeVar("R")

# A token whose expiry cannot be read (not a JWT) is reviewed again after this long.
_UNKNOWN_EXPIRY_SECONDS = 60.0
_MAX_CACHED = 100_000


@dataclass(frozen=True, slots=True)
class _Entry:
    caller: Caller
    until: float  # wall-clock seconds (the token's exp is wall-clock too)


class Authenticator:
    """TokenReview-backed authentication with Istio's cache, and the impersonation rule."""

    def __init__(
        self,
        kube: Kube,
        *,
        trust_domain: str,
        node_accounts: frozenset[str],
        audiences: tuple[str, ...] = callers.AUDIENCES,
        clock: Callable[[], float] = time.time,
        on_review: Callable[[str], None] | None = None,
    ) -> None:
        self._kube = kube
        self._trust_domain = trust_domain
        self._node_accounts = node_accounts
        self._audiences = audiences
        self._clock = clock
        self._on_review = on_review or (lambda _result: None)
        self._cache: dict[bytes, _Entry] = {}
        self._pending: dict[bytes, asyncio.Future[Caller]] = {}
        self._nodes: dict[str, str] = {}  # pod uid -> node (a pod never moves)

    def is_node_proxy(self, caller: Caller) -> bool:
        return callers.is_node_proxy(caller, self._node_accounts)

    async def authenticate(self, metadata: Iterable[tuple[str, str | bytes]]) -> Caller:
        """The caller behind the call's bearer token (cached), or ``CallerError``."""
        token = callers.bearer_token(metadata)
        key = hashlib.sha256(token.encode()).digest()
        entry = self._cache.get(key)
        if entry is not None:
            if entry.until > self._clock():
                return entry.caller
            del self._cache[key]
        pending = self._pending.get(key)
        if pending is None:
            pending = asyncio.ensure_future(self._review(key, token))
            self._pending[key] = pending
            pending.add_done_callback(lambda _: self._pending.pop(key, None))
        # Shielded: one caller giving up (a deadline) must not cancel the others' review.
        return await asyncio.shield(pending)

    async def _review(self, key: bytes, token: str) -> Caller:
        try:
            verdict = await asyncio.to_thread(review_token, self._kube, token, self._audiences)
        except KubeError as exc:
            self._on_review("error")
            log.warning("TokenReview failed: %s", exc.message)
            raise CallerError(
                "UNAVAILABLE", f"cannot check the token with the API server: {exc.message}"
            ) from exc
        try:
            caller = callers.caller_from_verdict(verdict, trust_domain=self._trust_domain)
        except CallerError:
            self._on_review("refused")
            raise
        self._on_review("accepted")
        expiry = callers.token_expiry(token)
        now = self._clock()
        until = expiry.timestamp() if expiry is not None else now + _UNKNOWN_EXPIRY_SECONDS
        if until > now:
            self._remember(key, _Entry(caller, until))
        return caller

    def _remember(self, key: bytes, entry: _Entry) -> None:
        if len(self._cache) >= _MAX_CACHED:
            now = self._clock()
            self._cache = {k: e for k, e in self._cache.items() if e.until > now}
            while len(self._cache) >= _MAX_CACHED:  # still full of live tokens: oldest first
                del self._cache[next(iter(self._cache))]
        self._cache[key] = entry

    async def node_of(self, caller: Caller) -> str:
        """The node the caller's own pod runs on (the token's bound pod, checked in the API)."""
        if caller.pod_uid and caller.pod_uid in self._nodes:
            return self._nodes[caller.pod_uid]
        if not caller.pod_name:
            return callers.node_of_pod(None, caller)  # raises: not bound to a pod
        pod = await self._api(objects.get, self._kube, PODS, caller.pod_name, caller.namespace)
        node = callers.node_of_pod(pod, caller)
        if caller.pod_uid:
            if len(self._nodes) >= _MAX_CACHED:
                self._nodes.clear()
            self._nodes[caller.pod_uid] = node
        return node

    async def authorize(
        self, caller: Caller, requested: SpiffeId, *, impersonating: bool = False
    ) -> None:
        """Whether ``caller`` may obtain ``requested``; ``impersonating``: it asked on behalf
        of another workload (Istio's ``ImpersonatedIdentity``)."""
        verdict = callers.check_identity(caller, requested, node_accounts=self._node_accounts)
        if verdict == "self":
            return
        callers.require_impersonation(caller, requested, impersonating=impersonating)
        node = await self.node_of(caller)
        pods, _ = await self._api(
            objects.list_objects,
            self._kube,
            PODS,
            requested.namespace,
            field_selector=f"spec.nodeName={node}",
        )
        callers.check_node_has_account(pods, requested, node)

    async def _api(self, verb: Callable[P, R], *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return await asyncio.to_thread(verb, *args, **kwargs)
        except KubeError as exc:
            raise CallerError(
                "UNAVAILABLE", f"cannot check the caller's pods with the API server: {exc.message}"
            ) from exc
