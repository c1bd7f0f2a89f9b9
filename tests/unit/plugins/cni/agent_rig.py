"""The ambient agent in-process: the real reconciler, work queue and state file, with stand-ins
only at its protocol seams (``Kernel``, ``NodeProxies``, ``PodSource``, ``PodApi``).

No root, no API server: a pod's netns is a plain file (the agent opens it and hands the
descriptor over, as it would a netns), the kernel records the rules each netns holds, the node
proxy records whom it serves, the API server holds the pods (the agent's annotation comes
back through the watch, as it does from the real one) and the Warning events.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshctl_plugins.cni.ambient import AgentSettings, AmbientAgent
from meshctl_plugins.cni.kernelsteps import KernelError
from meshctl_plugins.cni.podstate import PodState
from meshctl_plugins.cni.zdsserver import OnSnapshot, ProxyUnavailableError, Snapshot

from meshctl.core.backoff import Backoff
from meshctl.core.capture.settings import CaptureSettings
from meshctl.core.k8s import ambient
from meshctl.core.wire import zds
from meshctl.kube.resources import NAMESPACES, PODS, Resource
from meshctl.kube.watch import WatchEvent

NODE = "node-a"


class StandInKernel:
    """Each netns's rules (the capture settings last applied) and the node's."""

    def __init__(self) -> None:
        self.host_error = ""
        self.rules: dict[str, CaptureSettings] = {}
        self.host_ips: frozenset[str] = frozenset()
        self.fail_apply: dict[str, str] = {}  # netns -> the error applying its rules raises
        self.fail_clean: dict[str, str] = {}
        self.applied: list[tuple[str, float]] = []  # (netns, when) of every attempt
        self.closed = False

    async def apply_pod(self, netns: str, capture: CaptureSettings) -> None:
        self.applied.append((netns, time.monotonic()))
        if netns in self.fail_apply:
            raise KernelError(self.fail_apply[netns])
        self.rules[netns] = capture

    async def clean_pod(self, netns: str) -> None:
        if netns in self.fail_clean:
            raise KernelError(self.fail_clean[netns])
        self.rules.pop(netns, None)

    async def dry_run_pod(self, netns: str | None, capture: CaptureSettings) -> str:
        return "" if netns is None or self.rules.get(netns) == capture else "*nat\n"

    def sync_host(self, ips: frozenset[str]) -> None:
        self.host_ips = ips

    async def host_synced(self, timeout: float | None = None) -> bool:
        return True

    def close(self) -> None:
        self.closed = True


class StandInProxy:
    """A node proxy as ZDS shows it to the agent: a snapshot on connect, then adds and dels."""

    def __init__(self) -> None:
        self.changed = asyncio.Event()
        self.serving: dict[str, tuple[zds.WorkloadInfo, int]] = {}  # uid -> (who, netns inode)
        self.adds: list[str] = []
        self.deleted: list[str] = []
        self.refuse: dict[str, str] = {}  # uid -> why this proxy refuses it
        self.hold: asyncio.Event | None = None  # adds wait for it (a slow proxy)
        self.holding = asyncio.Event()  # an add is waiting on ``hold``
        self._connected = 0
        self._snapshot: Snapshot = list
        self._on_snapshot: OnSnapshot = lambda uid, ack: None
        self._ready = asyncio.Event()

    @property
    def connected(self) -> int:
        return self._connected

    def start(self, *, snapshot: Snapshot, on_snapshot: OnSnapshot, ready: asyncio.Event) -> None:
        self._snapshot, self._on_snapshot, self._ready = snapshot, on_snapshot, ready

    async def close(self) -> None:
        self._connected = 0

    async def add(self, uid: str, info: zds.WorkloadInfo, fd: int) -> None:
        if not self._connected:
            raise ProxyUnavailableError("no node proxy connected on /run/ztunnel.sock")
        inode = os.fstat(fd).st_ino  # a live descriptor, as SCM_RIGHTS would carry
        self.adds.append(uid)
        if self.hold is not None:
            self.holding.set()
            await self.hold.wait()
        if uid in self.refuse:
            raise ProxyUnavailableError(f"node proxy refused the pod: {self.refuse[uid]}")
        self.serving[uid] = (info, inode)

    async def delete(self, uid: str) -> None:
        self.deleted.append(uid)
        self.serving.pop(uid, None)

    async def connect(self) -> None:
        """A proxy connects: once the agent's view is whole it gets the snapshot (as ZDS)."""
        await self._ready.wait()
        for entry in self._snapshot():
            error = self.refuse.get(entry.uid, "")
            if not error and entry.fd is not None:
                self.serving[entry.uid] = (entry.info, os.fstat(entry.fd).st_ino)
            self._on_snapshot(entry.uid, zds.Ack(error=error))
        self._connected = 1
        self.changed.set()

    def disconnect(self) -> None:
        self._connected = 0
        self.serving.clear()
        self.changed.set()


