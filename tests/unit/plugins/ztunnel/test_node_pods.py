"""The node proxy's pod handling in-process: its real ZDS client and pod registry against the
node agent's real reconciler and ZDS server (over a unix socket), with stand-ins only for the
kernel on both sides (a pod's netns is a plain file; its listeners are unbound sockets).

What the workers are told (``PodAdd`` with the descriptors, ``PodDelete``, ``PodsSynced``) is
recorded; the same paths run with real namespaces in tests/netns/test_ambient_proxy.py.
"""

from __future__ import annotations

import asyncio
import os
import socket
import tempfile
from collections import Counter
from collections.abc import Awaitable, Callable, Iterator, Mapping
from pathlib import Path

import pytest
from meshctl_plugins.ztunnel.node import Pods, ZdsClient

from meshctl.core.k8s import ambient
from meshctl.core.wire import channel
from tests.unit.plugins.cni.agent_rig import Rig, eventually, namespace, pod_object, running

PORTS = {"inbound": 15008, "inbound_plain": 15006, "outbound": 15001}


class StandInNetns:
    """A "netns" is any file but one whose name ends in ``.bad`` (then: not a namespace)."""

    def is_netns(self, fd: int) -> bool:
        return not str(Path(f"/proc/self/fd/{fd}").readlink()).endswith(".bad")

    def netns_id(self, fd: int) -> tuple[int, int]:
        st = os.fstat(fd)
        return (st.st_dev, st.st_ino)

    def listeners(
        self, fd: int, ports: Mapping[str, int], *, mark: int
    ) -> dict[str, socket.socket]:
        return {role: socket.socket() for role in ports}

    def close(self) -> None:
        return None


class StandInIdentities:
    def __init__(self) -> None:
        self.held: Counter[str] = Counter()

    def acquire(self, identity: object) -> None:
        self.held[str(identity)] += 1

    def release(self, identity: object) -> None:
        self.held[str(identity)] -= 1


class NodeProxy:
    """The node proxy's pod side: ``Pods`` fed by ``ZdsClient``; what its workers were told."""

    def __init__(self, socket_path: str) -> None:
        self.identities = StandInIdentities()
        self.pods = Pods(
            ports=PORTS,
            mark=0x539,
            trust_domain="cluster.local",
            identities=self.identities,  # type: ignore[arg-type]
            netns=StandInNetns(),
        )
        self.told: list[channel.Message] = []
        self.pods.send = lambda message, fds: self.told.append(message)
        self.client = ZdsClient(socket_path, self.pods)
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> NodeProxy:
        self.connect()
        await eventually(lambda: self.pods.synced)
        return self

    async def __aexit__(self, *exc: object) -> None:
        assert self._task is not None
        self._task.cancel()
        self.pods.close()

    def connect(self) -> None:
        self._task = asyncio.ensure_future(self.client.run())

    def kinds(self) -> list[str]:
        return [type(m).__name__ for m in self.told]


@pytest.fixture
def zds_socket() -> Iterator[str]:
    # A short path: unix socket paths end at 108 bytes, and pytest's tmp_path is long.
    with tempfile.TemporaryDirectory(prefix="zds-") as where:
        yield str(Path(where) / "ztunnel.sock")


def agent(tmp_path: Path, zds_socket: str, scenario: Callable[[Rig], Awaitable[None]]) -> None:
    async def main() -> None:
        async with running(tmp_path, zds_socket=zds_socket) as rig:
            await scenario(rig)

    asyncio.run(main())


def test_a_pod_the_agent_hands_over_is_served_and_its_workers_told(
    tmp_path: Path, zds_socket: str
) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        async with NodeProxy(zds_socket) as proxy:
            netns = rig.sandbox("web")
            answer = await rig.cni_add(pod_object("web"), netns, enroll=True)
            assert answer == (200, "pod shop/web captured and served")
            served = proxy.pods.pods["uid-web"]
            assert served.netns_id[1] == Path(netns).stat().st_ino
            assert sorted(served.listeners) == sorted(PORTS)
            add = next(m for m in proxy.told if isinstance(m, channel.PodAdd))
            assert (add.uid, add.namespace, add.name, add.service_account) == (
                "uid-web",
                "shop",
                "web",
                "sa",
            )
            assert proxy.identities.held["spiffe://cluster.local/ns/shop/sa/sa"] == 1

            rig.cluster.put_pod(pod_object("web"))
            rig.cluster.delete_pod("shop/web")
            await eventually(lambda: "uid-web" not in proxy.pods.pods)
            assert proxy.kinds()[-1] == "PodDelete"
            assert proxy.identities.held["spiffe://cluster.local/ns/shop/sa/sa"] == 0

    agent(tmp_path, zds_socket, scenario)


def test_a_new_sandbox_replaces_the_pods_proxy_and_a_bad_netns_is_refused(
    tmp_path: Path, zds_socket: str
) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        async with NodeProxy(zds_socket) as proxy:
            await rig.cni_add(pod_object("web"), rig.sandbox("web"), enroll=True)
            new = rig.sandbox("web-again")
            assert (await rig.cni_add(pod_object("web"), new, enroll=True))[0] == 200
            assert proxy.pods.pods["uid-web"].netns_id[1] == Path(new).stat().st_ino
            assert proxy.kinds()[-2:] == ["PodDelete", "PodAdd"]

            status, message = await rig.cni_add(
                pod_object("db", ip="10.1.0.6"), rig.sandbox("db.bad"), enroll=True
            )
            assert status == 500
            assert "the descriptor is not a network namespace" in message
            assert rig.annotation("shop/db") == ambient.REDIRECTION_PENDING
            assert "uid-db" not in proxy.pods.pods
            assert "uid-web" in proxy.pods.pods  # no other pod touched

    agent(tmp_path, zds_socket, scenario)


def test_a_restarted_proxy_gets_every_pod_back(tmp_path: Path, zds_socket: str) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        async with NodeProxy(zds_socket):
            await rig.cni_add(pod_object("web"), rig.sandbox("web"), enroll=True)
        async with NodeProxy(zds_socket) as restarted:  # the snapshot: the pod with its netns
            assert list(restarted.pods.pods) == ["uid-web"]
            assert restarted.kinds() == ["PodAdd", "PodsSynced"]
            assert restarted.pods.pods["uid-web"].netns_id[1] == rig.netns_inode("web")

    agent(tmp_path, zds_socket, scenario)


def test_an_agent_restart_changes_nothing_for_the_pods_the_proxy_serves(
    tmp_path: Path, zds_socket: str
) -> None:
    async def scenario() -> None:
        async with running(tmp_path, zds_socket=zds_socket) as first:
            await first.sync(namespace("shop"))
            proxy = NodeProxy(zds_socket)
            await proxy.__aenter__()
            await first.cni_add(pod_object("web"), first.sandbox("web"), enroll=True)
        told = len(proxy.told)
        assert list(proxy.pods.pods) == ["uid-web"]  # the agent went; the pod stays served
        async with running(tmp_path, zds_socket=zds_socket) as second:
            second.cluster.put_pod(pod_object("web"))
            await asyncio.sleep(0.3)
            assert not proxy.pods.synced  # no snapshot before the agent's view is whole
            await second.sync(namespace("shop"))
            await eventually(lambda: proxy.pods.synced)
            assert list(proxy.pods.pods) == ["uid-web"]
            again = proxy.told[told:]
            assert {type(m).__name__ for m in again} == {"PodsSynced"}  # no delete, no re-add
            await proxy.__aexit__()

    asyncio.run(scenario())
