"""The node agent of ambient mode: enrolls this node's pods and hands them to the node proxy.

Owns, for every pod on the node, the path from "should be in the mesh" (``meshctl.core.k8s.ambient``
over the pod and its namespace, from the API's watches or a local inventory file, and CNI
events) to "is": the in-pod rules applied in
the pod's netns from outside (the pod never has NET_ADMIN), the node's probe SNAT for its IPs,
the netns descriptor handed to the node proxy over ZDS and acknowledged, the pod annotated
``ambient.istio.io/redirection: enabled`` (or ``pending`` with a Warning event saying why); and
back again when a label changes, the pod goes or its sandbox is torn down. A level-triggered
reconciler (kopf's / controller-runtime's style): every trigger re-reads the desired state and
converges, idempotently; failures are retried with backoff.
Invariants: kernel changes run one at a time on one thread (libiptc and setns are per thread);
a pod's own steps are serialised; what is removed is exactly what was added (rules, SNAT entry,
proxy entry, annotation); the netns paths the plugin reported survive an agent restart in
``<run_dir>/ambient-pods.json``, so pods already running are enrolled again from the watch.
Without an API server (``--local-inventory``) the same reconciler runs on the file's objects;
the annotation and the Warning events then live only here (``enrollment()``, the log).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from meshctl.core.capture.plan import plan
from meshctl.core.capture.settings import settings_from_args
from meshctl.core.k8s import ambient
from meshctl.core.k8s.cni.spec import AGENT_RELEASED
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.core.wire import zds
from meshctl.errors import KubeError, MeshctlError
from meshctl.kube import objects
from meshctl.kube.client import Kube
from meshctl.kube.resources import NAMESPACES, PODS, Resource
from meshctl.kube.watch import AsyncWatch, WatchEvent
from meshctl.net import capture as kernel
from meshctl.net.netns import NetnsRef

from .zdsserver import ProxyUnavailableError, SnapshotEntry, ZdsServer

if TYPE_CHECKING:
    from .podfile import InventoryFile

log = logging.getLogger(__name__)

EVENTS = Resource("", "v1", "events", "Event")
STATE_FILE = "ambient-pods.json"
COMPONENT = "meshctl-cni-node"
_RETRY_FIRST = 0.5
_RETRY_CAP = 30.0
T = TypeVar("T")


class EnrollmentError(Exception):
    """A pod could not be enrolled; ``retry``: whether trying again later can help."""

    def __init__(self, message: str, *, retry: bool) -> None:
        super().__init__(message)
        self.retry = retry


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSettings:
    node_name: str
    run_dir: str
    zds_socket: str
    exclude_namespaces: tuple[str, ...]
    iptables_backend: str = "iptc"
    host_backend: str = "auto"  # the node's tables: whichever kind already holds rules
    dns_capture: bool = False
    ipv6: bool = False


@dataclass(eq=False)
class PodState:
    uid: str
    namespace: str
    name: str
    netns: str = ""  # the path the plugin reported
    container: str = ""
    ips: tuple[str, ...] = ()
    pod: dict[str, Any] | None = None  # the latest object seen
    fd: int | None = None  # the netns, held open while captured (the proxy's snapshot needs it)
    captured: bool = False  # in-pod rules and SNAT entry in place
    served: bool = False  # a node proxy acknowledged it
    annotated: str | None = None
    failures: int = 0
    reported: str = ""  # the last failure an event was recorded for
    retry: asyncio.TimerHandle | None = None
    lock: asyncio.Lock = field(default_factory=asyncio.Lock)

    @property
    def ref(self) -> str:
        return f"{self.namespace}/{self.name}"

    def info(self) -> zds.WorkloadInfo:
        spec = (self.pod or {}).get("spec") or {}
        sa = str(spec.get("serviceAccountName") or spec.get("serviceAccount") or "default")
        return zds.WorkloadInfo(self.name, self.namespace, sa)


class AmbientAgent:
    """The enrollment controller; ``run`` serves until ``stop`` is set."""

    def __init__(
        self, settings: AgentSettings, kube: Kube | None, *, inventory: InventoryFile | None = None
    ) -> None:
        """``kube``: the API server to watch and write to; ``inventory`` instead: no API."""
        if (kube is None) == (inventory is None):
            raise ValueError("the agent needs exactly one source: an API server or an inventory")
        self.settings = settings
        self.kube = kube
        self.inventory = inventory
        self.pods: dict[str, PodState] = {}
        self.namespaces: dict[str, dict[str, Any]] = {}
        self.synced = asyncio.Event()
        self._synced_kinds: set[str] = set()
        # One thread for every kernel change: libiptc and setns act per thread, and two
        # rule writers in one namespace at once would race.
        self._kernel = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="kernel")
        self._host_ips: frozenset[str] = frozenset()
        self._host_dirty = asyncio.Event()
        self._host_task: asyncio.Task[None] | None = None
        self._state_path = Path(settings.run_dir) / STATE_FILE
        self.zds = ZdsServer(
            settings.zds_socket,
            snapshot=self._snapshot,
            on_snapshot=self._snapshot_result,
            ready=self.synced,
        )
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- life --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event) -> None:
        self._load_state()
        self.zds.start()
        selector = f"spec.nodeName={self.settings.node_name}"
        try:
            async with contextlib.AsyncExitStack() as stack:
                readers = [asyncio.ensure_future(self._on_proxy_changes())]
                if self.inventory is not None:
                    readers.append(asyncio.ensure_future(self.inventory.follow(self._on_event)))
                else:
                    assert self.kube is not None  # noqa: S101 -- one source (the constructor)
                    pods = await stack.enter_async_context(
                        AsyncWatch(self.kube, PODS, field_selector=selector)
                    )
                    namespaces = await stack.enter_async_context(AsyncWatch(self.kube, NAMESPACES))
                    readers.append(asyncio.ensure_future(self._consume("pods", pods)))
                    readers.append(asyncio.ensure_future(self._consume("namespaces", namespaces)))
                try:
                    await stop.wait()
                finally:
                    for task in readers:
                        task.cancel()
        finally:
            for task in list(self._tasks):
                task.cancel()
            await self.zds.close()
            for state in self.pods.values():
                self._close_fd(state)
            self._kernel.shutdown(wait=False, cancel_futures=True)

    async def _consume(self, kind: str, events: AsyncWatch) -> None:
        async for event in events:
            self._on_event(kind, event)

    def _on_event(self, kind: str, event: WatchEvent) -> None:
        try:
            self._apply_event(kind, event)
        except Exception:  # one bad object must not stop the watch's consumer
            log.exception("%s event %s failed", kind, event.type)

    def _apply_event(self, kind: str, event: WatchEvent) -> None:
        if event.type == "SYNCED":
            self._synced_kinds.add(kind)
            if {"pods", "namespaces"} <= self._synced_kinds and not self.synced.is_set():
                log.info(
                    "%s synced: %d pods on node %s",
                    "watches"
                    if self.inventory is None
                    else f"local inventory {self.inventory.path}",
                    len(self.pods),
                    self.settings.node_name,
                )
                self._spawn(self._initial_sync())
            return
        obj = event.object
        meta = obj.get("metadata") or {}
        if kind == "namespaces":
            name = str(meta.get("name", ""))
            if event.type == "DELETED":
                self.namespaces.pop(name, None)
            else:
                self.namespaces[name] = obj
            for state in list(self.pods.values()):
                if state.namespace == name:
                    self.kick(state)
            return
        uid = str(meta.get("uid", ""))
        if not uid:
            return
        state = self._state(uid, str(meta.get("namespace", "")), str(meta.get("name", "")))
        if event.type == "DELETED":
            state.pod = None
        else:
            state.pod = obj
            state.annotated = (meta.get("annotations") or {}).get(ambient.REDIRECTION)
        self.kick(state)

    async def _initial_sync(self) -> None:
        """Pods that should be enrolled are captured again (idempotently) before the first
        proxy gets its snapshot, so the snapshot names every one of them."""
        await asyncio.gather(
            *(self.reconcile(s, hand_over=False) for s in list(self.pods.values())),
            return_exceptions=True,
        )
        self.synced.set()
        log.info(
            "initial enrollment done: %d pods captured", sum(s.captured for s in self.pods.values())
        )

    async def _on_proxy_changes(self) -> None:
        """A proxy (re)connected: pods still waiting for one are tried again."""
        while True:
            await self.zds.changed.wait()
            self.zds.changed.clear()
            if self.zds.connected:
                for state in list(self.pods.values()):
                    if state.captured and not state.served:
                        self.kick(state)

    # -- triggers ----------------------------------------------------------------------------

    def kick(self, state: PodState) -> None:
        """Reconcile ``state`` soon (coalesced: a pending retry is replaced)."""
        if state.retry is not None:
            state.retry.cancel()
            state.retry = None
        if self.synced.is_set():
            self._spawn(self.reconcile(state))

    async def cni_add(self, event: dict[str, Any]) -> tuple[int, str]:
        """A sandbox was set up (the plugin's ``/cmdadd``): remember its netns; enroll it now
        when the plugin found it enrolled, and answer only once that is done."""
        pod = event.get("pod") if isinstance(event.get("pod"), dict) else None
        uid = str(event.get("podUid") or "")
        if not uid or not event.get("netns"):
            return 400, "podUid and netns are required"
        state = self._state(uid, str(event.get("podNamespace", "")), str(event.get("podName", "")))
        if state.netns and state.netns != event["netns"]:
            # A new sandbox for the same pod: the old netns is gone or going.
            log.info("pod %s has a new sandbox netns %s", state.ref, event["netns"])
            self._close_fd(state)
            state.captured = state.served = False
        state.netns = str(event["netns"])
        state.container = str(event.get("containerId", ""))
        state.ips = tuple(str(ip) for ip in event.get("ips") or ())
        if pod is not None and state.pod is None:
            state.pod = pod
        self._save_state()
        if not event.get("enroll"):
            return 200, "noted"
        # The plugin read the pod a moment ago; our watch may not have it yet.
        if pod is not None:
            state.pod = pod
        async with state.lock:
            try:
                await self._enroll(state, from_cni=True)
            except EnrollmentError as exc:
                self._failed(state, str(exc), retry=False)  # the runtime retries the ADD
                return 500, str(exc)
        return 200, f"pod {state.ref} captured and served"

    async def cni_del(self, event: dict[str, Any]) -> tuple[int, str]:
        """A sandbox is being torn down: undo everything for it (the netns may still exist)."""
        uid = str(event.get("podUid") or "")
        state = self.pods.get(uid) if uid else self._by_name(event)
        if state is None:
            return 200, "unknown pod"
        if event.get("netns") and state.netns and event["netns"] != state.netns:
            return 200, "an older sandbox of the pod; nothing to do"
        async with state.lock:
            # A sandbox the plugin reported at ADD is one it did not capture itself (it reports
            # only those), so once ours are removed nothing of meshctl's is left in it. A pod
            # known only from the watch may be one the plugin captured (sidecar CNI mode).
            reported = bool(state.netns)
            await self._unenroll(state, reason="sandbox deleted")
            state.netns = ""
        self._forget_if_gone(state)
        self._save_state()
        if not reported:
            return 200, f"pod {state.ref}: its sandbox was not reported to the agent"
        return 200, f"{AGENT_RELEASED}: pod {state.ref}"

    # -- the reconciler ----------------------------------------------------------------------

    def desired(self, state: PodState) -> ambient.Enrollment:
        if state.pod is None:
            return ambient.Enrollment(False, "the pod is gone")
        namespace = self.namespaces.get(state.namespace)
        return ambient.enrollment(
            state.pod, namespace, excluded_namespaces=self.settings.exclude_namespaces
        )

    async def reconcile(self, state: PodState, *, hand_over: bool = True) -> None:
        """Converge ``state``; without ``hand_over`` (before the first proxy's snapshot, which
        will carry the pod) only the capture is restored."""
        async with state.lock:
            decision = self.desired(state)
            try:
                if decision.enrolled:
                    if not (state.captured and state.served):
                        await self._enroll(state, hand_over=hand_over)
                    elif state.annotated != ambient.REDIRECTION_ENABLED:
                        await self._annotate(state, ambient.REDIRECTION_ENABLED)
                elif state.captured or state.served or state.annotated:
                    await self._unenroll(state, reason=decision.reason)
            except EnrollmentError as exc:
                self._failed(state, str(exc), retry=exc.retry)
                return
            state.failures, state.reported = 0, ""
        self._forget_if_gone(state)

    async def _enroll(
        self, state: PodState, *, from_cni: bool = False, hand_over: bool = True
    ) -> None:
        """Rules, SNAT, proxy, annotation; each step idempotent (an interrupted enrollment
        resumes where it stopped)."""
        started = time.monotonic()
        if not state.netns:
            if state.container or not _running(state.pod):
                # Its sandbox is being set up (or was just torn down): the CNI ADD will come.
                log.debug("pod %s: waiting for its sandbox", state.ref)
                return
            raise EnrollmentError(
                f"pod {state.ref}: its network namespace is unknown (the sandbox started before "
                "the node agent saw it); restart the pod to enroll it",
                retry=False,
            )
        if state.fd is None:
            try:
                state.fd = os.open(state.netns, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise EnrollmentError(
                    f"pod {state.ref}: network namespace {state.netns} vanished: "
                    f"{exc.strerror or exc}",
                    retry=False,
                ) from exc
        if not state.captured:
            args = ambient.capture_args(
                state.pod or {}, dns=self._dns(state), ipv6=self.settings.ipv6
            )
            await self._in_kernel(self._apply_rules, state.netns, args)
            state.ips = state.ips or tuple(ambient.pod_ips(state.pod or {}))
            state.captured = True
            await self._sync_host()
        if not hand_over:
            return
        captured = time.monotonic()
        if not state.served:
            try:
                await self.zds.add(state.uid, state.info(), state.fd)
            except ProxyUnavailableError as exc:
                await self._annotate(state, ambient.REDIRECTION_PENDING)
                raise EnrollmentError(
                    f"pod {state.ref}: captured, but not handed to the node proxy: {exc}",
                    retry=True,
                ) from exc
            state.served = True
        done = time.monotonic()
        log.info(
            "pod %s (%s) enrolled%s in %.0f ms (capture %.0f ms, node proxy %.0f ms)",
            state.ref,
            state.uid,
            " (CNI ADD)" if from_cni else "",
            (done - started) * 1000,
            (captured - started) * 1000,
            (done - captured) * 1000,
        )
        if from_cni:
            self._spawn(self._annotate_quietly(state, ambient.REDIRECTION_ENABLED))
        else:
            await self._annotate(state, ambient.REDIRECTION_ENABLED)

    async def _unenroll(self, state: PodState, *, reason: str) -> None:
        if state.served or state.captured:
            await self.zds.delete(state.uid)
            state.served = False
        if state.captured:
            if state.netns and Path(state.netns).exists():
                await self._in_kernel(self._clean_rules, state.netns)
            state.captured = False
            await self._sync_host()
        self._close_fd(state)
        if state.annotated and state.pod is not None:
            await self._annotate(state, None)
        state.annotated = None
        log.info("pod %s (%s) removed from the mesh: %s", state.ref, state.uid, reason)

    def _failed(self, state: PodState, message: str, *, retry: bool) -> None:
        log.error("%s", message)  # one line: which pod, what failed, what to do
        if message != state.reported:  # one event per distinct failure, not one per retry
            state.reported = message
            self._spawn(self._event(state, "AmbientEnrollmentFailed", message))
        if not retry or state.pod is None:
            return
        state.failures += 1
        delay = min(_RETRY_CAP, _RETRY_FIRST * 2 ** (state.failures - 1))
        loop = asyncio.get_running_loop()
        state.retry = loop.call_later(delay, lambda: self._spawn(self.reconcile(state)))

    # -- the node proxy's snapshot -----------------------------------------------------------

    def _snapshot(self) -> list[SnapshotEntry]:
        # Every captured pod: a pod whose namespace this agent has not seen yet (its watch
        # lags) must not be dropped by the proxy; the reconciler removes what is not wanted.
        return [SnapshotEntry(s.uid, s.info(), s.fd) for s in self.pods.values() if s.captured]

    def _snapshot_result(self, uid: str, ack: zds.Ack) -> None:
        state = self.pods.get(uid)
        if state is None:
            return
        state.served = ack.ok
        self.kick(state)  # annotate, or retry a refusal

    # -- kernel ------------------------------------------------------------------------------

    async def _in_kernel(self, fn: Callable[..., T], *args: Any) -> T:
        loop = asyncio.get_running_loop()
        try:
            return await loop.run_in_executor(self._kernel, fn, *args)
        except MeshctlError as exc:
            raise EnrollmentError(exc.message, retry=False) from exc

    def _dns(self, state: PodState) -> bool:
        """DNS stays uncaptured: the node proxy has no DNS proxy on 15053 yet, and capturing
        DNS to a port nobody serves would break the pod's name resolution."""
        try:
            wanted = ambient.dns_requested(state.pod or {}, default=self.settings.dns_capture)
        except InvalidAnnotationError as exc:
            log.warning("pod %s: %s; DNS not captured", state.ref, exc.message)
            return False
        if wanted:
            log.warning(
                "pod %s asks for DNS capture (%s), which this node proxy does not serve yet; "
                "its DNS is not captured",
                state.ref,
                ambient.DNS_CAPTURE,
            )
        return False

    def _apply_rules(self, netns: str, args: list[str]) -> None:
        settings = settings_from_args(args)
        kernel.apply(
            plan(settings),
            target=NetnsRef(netns, netns),
            backend=self.settings.iptables_backend,
        )

    def _clean_rules(self, netns: str) -> None:
        kernel.clean(target=NetnsRef(netns, netns), backend="auto")

    async def _sync_host(self) -> None:
        """Bring the node's probe SNAT in line with the captured pods, in the background: a
        probe that comes first goes through the pod's 15006 instead (still served), so a pod's
        start does not wait for the node's tables (an iptables-restore run on most nodes)."""
        self._host_dirty.set()
        if self._host_task is None or self._host_task.done():
            self._host_task = asyncio.ensure_future(self._host_loop())

    async def _host_loop(self) -> None:
        while self._host_dirty.is_set():
            self._host_dirty.clear()
            wanted = frozenset(ip for s in self.pods.values() if s.captured for ip in s.ips)
            if wanted == self._host_ips:
                continue
            try:
                await self._in_kernel(self._apply_host, wanted)
            except EnrollmentError as exc:
                log.error("node probe rules not updated: %s; retrying", exc)  # noqa: TRY400
                await asyncio.sleep(1.0)
                self._host_dirty.set()
                continue
            self._host_ips = wanted

    async def host_synced(self) -> None:
        """Wait until the node's probe rules match the captured pods (tests, shutdown)."""
        while self._host_task is not None and not self._host_task.done():
            await asyncio.shield(self._host_task)

    def _apply_host(self, ips: frozenset[str]) -> None:
        kernel.apply_host_probe(sorted(ips), target=None, backend=self.settings.host_backend)

    # -- the API -----------------------------------------------------------------------------

    async def _annotate(self, state: PodState, value: str | None) -> None:
        if state.annotated == value or state.pod is None:
            return
        if self.kube is None:  # no API server: the annotation is this agent's record alone
            state.annotated = value
            return
        body = {"metadata": {"annotations": {ambient.REDIRECTION: value}}}
        try:
            await asyncio.to_thread(
                objects.patch, self.kube, PODS, state.name, body, state.namespace
            )
        except KubeError as exc:
            log.warning("pod %s: annotation %s not written: %s", state.ref, value, exc.message)
            return
        state.annotated = value

    async def _annotate_quietly(self, state: PodState, value: str) -> None:
        async with state.lock:
            if state.served:
                await self._annotate(state, value)

    async def _event(self, state: PodState, reason: str, message: str) -> None:
        if self.kube is None:
            return  # no API server: the error log line is the record
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        body = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"generateName": f"{state.name}.", "namespace": state.namespace},
            "involvedObject": {
                "apiVersion": "v1",
                "kind": "Pod",
                "name": state.name,
                "namespace": state.namespace,
                "uid": state.uid,
            },
            "reason": reason,
            "message": message[:1000],
            "type": "Warning",
            "source": {"component": COMPONENT, "host": self.settings.node_name},
            "reportingComponent": COMPONENT,
            "reportingInstance": self.settings.node_name,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        }
        try:
            await asyncio.to_thread(objects.create, self.kube, EVENTS, body, state.namespace)
        except KubeError as exc:
            log.warning("pod %s: event not recorded: %s", state.ref, exc.message)

    # -- bookkeeping -------------------------------------------------------------------------

    def enrollment(self) -> list[dict[str, Any]]:
        """Each known pod's enrollment as the agent holds it (``/status``; the annotation it
        wrote, or would write without an API server, and whether a node proxy acknowledged)."""
        return [
            {
                "namespace": s.namespace,
                "name": s.name,
                "uid": s.uid,
                "captured": s.captured,
                "served": s.served,
                "redirection": s.annotated or "",
                "error": s.reported,
            }
            for s in sorted(self.pods.values(), key=lambda s: (s.namespace, s.name))
        ]

    def _state(self, uid: str, namespace: str, name: str) -> PodState:
        state = self.pods.get(uid)
        if state is None:
            state = self.pods[uid] = PodState(uid, namespace, name)
        return state

    def _by_name(self, event: dict[str, Any]) -> PodState | None:
        ns, name = event.get("podNamespace"), event.get("podName")
        return next((s for s in self.pods.values() if (s.namespace, s.name) == (ns, name)), None)

    def _forget_if_gone(self, state: PodState) -> None:
        if state.pod is None and state.netns and not Path(state.netns).exists():
            state.netns = ""  # its sandbox is gone too (no CNI DEL reached us)
            self._save_state()
        if state.pod is None and not state.captured and not state.served and not state.netns:
            self._close_fd(state)
            self.pods.pop(state.uid, None)

    def _close_fd(self, state: PodState) -> None:
        if state.fd is not None:
            with contextlib.suppress(OSError):
                os.close(state.fd)
            state.fd = None

    def _spawn(self, coro: Any) -> None:
        task = asyncio.ensure_future(coro)
        self._tasks.add(task)
        task.add_done_callback(self._done)

    def _done(self, task: asyncio.Task[Any]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            log.error("ambient task failed", exc_info=task.exception())

    def _load_state(self) -> None:
        try:
            data = json.loads(self._state_path.read_text())
        except (OSError, ValueError):
            return
        for uid, entry in (data.get("pods") or {}).items() if isinstance(data, dict) else ():
            if not isinstance(entry, dict) or not Path(str(entry.get("netns", ""))).exists():
                continue  # that sandbox is gone: nothing to resume
            state = self._state(str(uid), str(entry.get("namespace")), str(entry.get("name")))
            state.netns = str(entry["netns"])
            state.ips = tuple(str(ip) for ip in entry.get("ips") or ())
            state.container = str(entry.get("containerId", ""))
        log.info("resumed %d pod netns records from %s", len(self.pods), self._state_path)

    def _save_state(self) -> None:
        data = {
            "pods": {
                s.uid: {
                    "namespace": s.namespace,
                    "name": s.name,
                    "netns": s.netns,
                    "ips": list(s.ips),
                    "containerId": s.container,
                }
                for s in self.pods.values()
                if s.netns
            }
        }
        tmp = self._state_path.with_suffix(".tmp")
        try:
            tmp.write_text(json.dumps(data))
            tmp.replace(self._state_path)
        except OSError as exc:
            log.warning("cannot save %s: %s", self._state_path, exc.strerror or exc)


def _running(pod: dict[str, Any] | None) -> bool:
    return bool(pod) and ((pod or {}).get("status") or {}).get("phase") == "Running"