class StandInCluster:
    """The API server as the agent sees it: pods (a patched annotation comes back through the
    watch, as the real one's does), Warning events, and what it says on exit."""

    name = "test watches"

    def __init__(self, *, release: bool = False) -> None:
        self.pods: dict[str, dict[str, Any]] = {}  # "ns/name" -> the object
        self.annotations: dict[str, str | None] = {}  # what the agent wrote, by pod
        self.events: list[tuple[str, str, str]] = []  # (pod, reason, message)
        self.release = release
        self._events: asyncio.Queue[WatchEvent] = asyncio.Queue()

    # -- the source: watches --------------------------------------------------------------

    def send(self, kind: Resource, type_: str, obj: dict[str, Any]) -> None:
        self._events.put_nowait(WatchEvent(type_, obj, kind))  # type: ignore[arg-type]

    def put_pod(self, pod: dict[str, Any]) -> None:
        """Create or change a pod (its annotations are the server's, as the agent wrote them)."""
        meta = pod["metadata"]
        ref = f"{meta['namespace']}/{meta['name']}"
        new = ref not in self.pods
        held = ((self.pods.get(ref) or {}).get("metadata") or {}).get("annotations") or {}
        pod = {**pod, "metadata": {**meta, "annotations": dict(held)}}
        self.pods[ref] = pod
        self.send(PODS, "ADDED" if new else "MODIFIED", pod)

    def delete_pod(self, ref: str) -> None:
        self.send(PODS, "DELETED", self.pods.pop(ref))

    @contextlib.asynccontextmanager
    async def subscribe(self) -> AsyncIterator[AsyncIterator[WatchEvent]]:
        async def events() -> AsyncIterator[WatchEvent]:
            while True:
                yield await self._events.get()

        yield events()

    # -- the API: writes ------------------------------------------------------------------

    async def annotate(self, pod: PodState, value: str | None) -> bool:
        self.annotations[pod.ref] = value
        current = self.pods.get(pod.ref)
        if current is not None:
            annotations = dict(current["metadata"].get("annotations") or {})
            annotations.pop(ambient.REDIRECTION, None)
            if value is not None:
                annotations[ambient.REDIRECTION] = value
            meta = {**current["metadata"], "annotations": annotations}
            self.pods[pod.ref] = {**current, "metadata": meta}
            self.send(PODS, "MODIFIED", self.pods[pod.ref])
        return True

    async def warn(self, pod: PodState, reason: str, message: str) -> None:
        self.events.append((pod.ref, reason, message))

    async def exit_plan(self, mode: str) -> ambient.ExitPlan:
        return ambient.ExitPlan(self.release, "the test says so")


def namespace(name: str, *, mode: str | None = ambient.MODE_AMBIENT) -> dict[str, Any]:
    labels = {ambient.DATAPLANE_MODE: mode} if mode else {}
    return {"metadata": {"name": name, "labels": labels}}


def pod_object(name: str, ns: str = "shop", *, ip: str = "10.1.0.5", **labels: str) -> dict:
    return {
        "metadata": {"name": name, "namespace": ns, "uid": f"uid-{name}", "labels": labels},
        "spec": {"nodeName": NODE, "serviceAccountName": "sa", "containers": [{"name": "app"}]},
        "status": {"phase": "Running", "podIP": ip, "podIPs": [{"ip": ip}]},
    }


