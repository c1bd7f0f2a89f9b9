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
import contextlib
import errno
import json
import logging
import os
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshctl.core.k8s import ambient
from meshctl.core.k8s.cni.spec import AGENT_RELEASED
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.core.wire import zds
from meshctl.errors import KubeError
from meshctl.kube import objects
from meshctl.kube.client import Kube
from meshctl.kube.resources import DAEMONSETS, NAMESPACES, PODS, Resource
from meshctl.kube.watch import AsyncWatch, WatchEvent

from .kernelsteps import KernelError, KernelSteps
from .zdsserver import ProxyUnavailableError, SnapshotEntry, ZdsServer

if TYPE_CHECKING:
    from .podfile import InventoryFile

log = logging.getLogger(__name__)

EVENTS = Resource("", "v1", "events", "Event")
STATE_FILE = "ambient-pods.json"
COMPONENT = "meshctl-cni-node"
_RETRY_FIRST = 0.5
_RETRY_CAP = 30.0
ENROLL_FAILED = "AmbientEnrollmentFailed"
REMOVAL_FAILED = "AmbientRemovalFailed"


class EnrollmentError(Exception):
    """A pod could not be enrolled (or removed: ``reason``); ``retry``: whether trying again
    later can help."""

    def __init__(self, message: str, *, retry: bool, reason: str = ENROLL_FAILED) -> None:
        super().__init__(message)
        self.retry = retry
        self.reason = reason


