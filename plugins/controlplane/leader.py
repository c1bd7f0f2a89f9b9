"""Leader election over a ``coordination.k8s.io/v1`` Lease, as client-go's leaderelection does.

Owns who runs the writers (root ConfigMaps, the webhook's caBundle): every ``retry`` seconds a
replica tries to acquire or renew the Lease; a held Lease counts as expired only when its record
has not changed for ``lease_duration`` seconds of *our* clock (no comparison of two machines'
clocks); every write carries the resourceVersion read, so two replicas can never both win; a
leader that cannot renew within ``renew_deadline`` stops leading before another may take over;
on stop a leader releases the Lease (empty holder) so a successor starts at once.
Invariants: at most one task set runs per replica, started on acquiring and cancelled (awaited)
on losing or stopping; an API failure is retried, never fatal.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import TYPE_CHECKING

from meshctl.errors import KubeError
from meshctl.kube import objects
from meshctl.kube.client import Kube
from meshctl.kube.resources import LEASES
from meshctl.kube.rest import ApiStatusError

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Lease, LeaseSpec

log = logging.getLogger(__name__)

Writer = Callable[[], Awaitable[None]]


@dataclass(frozen=True, slots=True, kw_only=True)
class Timing:
    """client-go's defaults are 15 s / 10 s / 2 s; the relation lease > renew > retry must hold."""

    lease_duration: float = 15.0
    renew_deadline: float = 10.0
    retry: float = 2.0

    def __post_init__(self) -> None:
        if not self.lease_duration > self.renew_deadline > self.retry > 0:
            raise ValueError("need lease duration > renew deadline > retry period > 0")


def _micro_time(when: datetime) -> str:
    return when.strftime("%Y-%m-%dT%H:%M:%S.%fZ")  # metav1.MicroTime


class LeaderElection:
    """Runs ``writers`` while this replica holds the Lease ``name`` in ``namespace``."""

    def __init__(
        self,
        kube: Kube,
        *,
        namespace: str,
        name: str,
        identity: str,
        timing: Timing | None = None,
        on_change: Callable[[bool], None] | None = None,
    ) -> None:
        self._kube = kube
        self._namespace = namespace
        self._name = name
        self.identity = identity
        self._timing = timing or Timing()
        self._on_change = on_change or (lambda _leading: None)
        self._writers: list[tuple[str, Writer]] = []
        self._tasks: list[asyncio.Task[None]] = []
        self._observed: tuple[str, str] | None = None  # (holder, renewTime) last seen
        self._observed_at = 0.0
        self._renewed_at = 0.0
        self.leading = False
        self.holder = ""

    def add(self, name: str, writer: Writer) -> None:
        """A coroutine factory run (and restarted if it fails) while leading."""
        self._writers.append((name, writer))

    async def run(self, stop: asyncio.Event) -> None:
        """Elect until ``stop`` is set, then release the Lease if held."""
        try:
            while not stop.is_set():
                try:
                    held = await asyncio.to_thread(self._try_acquire_or_renew)
                except KubeError as exc:
                    log.warning("leader election: %s", exc.message)
                    held = False
                now = time.monotonic()
                if held:
                    self._renewed_at = now
                    if not self.leading:
                        await self._start_leading()
                elif self.leading and (
                    now - self._renewed_at >= self._timing.renew_deadline or self.holder
                ):
                    # Renewing failed for the whole deadline, or someone else holds it now.
                    await self._stop_leading()
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(stop.wait(), self._timing.retry)
        finally:
            was_leading = self.leading
            await self._stop_leading()
            if was_leading:
                with contextlib.suppress(KubeError):
                    await asyncio.to_thread(self._release)

    # -- one round (a thread: the API verbs block) ---------------------------------------------

    def _try_acquire_or_renew(self) -> bool:
        now = datetime.now(UTC)
        lease = objects.get(self._kube, LEASES, self._name, self._namespace)
        if lease is None:
            body: Lease = {
                "apiVersion": LEASES.api_version,
                "kind": LEASES.kind,
                "metadata": {"name": self._name, "namespace": self._namespace},
                "spec": self._spec(now, acquire=now, transitions=0),
            }
            try:
                objects.create(self._kube, LEASES, body, self._namespace)
            except ApiStatusError as exc:
                if objects.is_conflict(exc):
                    return False  # created by another replica a moment ago
                raise
            self.holder = ""
            return True
        spec = lease.get("spec") or {}
        holder = str(spec.get("holderIdentity") or "")
        record = (holder, str(spec.get("renewTime") or ""))
        if record != self._observed:
            self._observed = record
            self._observed_at = time.monotonic()
        duration = float(spec.get("leaseDurationSeconds") or self._timing.lease_duration)
        expired = time.monotonic() - self._observed_at >= duration
        if holder and holder != self.identity and not expired:
            self.holder = holder
            return False
        transitions = int(spec.get("leaseTransitions") or 0)
        mine = holder == self.identity
        acquired = spec.get("acquireTime") if mine else _micro_time(now)
        lease["spec"] = self._spec(
            now, acquire=acquired, transitions=transitions if mine else transitions + 1
        )
        try:
            objects.replace(self._kube, LEASES, lease, self._namespace)
        except ApiStatusError as exc:
            if objects.is_conflict(exc):
                return False  # someone wrote between our read and write: not ours this round
            raise
        self.holder = ""
        return True

    def _spec(self, now: datetime, *, acquire: object, transitions: int) -> LeaseSpec:
        return {
            "holderIdentity": self.identity,
            "leaseDurationSeconds": int(self._timing.lease_duration),
            "acquireTime": acquire if isinstance(acquire, str) else _micro_time(now),
            "renewTime": _micro_time(now),
            "leaseTransitions": transitions,
        }

    def _release(self) -> None:
        lease = objects.get(self._kube, LEASES, self._name, self._namespace)
        if lease is None or (lease.get("spec") or {}).get("holderIdentity") != self.identity:
            return
        now = datetime.now(UTC)
        lease["spec"].update(
            {"holderIdentity": None, "leaseDurationSeconds": 1, "renewTime": _micro_time(now)}
        )
        with contextlib.suppress(ApiStatusError):
            objects.replace(self._kube, LEASES, lease, self._namespace)
        log.info("released the leader lease %s/%s", self._namespace, self._name)

    # -- writers -------------------------------------------------------------------------------

    async def _start_leading(self) -> None:
        self.leading = True
        log.info("leading (lease %s/%s, as %s)", self._namespace, self._name, self.identity)
        self._on_change(True)
        self._tasks = [
            asyncio.ensure_future(self._keep_running(name, writer))
            for name, writer in self._writers
        ]

    async def _stop_leading(self) -> None:
        if not self.leading:
            return
        self.leading = False
        log.info("no longer leading (lease %s/%s)", self._namespace, self._name)
        self._on_change(False)
        tasks, self._tasks = self._tasks, []
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    async def _keep_running(self, name: str, writer: Writer) -> None:
        delay = 1.0
        while True:
            started = time.monotonic()
            try:
                await writer()
            except asyncio.CancelledError:
                raise
            except Exception:
                log.exception("writer %s failed; restarting it in %.0fs", name, delay)
            else:
                return
            if time.monotonic() - started > 60:
                delay = 1.0
            await asyncio.sleep(delay)
            delay = min(delay * 2, 30.0)