@dataclass
class Rig:
    agent: AmbientAgent
    kernel: StandInKernel
    proxy: StandInProxy  # unused when the agent runs its real ZDS server (``zds_socket``)
    cluster: StandInCluster
    netns_dir: Path
    stop: asyncio.Event = field(default_factory=asyncio.Event)
    release: asyncio.Event = field(default_factory=asyncio.Event)

    def sandbox(self, name: str) -> str:
        """A pod's network namespace (a plain file here: only its descriptor travels)."""
        path = self.netns_dir / f"cni-{name}"
        path.touch()
        return str(path)

    async def sync(self, *namespaces: dict[str, Any]) -> None:
        """The watches' first view: these namespaces, no pods yet; the agent's view is whole."""
        for obj in namespaces:
            self.cluster.send(NAMESPACES, "ADDED", obj)
        self.cluster.send(NAMESPACES, "SYNCED", {})
        self.cluster.send(PODS, "SYNCED", {})
        await eventually(self.agent.synced.is_set)

    async def cni_add(self, pod: dict[str, Any], netns: str, *, enroll: bool) -> tuple[int, str]:
        meta = pod["metadata"]
        return await self.agent.cni_add(
            {
                "podUid": meta["uid"],
                "podName": meta["name"],
                "podNamespace": meta["namespace"],
                "netns": netns,
                "containerId": f"c-{meta['name']}",
                "ips": [pod["status"]["podIP"]],
                "enroll": enroll,
                "pod": pod,
            }
        )

    def netns_inode(self, name: str) -> int:
        return (self.netns_dir / f"cni-{name}").stat().st_ino

    def state(self, name: str) -> PodState | None:
        return self.agent.pods.get(f"uid-{name}")

    def events(self, reason: str) -> list[str]:
        return [message for _, why, message in self.cluster.events if why == reason]

    def annotation(self, ref: str) -> str | None:
        return self.cluster.annotations.get(ref)


async def eventually(condition: Callable[[], object], timeout: float = 3.0) -> None:
    async with asyncio.timeout(timeout):
        while not condition():
            await asyncio.sleep(0.005)


FAST_RETRY = Backoff(first=0.05, cap=0.2)


@contextlib.asynccontextmanager
async def running(
    tmp_path: Path,
    *,
    retry: Backoff = FAST_RETRY,
    cluster: StandInCluster | None = None,
    zds_socket: str = "",
) -> AsyncIterator[Rig]:
    """The agent, serving until the block ends (releasing its pods if the block asked);
    ``zds_socket``: serve real node proxies there (its ZDS server) instead of the stand-in."""
    run_dir, netns_dir = tmp_path / "run", tmp_path / "netns"
    run_dir.mkdir(exist_ok=True)
    netns_dir.mkdir(exist_ok=True)
    settings = AgentSettings(
        node_name=NODE,
        run_dir=str(run_dir),
        zds_socket=zds_socket or "/run/ztunnel.sock",
        exclude_namespaces=("kube-system",),
        netns_dir=str(netns_dir),
    )
    kernel, proxy = StandInKernel(), StandInProxy()
    cluster = cluster or StandInCluster()
    proxies = None if zds_socket else proxy
    agent = AmbientAgent(settings, cluster, cluster, kernel=kernel, proxies=proxies, retry=retry)
    rig = Rig(agent, kernel, proxy, cluster, netns_dir)
    serving = asyncio.ensure_future(agent.run(rig.stop, release=rig.release))
    try:
        yield rig
    finally:
        rig.stop.set()
        await asyncio.wait_for(serving, 5)


def run(
    tmp_path: Path,
    scenario: Callable[[Rig], Awaitable[None]],
    *,
    retry: Backoff = FAST_RETRY,
    cluster: StandInCluster | None = None,
) -> Rig:
    """``running`` around ``scenario``, on a loop of its own; the rig, for a look afterwards."""

    async def main() -> Rig:
        async with running(tmp_path, retry=retry, cluster=cluster) as rig:
            await scenario(rig)
        return rig

    return asyncio.run(main())
