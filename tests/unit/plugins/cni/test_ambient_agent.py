"""The ambient node agent's reconciler in-process (tests/unit/plugins/cni/agent_rig.py): stand-ins
only for the kernel, the node proxy, the watches and the API's writes; seconds, no root.

The same behaviours run against the real kernel, API server and ZDS peers in tests/kube
(test_ambient*.py) and on the real node (tests/node/test_ambient_lifecycle_on_node.py).
"""

from __future__ import annotations

import asyncio
import itertools
import json
import time
from pathlib import Path

from meshctl_plugins.cni.podstate import ENROLL_FAILED, REMOVAL_FAILED, STATE_FILE

from meshctl.core.backoff import Backoff
from meshctl.core.k8s import ambient
from meshctl.core.k8s.cni.spec import AGENT_RELEASED
from meshctl.kube.resources import NAMESPACES
from meshctl.kube.workqueue import RETRY_BACKOFF
from tests.unit.plugins.cni.agent_rig import (
    Rig,
    StandInCluster,
    eventually,
    namespace,
    pod_object,
    run,
)

ENABLED, PENDING = ambient.REDIRECTION_ENABLED, ambient.REDIRECTION_PENDING


async def enrolled_by_cni(rig: Rig, name: str = "web", *, ip: str = "10.1.0.5") -> str:
    """A pod the plugin found enrolled: its ADD waits for capture and hand-over."""
    pod = pod_object(name, ip=ip)
    netns = rig.sandbox(name)
    assert await rig.cni_add(pod, netns, enroll=True) == (
        200,
        f"pod shop/{name} captured and served",
    )
    rig.cluster.put_pod(pod)
    await eventually(lambda: rig.annotation(f"shop/{name}") == ENABLED)
    return netns


