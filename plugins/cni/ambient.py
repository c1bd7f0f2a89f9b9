"""The node agent of ambient mode: enrolls this node's pods and hands them to the node proxy.

Owns, for every pod on the node, the path from "should be in the mesh" (``meshctl.core.k8s.ambient``
over the pod and its namespace, from the API's informers or a local inventory file, and CNI
events) to "is": the in-pod rules applied in the pod's netns from outside (the pod never has
NET_ADMIN), the node's probe SNAT for its IPs, the netns descriptor handed to the node proxy over
ZDS and acknowledged, the pod annotated ``ambient.istio.io/redirection: enabled`` (or ``pending``
with a Warning event saying why); and back again when a label changes, the pod goes or its
sandbox is torn down. A level-triggered reconciler (kopf's / controller-runtime's style): every
trigger queues the pod on the shared work queue (``meshctl.kube.workqueue``), which re-reads the
desired state and converges, idempotently; failures are retried on the queue's backoff (0.5 s
doubling to 30 s, and at once when a node proxy connects).
Invariants: kernel changes run one at a time on one thread (libiptc and setns are per thread);
a pod's own steps are serialised; what is removed is exactly what was added (rules, SNAT entry,
proxy entry, annotation); one Warning event per distinct failure, not one per retry; the netns
paths the plugin reported survive an agent restart (``podstate.StateFile``), so pods already
running are enrolled again from the watch. The kernel, the node proxies, the pods' source and
the API's writes are protocols (``Kernel``, ``NodeProxies``, ``PodSource``, ``PodApi``), so
the same reconciler runs without an API server (``--local-inventory``: the annotation and the
events then live only here, ``enrollment()`` and the log) and in tests against stand-ins.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, cast

from meshctl.core.backoff import Backoff
from meshctl.core.k8s import ambient
from meshctl.core.k8s.cni.spec import AGENT_RELEASED
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.core.wire import zds
from meshctl.kube.resources import NAMESPACES, PODS
from meshctl.kube.workqueue import RETRY_BACKOFF, GiveUp, Retry, WorkQueue
from meshctl.tasks import Tasks

from .apiserver import PodApi, PodEvent, PodSource
from .health import EnrollmentRecord, HealthReport, health_report
from .kernelsteps import Kernel, KernelError, KernelSteps
from .netnsdir import NetnsDir
from .podstate import (
    ENROLL_FAILED,
    REMOVAL_FAILED,
    STATE_FILE,
    EnrollmentError,
    PodState,
    StateFile,
)
from .zdsserver import NodeProxies, ProxyUnavailableError, SnapshotEntry, ZdsServer

if TYPE_CHECKING:
    from meshctl.core.k8s.cni.messages import PluginEvent
    from meshctl.core.k8s.schema import Namespace, Pod

log = logging.getLogger(__name__)

# Reconciles at once: each mostly waits (on the kernel's one thread, a proxy's ack, the API).
WORKERS = 16


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
    # On exit: release the pods ("always"), keep them ("never"), or "auto": ask the API
    # server whether this agent's DaemonSet is going (``PodApi.exit_plan``).
    release_on_exit: str = "auto"


class AmbientAgent:
    """The enrollment controller; ``run`` serves until ``stop`` is set."""

    def __init__(
        self,
        settings: AgentSettings,
        source: PodSource,
        api: PodApi,
        *,
        kernel: Kernel | None = None,
        proxies: NodeProxies | None = None,
        retry: Backoff = RETRY_BACKOFF,
    ) -> None:
        """``source``: the pods and namespaces (informers, or the local inventory); ``api``:
        where annotations and events go; ``kernel``, ``proxies``: the real ones by default;
        ``retry``: a failed pod's backoff."""
        self.settings = settings
        self.source = source
        self.api = api
        self.pods: dict[str, PodState] = {}
        self.namespaces: dict[str, Namespace] = {}
        self.synced = asyncio.Event()
        self._synced_kinds: set[str] = set()
        self.kernel: Kernel = kernel or KernelSteps(
            pod_backend=settings.iptables_backend, host_backend=settings.host_backend
        )
        self.netns_dir = NetnsDir(settings.netns_dir)
        self._state_file = StateFile(Path(settings.run_dir) / STATE_FILE)
        self.zds: NodeProxies = proxies or ZdsServer(settings.zds_socket)
        self.queue: WorkQueue[str] = WorkQueue("pod", self._reconcile_uid, backoff=retry)
        self._tasks = Tasks(log, "ambient task")

    # -- life --------------------------------------------------------------------------------

    async def run(self, stop: asyncio.Event, *, release: asyncio.Event | None = None) -> None:
        """Serve until ``stop``; when ``release`` is set by then (the mesh is being uninstalled
        from this node), every pod is taken out of the mesh first, so it keeps working."""
        for state in self._state_file.load():
            self.pods[state.uid] = state
        self.zds.start(
            snapshot=self._snapshot, on_snapshot=self._snapshot_result, ready=self.synced
        )
        try:
            readers = [
                asyncio.ensure_future(self._on_proxy_changes()),
                asyncio.ensure_future(self._follow()),
                asyncio.ensure_future(self.queue.run(workers=WORKERS)),
            ]
            try:
                await stop.wait()
            finally:
                for task in readers:
                    task.cancel()
            if release is not None and release.is_set():
                await self.release_all()
            await asyncio.wait(readers, timeout=2.0)  # the informers' watches stop
        finally:
            self.queue.shut_down()
            self._tasks.cancel()
            await self.zds.close()
            for state in self.pods.values():
                self._close_fd(state)
            self.kernel.close()

    async def exit_plan(self) -> ambient.ExitPlan:
        """Whether stopping now is an uninstall (release every pod) or an upgrade (keep them),
        from this agent's DaemonSet as the API server has it now."""
        return await self.api.exit_plan(self.settings.release_on_exit)

    async def release_all(self) -> list[str]:
        """Take every pod out of the mesh (the agent is being uninstalled): rules, the node's
        SNAT, the proxy's entry and the annotation removed, the state file deleted; returns the
        pods that could not be released (logged, each with its error)."""
        self.queue.shut_down()
        self._tasks.cancel()
        left = []
        for state in list(self.pods.values()):
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
            self._state_file.remove()
        log.info(
            "released %d pods from the mesh for uninstall%s",
            sum(1 for s in self.pods.values() if s.ref not in left),
            f"; {len(left)} left captured: {', '.join(left)} (restart them)" if left else "",
        )
        return left

    async def _follow(self) -> None:
        async with self.source.subscribe() as events:
            async for event in events:
                self._on_event(event)

    def _on_event(self, event: PodEvent) -> None:
        try:
            self._apply_event(event)
        except Exception:  # one bad object must not stop the watch's consumer
            log.exception("%s event %s failed", _plural(event), event.type)

    def _apply_event(self, event: PodEvent) -> None:
        kind = _plural(event)
        if event.type == "SYNCED":
            self._synced_kinds.add(kind)
            if {PODS.plural, NAMESPACES.plural} <= self._synced_kinds and not self.synced.is_set():
                log.info(
                    "%s synced: %d pods on node %s",
                    self.source.name,
                    len(self.pods),
                    self.settings.node_name,
                )
                self._tasks.spawn(self._initial_sync())
            return
        obj = event.object
        meta = obj.get("metadata") or {}
        if kind == NAMESPACES.plural:
            name = str(meta.get("name", ""))
            if event.type == "DELETED":
                self.namespaces.pop(name, None)
            else:
                self.namespaces[name] = cast("Namespace", obj)  # the event's resource says so
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
            state.pod = cast("Pod", obj)  # not a Namespace: a Pod
            state.annotated = (meta.get("annotations") or {}).get(ambient.REDIRECTION)
        self.kick(state)

    async def _initial_sync(self) -> None:
        """Pods that should be enrolled are captured again (idempotently) before the first
        proxy gets its snapshot, so the snapshot names every one of them; those that failed
        are retried on the queue's backoff."""
        states = list(self.pods.values())
        outcomes = await asyncio.gather(
            *(self.reconcile(s, hand_over=False) for s in states), return_exceptions=True
        )
        self.synced.set()
        for state, outcome in zip(states, outcomes, strict=True):
            if isinstance(outcome, Retry):
                self.queue.retry(state.uid)
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
        """Reconcile ``state`` soon (the queue coalesces; a pending retry runs now instead)."""
        if self.synced.is_set():
            self.queue.add(state.uid)

    async def cni_add(self, event: PluginEvent) -> tuple[int, str]:
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
        self.netns_dir.check(state)
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
                self._report(state, str(exc))  # the runtime retries the ADD
                return 500, str(exc)
        return 200, f"pod {state.ref} captured and served"

    async def cni_del(self, event: PluginEvent) -> tuple[int, str]:
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
                self._sync_host()
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

    async def _reconcile_uid(self, uid: str) -> None:
        state = self.pods.get(uid)
        if state is not None:
            await self.reconcile(state)

    async def reconcile(self, state: PodState, *, hand_over: bool = True) -> None:
        """Converge ``state``; without ``hand_over`` (before the first proxy's snapshot, which
        will carry the pod) only the capture is restored. A failure is reported, then raised
        as the queue's ``Retry`` (or ``GiveUp`` when trying again cannot help)."""
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
                self._report(state, str(exc), reason=exc.reason)
                if exc.retry and (state.pod is not None or state.captured):
                    raise Retry from exc
                raise GiveUp from exc
            state.reported = ""
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
                raise self.netns_dir.vanished(state, exc) from exc
        if not state.captured:
            try:
                capture = ambient.capture_settings(
                    state.pod or {}, dns=self._dns(state), ipv6=self.settings.ipv6
                )
                await self.kernel.apply_pod(state.netns, capture)
            except InvalidAnnotationError as exc:
                raise EnrollmentError(
                    f"pod {state.ref}: {exc.message} ({exc.hint})", retry=True
                ) from exc
            except KernelError as exc:
                raise EnrollmentError(f"pod {state.ref}: {exc}", retry=True) from exc
            state.ips = state.ips or tuple(ambient.pod_ips(state.pod or {}))
            state.captured = True
            self._sync_host()
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
            self._tasks.spawn(self._annotate_quietly(state, ambient.REDIRECTION_ENABLED))
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
            self._sync_host()
        if state.served or was_captured:
            await self.zds.delete(state.uid)
            state.served = False
        self._close_fd(state)
        if state.annotated and state.pod is not None:
            await self._annotate(state, None)
        state.annotated = None
        if leftover:
            log.info("pod %s (%s) removed from the mesh: %s", state.ref, state.uid, reason)

    def _report(self, state: PodState, message: str, *, reason: str = ENROLL_FAILED) -> None:
        log.error("%s", message)  # one line: which pod, what failed, what to do
        if message != state.reported:  # one event per distinct failure, not one per retry
            state.reported = message
            self._tasks.spawn(self.api.warn(state, reason, message))

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

    def _sync_host(self) -> None:
        self.kernel.sync_host(
            frozenset(ip for s in self.pods.values() if s.captured for ip in s.ips)
        )

    async def host_synced(self) -> None:
        """Wait until the node's probe rules match the captured pods (tests, shutdown)."""
        await self.kernel.host_synced()

    # -- the API -----------------------------------------------------------------------------

    async def _annotate(self, state: PodState, value: str | None) -> None:
        if state.annotated == value or state.pod is None:
            return
        if await self.api.annotate(state, value):
            state.annotated = value

    async def _annotate_quietly(self, state: PodState, value: str) -> None:
        async with state.lock:
            if state.served:
                await self._annotate(state, value)

    # -- health (what verify reads) -----------------------------------------------------------

    async def health(self, *, dry_run: bool = False) -> HealthReport:
        """Whether a pod can be enrolled on this node now (``health.health_report``)."""
        return await health_report(
            self.pods.values(),
            netns_dir=self.settings.netns_dir,
            netns_unseen=self.netns_dir.unseen,
            proxies=self.zds.connected,
            zds_socket=self.settings.zds_socket,
            kernel=self.kernel,
            ipv6=self.settings.ipv6,
            dry_run=dry_run,
        )

    # -- bookkeeping -------------------------------------------------------------------------

    def enrollment(self) -> list[EnrollmentRecord]:
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

    def _by_name(self, event: PluginEvent) -> PodState | None:
        ns, name = event.get("podNamespace"), event.get("podName")
        return next((s for s in self.pods.values() if (s.namespace, s.name) == (ns, name)), None)

    def _forget_if_gone(self, state: PodState) -> None:
        if state.pod is None and state.netns and not Path(state.netns).exists():
            state.netns = ""  # its sandbox is gone too (no CNI DEL reached us)
            self._save_state()
        if state.pod is None and not state.captured and not state.served and not state.netns:
            self._close_fd(state)
            self.pods.pop(state.uid, None)
            self.queue.forget(state.uid)

    def _close_fd(self, state: PodState) -> None:
        if state.fd is not None:
            with contextlib.suppress(OSError):
                os.close(state.fd)
            state.fd = None

    def _save_state(self) -> None:
        self._state_file.save(self.pods.values())


def _plural(event: PodEvent) -> str:
    return event.resource.plural if event.resource is not None else ""


def _running(pod: Pod | None) -> bool:
    return bool(pod) and ((pod or {}).get("status") or {}).get("phase") == "Running"
