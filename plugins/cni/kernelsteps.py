"""The node agent's kernel work: in-pod rules, the node's probe SNAT, and the enrollment dry run.

Owns every change the ambient agent makes to a kernel table, run one at a time on one thread
(libiptc and setns act per thread; two rule writers in one namespace at once would race).
Invariants: a pod's rules are written and removed by the same in-process writer (libiptc for
legacy tables: a pod's namespace is written by nobody else, so no xtables lock file is needed,
and a read-only root filesystem cannot break removal); the node's rules go to the kind of
tables the node's kubelet and kube-proxy use (``capture.apply_host_probe`` with ``auto``), and
the node's rules always equal the probe rules of the captured pods' IPs, converging in the
background with retries; a dry run never writes. The agent sees these steps through ``Kernel``,
so its reconciler can run against a stand-in (tests/unit/plugins/cni).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from meshctl.core.capture.plan import plan
from meshctl.core.capture.settings import CaptureSettings
from meshctl.errors import MeshctlError
from meshctl.net import capture as kernel
from meshctl.net.netns import NetnsRef

log = logging.getLogger(__name__)
T = TypeVar("T")
_HOST_RETRY = 1.0  # seconds between attempts at the node's rules


class KernelError(Exception):
    """A kernel step failed; the message names what and, where known, the fix."""


class Kernel(Protocol):
    """The kernel steps the agent takes (``KernelSteps``; a test's stand-in). Each raises
    ``KernelError`` when it fails."""

    host_error: str  # the last failure writing the node's rules ("" when in line)

    async def apply_pod(self, netns: str, capture: CaptureSettings) -> None:
        """Write the pod's capture rules (``capture``'s) into ``netns``."""

    async def clean_pod(self, netns: str) -> None:
        """Remove every rule of ours from ``netns``."""

    async def dry_run_pod(self, netns: str | None, capture: CaptureSettings) -> str:
        """What an enrollment would write into ``netns`` ("" = in place); nothing written."""

    def sync_host(self, ips: frozenset[str]) -> None:
        """Bring the node's probe rules in line with ``ips`` (the captured pods'), soon."""

    async def host_synced(self, timeout: float | None = None) -> bool:
        """Wait until the node's rules are in line; False if ``timeout`` passed first."""

    def close(self) -> None: ...


class KernelSteps:
    """One thread for every kernel change, and the node's probe rules kept in line."""

    def __init__(self, *, pod_backend: str, host_backend: str) -> None:
        self.pod_backend = pod_backend
        self.host_backend = host_backend
        self._wanted: frozenset[str] = frozenset()
        self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kernel")
        self._host_ips: frozenset[str] = frozenset()
        self._host_dirty = asyncio.Event()
        self._host_task: asyncio.Task[None] | None = None
        self.host_error = ""  # the last failure writing the node's rules ("" when in line)

    def call(self, fn: Callable[[], T]) -> T:
        """Run ``fn`` on the kernel thread from another thread (a CNI request's), waiting."""
        return self._pool.submit(fn).result()

    async def run(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._pool, fn, *args)
        except MeshctlError as exc:
            hint = f" ({exc.hint})" if exc.hint else ""
            raise KernelError(f"{exc.message}{hint}") from exc

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)

    # -- a pod's namespace -------------------------------------------------------------------

    async def apply_pod(self, netns: str, capture: CaptureSettings) -> None:
        await self.run(self._apply_pod, netns, capture)

    async def clean_pod(self, netns: str) -> None:
        await self.run(self._clean_pod, netns)

    async def dry_run_pod(self, netns: str | None, capture: CaptureSettings) -> str:
        """The restore input an enrollment would write into ``netns`` now ("" = in place);
        ``None``: into a fresh namespace of the agent's own (nothing enrolled to try on)."""
        return await self.run(self._dry_run, netns, capture)

    def _apply_pod(self, netns: str, capture: CaptureSettings) -> None:
        kernel.apply(
            plan(capture),
            target=NetnsRef(netns, netns),
            backend=self.pod_backend,
        )

    def _clean_pod(self, netns: str) -> None:
        kernel.clean(target=NetnsRef(netns, netns), backend="auto", in_process=True)

    def _dry_run(self, netns: str | None, capture: CaptureSettings) -> str:
        from meshctl.net import netns as namespaces

        rules = plan(capture)
        backend = self.pod_backend
        if netns is None:
            with namespaces.scratch():
                outcome = kernel.apply(rules, target=None, backend=backend, dry_run=True)
        else:
            target = NetnsRef(netns, netns)
            outcome = kernel.apply(rules, target=target, backend=backend, dry_run=True)
        return "".join(outcome.changes.values())

    # -- the node's tables -------------------------------------------------------------------

    def sync_host(self, ips: frozenset[str]) -> None:
        """Bring the node's probe SNAT in line with ``ips`` (the captured pods'), in the
        background: a probe that comes first goes through the pod's 15006 instead (still
        served), so a pod's start does not wait for the node's tables (an iptables-restore run
        on most nodes)."""
        self._wanted = ips
        self._host_dirty.set()
        if self._host_task is None or self._host_task.done():
            self._host_task = asyncio.ensure_future(self._host_loop())

    async def _host_loop(self) -> None:
        while self._host_dirty.is_set():
            self._host_dirty.clear()
            wanted = self._wanted
            if wanted == self._host_ips and not self.host_error:
                continue
            try:
                await self.run(self._apply_host, wanted)
            except KernelError as exc:
                if str(exc) != self.host_error:
                    log.error("node probe rules not updated: %s; retrying", exc)  # noqa: TRY400
                self.host_error = str(exc)
                await asyncio.sleep(_HOST_RETRY)
                self._host_dirty.set()
                continue
            if self.host_error:
                log.info("node probe rules updated after earlier failures")
            self.host_error = ""
            self._host_ips = wanted

    async def host_synced(self, timeout: float | None = None) -> bool:
        """Wait until the node's probe rules match the captured pods; False if ``timeout``
        passed first (the loop goes on retrying)."""
        try:
            async with asyncio.timeout(timeout):
                while self._host_task is not None and not self._host_task.done():
                    await asyncio.shield(self._host_task)
        except TimeoutError:
            return False
        return True

    def _apply_host(self, ips: frozenset[str]) -> None:
        kernel.apply_host_probe(sorted(ips), target=None, backend=self.host_backend)