def test_a_pod_is_captured_handed_over_with_its_netns_and_annotated(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        await rig.proxy.connect()
        netns = await enrolled_by_cni(rig)
        assert rig.kernel.rules[netns]  # the in-pod rules
        assert rig.kernel.host_ips == {"10.1.0.5"}  # the node's probe SNAT
        info, inode = rig.proxy.serving["uid-web"]
        assert (info.namespace, info.name, info.service_account) == ("shop", "web", "sa")
        assert inode == Path(netns).stat().st_ino
        assert rig.agent.enrollment()[0]["served"] is True

    run(tmp_path, scenario)


def test_a_new_sandbox_for_the_same_pod_is_captured_and_handed_over_again(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        await rig.proxy.connect()
        old = await enrolled_by_cni(rig)
        new = rig.sandbox("web-2")
        assert (await rig.cni_add(pod_object("web"), new, enroll=True))[0] == 200
        assert rig.kernel.rules[new]
        assert rig.proxy.serving["uid-web"][1] == Path(new).stat().st_ino
        assert rig.proxy.adds == ["uid-web", "uid-web"]
        # The old sandbox's teardown comes last: it is not the pod's any more.
        answer = await rig.agent.cni_del({"podUid": "uid-web", "netns": old})
        assert answer == (200, "an older sandbox of the pod; nothing to do")
        assert "uid-web" in rig.proxy.serving

    run(tmp_path, scenario)


def test_a_failed_enrollment_is_retried_at_half_a_second_doubling_with_one_event(
    tmp_path: Path,
) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        await rig.proxy.connect()
        netns = rig.sandbox("web")
        await rig.cni_add(pod_object("web"), netns, enroll=False)
        rig.kernel.fail_apply[netns] = "iptables-restore: Resource temporarily unavailable"
        rig.cluster.put_pod(pod_object("web"))
        await eventually(lambda: len(rig.kernel.applied) == 3)
        del rig.kernel.fail_apply[netns]
        await eventually(lambda: rig.annotation("shop/web") == ENABLED)
        times = [at for _, at in rig.kernel.applied]
        gaps = [b - a for a, b in itertools.pairwise(times)]
        assert 0.45 <= gaps[0] < 0.9
        assert 0.95 <= gaps[1] < 1.6  # doubled
        assert len(rig.events(ENROLL_FAILED)) == 1  # one per distinct failure, not per retry
        assert "Resource temporarily unavailable" in rig.events(ENROLL_FAILED)[0]
        assert rig.state("web").reported == ""  # a success clears it (/status, verify)

    run(tmp_path, scenario, retry=RETRY_BACKOFF)
    assert Backoff(first=0.5, cap=30.0) == RETRY_BACKOFF  # and on to 30 s


def test_a_different_failure_is_a_new_event(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        await rig.proxy.connect()
        netns = rig.sandbox("web")
        await rig.cni_add(pod_object("web"), netns, enroll=False)
        rig.kernel.fail_apply[netns] = "first reason"
        rig.cluster.put_pod(pod_object("web"))
        await eventually(lambda: len(rig.kernel.applied) >= 3)
        rig.kernel.fail_apply[netns] = "second reason"
        await eventually(lambda: len(rig.events(ENROLL_FAILED)) == 2)
        applied = len(rig.kernel.applied)
        await eventually(lambda: len(rig.kernel.applied) >= applied + 2)
        assert [m.rsplit(": ", 1)[-1] for m in rig.events(ENROLL_FAILED)] == [
            "first reason",
            "second reason",
        ]

    run(tmp_path, scenario)


def test_a_pod_waiting_for_a_proxy_is_pending_and_handed_over_as_soon_as_one_connects(
    tmp_path: Path,
) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        netns = rig.sandbox("web")
        await rig.cni_add(pod_object("web"), netns, enroll=False)
        rig.cluster.put_pod(pod_object("web"))
        await eventually(lambda: rig.annotation("shop/web") == PENDING)
        assert rig.kernel.rules[netns]  # captured meanwhile
        assert "no node proxy connected" in rig.events(ENROLL_FAILED)[0]
        started = time.monotonic()
        await rig.proxy.connect()  # the retry is 10 s away: the connect itself triggers it
        await eventually(lambda: rig.annotation("shop/web") == ENABLED)
        assert time.monotonic() - started < 2.0
        assert "uid-web" in rig.proxy.serving

    run(tmp_path, scenario, retry=Backoff(first=10.0, cap=10.0))


def test_a_pod_the_proxy_refuses_is_pending_retried_and_served_once_it_takes_it(
    tmp_path: Path,
) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        await rig.proxy.connect()
        rig.proxy.refuse["uid-web"] = "failure to start proxy : no room"
        netns = rig.sandbox("web")
        status, message = await rig.cni_add(pod_object("web"), netns, enroll=True)
        assert status == 500  # the runtime retries the ADD: the pod never starts uncaptured
        assert "no room" in message
        assert rig.cluster.annotations["shop/web"] == PENDING
        rig.cluster.put_pod(pod_object("web"))  # the watch's turn: retried
        await eventually(lambda: len(rig.proxy.adds) >= 3)
        assert len(rig.events(ENROLL_FAILED)) == 1
        del rig.proxy.refuse["uid-web"]
        await eventually(lambda: rig.annotation("shop/web") == ENABLED)

    run(tmp_path, scenario)


def test_a_pod_deleted_while_its_hand_over_waits_is_removed_again(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        await rig.proxy.connect()
        netns = rig.sandbox("web")
        await rig.cni_add(pod_object("web"), netns, enroll=False)
        rig.proxy.hold = asyncio.Event()
        rig.cluster.put_pod(pod_object("web"))
        await eventually(rig.proxy.holding.is_set)
        rig.cluster.delete_pod("shop/web")
        await asyncio.sleep(0.05)
        rig.proxy.hold.set()  # the proxy takes it after all
        await eventually(lambda: "uid-web" in rig.proxy.deleted)
        assert "uid-web" not in rig.proxy.serving
        assert netns not in rig.kernel.rules
        assert rig.kernel.host_ips == frozenset()
        assert rig.annotation("shop/web") is None  # never written for a gone pod
        assert await rig.agent.cni_del({"podUid": "uid-web", "netns": netns}) == (
            200,
            f"{AGENT_RELEASED}: pod shop/web",
        )
        assert rig.state("web") is None  # forgotten

    run(tmp_path, scenario)


def test_label_flips_remove_and_enroll_again_pod_and_namespace_alike(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        await rig.proxy.connect()
        netns = await enrolled_by_cni(rig)
        opted_out = pod_object("web", **{ambient.DATAPLANE_MODE: ambient.MODE_NONE})
        rig.cluster.put_pod(opted_out)
        await eventually(lambda: "uid-web" not in rig.proxy.serving)
        assert netns not in rig.kernel.rules
        await eventually(lambda: rig.cluster.annotations["shop/web"] is None)
        rig.cluster.put_pod(pod_object("web"))
        await eventually(lambda: rig.annotation("shop/web") == ENABLED)
        assert rig.kernel.rules[netns]
        rig.cluster.send(NAMESPACES, "MODIFIED", namespace("shop", mode=None))
        await eventually(lambda: "uid-web" not in rig.proxy.serving)
        assert rig.kernel.host_ips == frozenset()
        rig.cluster.send(NAMESPACES, "MODIFIED", namespace("shop"))
        await eventually(lambda: "uid-web" in rig.proxy.serving)

    run(tmp_path, scenario)


def test_a_removal_that_fails_keeps_the_pod_served_and_is_retried(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        await rig.proxy.connect()
        netns = await enrolled_by_cni(rig)
        rig.kernel.fail_clean[netns] = "setns: Operation not permitted"
        rig.cluster.put_pod(pod_object("web", **{ambient.DATAPLANE_MODE: "none"}))
        await eventually(lambda: rig.events(REMOVAL_FAILED))
        await asyncio.sleep(0.3)  # a few retries
        assert "uid-web" in rig.proxy.serving  # never left redirected to nobody
        assert rig.kernel.rules[netns]
        assert len(rig.events(REMOVAL_FAILED)) == 1
        del rig.kernel.fail_clean[netns]
        await eventually(lambda: rig.cluster.annotations["shop/web"] is None)
        assert "uid-web" not in rig.proxy.serving
        assert netns not in rig.kernel.rules

    run(tmp_path, scenario)


def test_a_vanished_netns_fails_once_with_an_event_and_is_not_retried(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        await rig.proxy.connect()
        netns = rig.sandbox("web")
        await rig.cni_add(pod_object("web"), netns, enroll=False)
        Path(netns).unlink()
        rig.cluster.put_pod(pod_object("web"))
        await eventually(lambda: rig.events(ENROLL_FAILED))
        await asyncio.sleep(0.3)
        assert "vanished" in rig.events(ENROLL_FAILED)[0]
        assert rig.kernel.applied == []
        assert rig.agent.queue.idle  # given up: retrying cannot help

    run(tmp_path, scenario)


def test_exit_for_uninstall_releases_every_pod_and_deletes_the_state_file(tmp_path: Path) -> None:
    async def scenario(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        await rig.proxy.connect()
        first = await enrolled_by_cni(rig, "web")
        second = await enrolled_by_cni(rig, "db", ip="10.1.0.6")
        assert (tmp_path / "run" / STATE_FILE).exists()
        plan = await rig.agent.exit_plan()
        assert plan.release
        rig.release.set()
        assert {first, second} <= set(rig.kernel.rules)

    rig = run(tmp_path, scenario, cluster=StandInCluster(release=True))
    assert rig.kernel.rules == {}
    assert rig.kernel.host_ips == frozenset()
    assert sorted(rig.proxy.deleted) == ["uid-db", "uid-web"]
    assert rig.cluster.annotations == {"shop/web": None, "shop/db": None}
    assert not (tmp_path / "run" / STATE_FILE).exists()
    assert rig.kernel.closed


def test_exit_for_an_upgrade_keeps_the_pods_and_a_new_agent_resumes_them(tmp_path: Path) -> None:
    async def first_agent(rig: Rig) -> None:
        await rig.sync(namespace("shop"))
        await rig.proxy.connect()
        await enrolled_by_cni(rig)

    rig = run(tmp_path, first_agent)
    netns = str(tmp_path / "netns" / "cni-web")
    assert rig.kernel.rules[netns]  # kept captured for the next agent
    saved = json.loads((tmp_path / "run" / STATE_FILE).read_text())
    assert saved["pods"]["uid-web"]["netns"] == netns

    async def next_agent(rig: Rig) -> None:
        rig.cluster.put_pod(pod_object("web", ip="10.1.0.5"))
        await rig.sync(namespace("shop"))
        assert rig.kernel.rules[netns]  # captured again before any proxy's snapshot
        await rig.proxy.connect()
        assert rig.proxy.serving["uid-web"][1] == Path(netns).stat().st_ino  # in the snapshot
        await eventually(lambda: rig.annotation("shop/web") == ENABLED)

    run(tmp_path, next_agent)