@dataclass(frozen=True, slots=True, kw_only=True)
class AgentSettings:
    node_name: str
    run_dir: str
    zds_socket: str
    exclude_namespaces: tuple[str, ...]
    iptables_backend: str = "iptc"
    host_backend: str = "auto"  # the node's tables: the kind its kubelet and kube-proxy use
    dns_capture: bool = False
    ipv6: bool = False
    # Where the runtime's pod netns files appear to this agent (the DaemonSet's mount): a
    # reported netns outside it cannot be opened here, and the error must say why.
    netns_dir: str = ""
    # The agent's own pod, to tell an uninstall from an upgrade on exit (``exit_plan``).
    pod_name: str = ""
    pod_namespace: str = ""
    release_on_exit: str = "auto"


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
        self.kernel = KernelSteps(
            pod_backend=settings.iptables_backend,
            host_backend=settings.host_backend,
            wanted_host_ips=self._captured_ips,
        )
        # Directories of reported netns paths this agent cannot see (the runtime pins them
        # outside the mounted netns directory): every pod there fails, and verify says why.
        self.netns_unseen: dict[str, str] = {}  # directory -> a pod whose netns was there
        self._state_path = Path(settings.run_dir) / STATE_FILE
        self.zds = ZdsServer(
            settings.zds_socket,
            snapshot=self._snapshot,
            on_snapshot=self._snapshot_result,
            ready=self.synced,
        )
        self._tasks: set[asyncio.Task[Any]] = set()

    # -- life --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, release: asyncio.Event | None = None) -> None:
        """Serve until ``stop``; when ``release`` is set by then (the mesh is being uninstalled
        from this node), every pod is taken out of the mesh first, so it keeps working."""
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
                if release is not None and release.is_set():
                    await self.release_all()
        finally:
            for task in list(self._tasks):
                task.cancel()
            await self.zds.close()
            for state in self.pods.values():
                self._close_fd(state)
            self.kernel.close()

    async def exit_plan(self) -> ambient.ExitPlan:
        """Whether stopping now is an uninstall (release every pod) or an upgrade (keep them),
        from this agent's DaemonSet as the API server has it now."""
        mode = self.settings.release_on_exit
        name, namespace = self.settings.pod_name, self.settings.pod_namespace
        if mode != "auto" or self.kube is None or not (name and namespace):
            return ambient.exit_plan(None, None, mode=mode)
        kube = self.kube
        try:
            async with asyncio.timeout(5):
                own = await asyncio.to_thread(objects.get, kube, PODS, name, namespace)
                refs = ((own or {}).get("metadata") or {}).get("ownerReferences") or ()
                owner = next((r for r in refs if r.get("kind") == "DaemonSet"), None)
                daemonset = None
                if owner is not None:
                    daemonset = await asyncio.to_thread(
                        objects.get, kube, DAEMONSETS, str(owner.get("name")), namespace
                    )
        except (KubeError, TimeoutError) as exc:
            why = exc.message if isinstance(exc, KubeError) else "no answer within 5 s"
            return ambient.ExitPlan(False, f"cannot read its DaemonSet ({why}): keeping them")
        return ambient.exit_plan(own, daemonset)

    async def release_all(self) -> list[str]:
        """Take every pod out of the mesh (the agent is being uninstalled): rules, the node's
        SNAT, the proxy's entry and the annotation removed, the state file deleted; returns the
        pods that could not be released (logged, each with its error)."""
        for task in list(self._tasks):
            task.cancel()
        left = []
        for state in list(self.pods.values()):
            if state.retry is not None:
                state.retry.cancel()
            if not (state.captured or state.served or state.annotated or state.netns):
                continue
            async with state.lock:
                try:
                    await self._unenroll(state, reason="the node agent is being uninstalled")
                except EnrollmentError as exc:
                    log.error("%s", exc)  # noqa: TRY400 -- one line, the pod and the fix
                    left.append(state.ref)
        if not await self.kernel.host_synced(timeout=10):
            log.error("the node's probe rules were not removed: %s", self.kernel.host_error)
        if not left:
            with contextlib.suppress(FileNotFoundError):
                self._state_path.unlink()
        log.info(
            "released %d pods from the mesh for uninstall%s",
            sum(1 for s in self.pods.values() if s.ref not in left),
            f"; {len(left)} left captured: {', '.join(left)} (restart them)" if left else "",
        )
        return left

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
        self._check_visible(state)
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
            try:
                await self._unenroll(state, reason="sandbox deleted")
            except EnrollmentError as exc:
                # The plugin removes the rules itself when the agent did not say "released".
                log.warning("%s", exc)
                state.captured = state.served = False
                self.kernel.sync_host()
                reported = False
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
                self._failed(state, str(exc), retry=exc.retry, reason=exc.reason)
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
                raise self._vanished(state, exc) from exc
        if not state.captured:
            args = ambient.capture_args(
                state.pod or {}, dns=self._dns(state), ipv6=self.settings.ipv6
            )
            try:
                await self.kernel.apply_pod(state.netns, args)
            except KernelError as exc:
                raise EnrollmentError(f"pod {state.ref}: {exc}", retry=True) from exc
            state.ips = state.ips or tuple(ambient.pod_ips(state.pod or {}))
            state.captured = True
            self.kernel.sync_host()
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
        """Rules first, then the proxy: while the proxy still serves the pod its new connections
        stop being redirected and the open ones finish; the other order leaves the pod
        redirected to ports nobody listens on. A removal that fails keeps the pod served (and
        is retried), so it is never left black-holed."""
        # An earlier agent may have captured a pod this one has only seen annotated.
        leftover = state.captured or state.annotated in (
            ambient.REDIRECTION_ENABLED,
            ambient.REDIRECTION_PENDING,
        )
        if leftover and state.netns and Path(state.netns).exists():
            try:
                await self.kernel.clean_pod(state.netns)
            except KernelError as exc:
                raise EnrollmentError(
                    f"pod {state.ref}: its capture rules could not be removed ({reason}): {exc}; "
                    "the node proxy keeps serving it meanwhile",
                    retry=True,
                    reason=REMOVAL_FAILED,
                ) from exc
        elif leftover and not state.captured and not state.netns and state.pod is not None:
            raise EnrollmentError(
                f"pod {state.ref} is annotated {ambient.REDIRECTION}={state.annotated} but its "
                "network namespace is unknown to this node agent, so its capture rules (if any) "
                "cannot be removed; restart the pod",
                retry=False,
                reason=REMOVAL_FAILED,
            )
        was_captured = state.captured
        if state.captured:
            state.captured = False
            self.kernel.sync_host()
        if state.served or was_captured:
            await self.zds.delete(state.uid)
            state.served = False
        self._close_fd(state)
        if state.annotated and state.pod is not None:
            await self._annotate(state, None)
        state.annotated = None
        if leftover:
            log.info("pod %s (%s) removed from the mesh: %s", state.ref, state.uid, reason)

    def _failed(
        self, state: PodState, message: str, *, retry: bool, reason: str = ENROLL_FAILED
    ) -> None:
        log.error("%s", message)  # one line: which pod, what failed, what to do
        if message != state.reported:  # one event per distinct failure, not one per retry
            state.reported = message
            self._spawn(self._event(state, reason, message))
        if not retry or (state.pod is None and not state.captured):
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

    def _captured_ips(self) -> frozenset[str]:
        return frozenset(ip for s in self.pods.values() if s.captured for ip in s.ips)

    async def host_synced(self) -> None:
        """Wait until the node's probe rules match the captured pods (tests, shutdown)."""
        await self.kernel.host_synced()

    def _check_visible(self, state: PodState) -> None:
        """Remember (and say once) where the runtime pins netns this agent cannot see: any
        pod's sandbox shows it, long before an enrolled pod fails on it."""
        where = str(Path(state.netns).parent)
        mounted = self.settings.netns_dir
        if not mounted or where in self.netns_unseen or _within(state.netns, mounted):
            return
        if Path(state.netns).exists():
            return  # visible all the same (the runtime's path is inside another mount)
        self.netns_unseen[where] = state.ref
        log.error(
            "pod %s: its network namespace %s is not visible to the node agent (it mounts %s); "
            "ambient pods on this node cannot be enrolled: reinstall with "
            "--set components.cni.netnsDir=%s",
            state.ref,
            state.netns,
            mounted,
            where,
        )

    def _vanished(self, state: PodState, exc: OSError) -> EnrollmentError:
        """Why ``state``'s netns cannot be opened, with the fix when it lies outside the
        directory this agent mounts (the runtime pins netns elsewhere)."""
        where = str(Path(state.netns).parent)
        mounted = self.settings.netns_dir
        if exc.errno == errno.ENOENT and mounted and not _within(state.netns, mounted):
            self.netns_unseen.setdefault(where, state.ref)
            return EnrollmentError(
                f"pod {state.ref}: its network namespace {state.netns} is not visible to the node "
                f"agent: the container runtime pins pod netns in {where}, but the agent mounts "
                f"{mounted}; reinstall with --set components.cni.netnsDir={where}",
                retry=False,
            )
        return EnrollmentError(
            f"pod {state.ref}: network namespace {state.netns} vanished: {exc.strerror or exc}",
            retry=False,
        )

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

    # -- health (what verify reads) -----------------------------------------------------------

    async def health(self, *, dry_run: bool = False) -> dict[str, Any]:
        """Whether a pod can be enrolled on this node now, and what stands in the way: the
        netns directory, netns the runtime pins where this agent cannot see them, a node
        proxy on ZDS, the node's rules, pods failing; ``dry_run``: each captured pod's rules
        compared with what an enrollment would write (or, with none, an enrollment into a
        fresh namespace of the agent's own), nothing written."""
        problems: list[str] = []
        mounted = self.settings.netns_dir
        readable: bool | None = None
        if mounted:
            try:
                next(Path(mounted).iterdir(), None)
                readable = True
            except OSError as exc:
                readable = False
                problems.append(f"cannot read the netns directory {mounted}: {exc.strerror}")
        for where, pod in sorted(self.netns_unseen.items()):
            problems.append(
                f"the runtime pins pod netns in {where} (pod {pod}), which the node agent "
                f"does not mount ({mounted}): set components.cni.netnsDir={where}"
            )
        if not self.zds.connected:
            problems.append(f"no node proxy is connected on {self.settings.zds_socket}")
        if self.kernel.host_error:
            problems.append(f"the node's probe rules are not in place: {self.kernel.host_error}")
        failing = sorted(f"{s.ref}: {s.reported}" for s in self.pods.values() if s.reported)
        report: dict[str, Any] = {
            "netnsDir": mounted,
            "netnsDirReadable": readable,
            "netnsUnseen": dict(sorted(self.netns_unseen.items())),
            "nodeProxies": self.zds.connected,
            "failing": failing,
        }
        if dry_run:
            report["dryRun"] = await self._dry_run(problems)
        report["problems"] = problems
        return report

    async def _dry_run(self, problems: list[str], limit: int = 50) -> dict[str, Any]:
        captured = [s for s in self.pods.values() if s.captured and s.netns][:limit]
        drifted: list[str] = []
        try:
            for state in captured:
                args = ambient.capture_args(state.pod or {}, ipv6=self.settings.ipv6)
                if await self.kernel.dry_run_pod(state.netns, args):
                    drifted.append(state.ref)
            if not captured:
                await self.kernel.dry_run_pod(None, ambient.capture_args({}))
        except KernelError as exc:
            problems.append(f"a dry-run enrollment failed: {exc}")
            return {"ok": False, "error": str(exc)}
        if drifted:
            problems.append(
                f"{len(drifted)} captured pod(s) lack their capture rules: {', '.join(drifted)}"
            )
        return {"ok": not drifted, "pods": len(captured), "drifted": drifted}

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


def _within(path: str, directory: str) -> bool:
    return Path(path).is_relative_to(directory) or Path(path).is_relative_to(
        Path(directory).resolve()
    )


def _running(pod: dict[str, Any] | None) -> bool:
    return bool(pod) and ((pod or {}).get("status") or {}).get("phase") == "Running"
