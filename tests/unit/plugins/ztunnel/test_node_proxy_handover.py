"""What lets two node proxies hold a node's pods at once (the rollout's handover, docs/ztunnel.md):
the DaemonSet surges only for the node proxy, its pod holds nothing node-exclusive, its drain
fits the grace period, and the pod listeners share their ports (SO_REUSEPORT); the pod's
``tcp_migrate_req`` is set where the kernel has it, and its absence is logged once.
"""

from __future__ import annotations

import errno
import logging
import os
import socket
from pathlib import Path
from typing import Any

import pytest
from meshctl_plugins.cni.manifest import CniValues
from meshctl_plugins.cni.manifest import objects as cni_objects
from meshctl_plugins.ztunnel.manifest import DRAIN_SECONDS, GRACE_SECONDS, NodeProxyValues
from meshctl_plugins.ztunnel.manifest import objects as ztunnel_objects

from meshctl.core.k8s.install.components import standalone
from meshctl.core.k8s.podspec import node_daemonset
from meshctl.net import inpod
from meshctl.net.sysctls import NetSysctls


def daemonset(objects: list[Any]) -> dict[str, Any]:
    return next(o for o in objects if o["kind"] == "DaemonSet")


def node_proxy() -> dict[str, Any]:
    return daemonset(ztunnel_objects(standalone("meshctl-system", None), NodeProxyValues()))


def test_the_node_proxy_surges_and_the_old_one_goes_only_when_the_new_one_is_ready() -> None:
    strategy = node_proxy()["spec"]["updateStrategy"]
    assert strategy == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }


def test_the_cni_agent_keeps_replacing_its_pod_in_place() -> None:
    # Host paths (and hostNetwork in ambient mode): two agents on one node would fight over them.
    agent = daemonset(cni_objects(standalone("meshctl-system", None), CniValues()))
    assert any("hostPath" in v for v in agent["spec"]["template"]["spec"]["volumes"])
    assert agent["spec"]["updateStrategy"]["rollingUpdate"] == {"maxUnavailable": 1}


def test_a_host_network_component_cannot_surge() -> None:
    with pytest.raises(ValueError, match="hostNetwork"):
        node_daemonset(
            meta={"name": "x"},
            labels={"app.kubernetes.io/name": "x"},
            container={"name": "x"},
            volumes=[],
            grace_seconds=30,
            host_network=True,
            surge=True,
        )


def test_the_node_proxy_pod_holds_nothing_node_exclusive() -> None:
    pod = node_proxy()["spec"]["template"]["spec"]
    assert not pod.get("hostNetwork")
    (container,) = pod["containers"]
    assert all("hostPort" not in p for p in container["ports"])
    host_paths = [v["hostPath"]["path"] for v in pod["volumes"] if "hostPath" in v]
    assert host_paths == ["/var/run/ztunnel"]  # the agent's socket: the proxy only connects


def test_the_node_proxy_drains_within_its_grace_period() -> None:
    pod = node_proxy()["spec"]["template"]["spec"]
    env = {e["name"]: e.get("value") for e in pod["containers"][0]["env"]}
    assert env["CONNECTION_TERMINATION_DEADLINE"] == f"{DRAIN_SECONDS}s"
    assert pod["terminationGracePeriodSeconds"] == GRACE_SECONDS
    # The supervisor kills what is left 2 s after the drain deadline: still inside the grace.
    assert DRAIN_SECONDS + 2 < GRACE_SECONDS


def test_pod_listeners_share_their_port_with_the_next_node_proxy() -> None:
    first = inpod._listen(socket.AF_INET, "127.0.0.1", 0, "inbound", 0)
    port = first.getsockname()[1]
    try:
        assert first.getsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT) == 1
        second = inpod._listen(socket.AF_INET, "127.0.0.1", port, "inbound", 0)
        second.close()
    finally:
        first.close()


def test_a_kernel_without_the_sysctl_is_reported_not_raised(tmp_path: Path) -> None:
    sysctls = NetSysctls()
    sysctls._root = tmp_path  # an empty /proc/sys: no such sysctl
    assert sysctls.set("net.ipv4.tcp_migrate_req", "1") is False
    (tmp_path / "net" / "ipv4").mkdir(parents=True)
    (tmp_path / "net" / "ipv4" / "tcp_migrate_req").write_text("0")
    assert sysctls.set("net.ipv4.tcp_migrate_req", "1") is True
    assert (tmp_path / "net" / "ipv4" / "tcp_migrate_req").read_text() == "1"
    with pytest.raises(ValueError, match="not a network sysctl"):
        sysctls.set("kernel.panic", "1")


class NoMigrate:
    def __init__(self, outcome: bool | OSError) -> None:
        self.outcome = outcome
        self.calls = 0

    def set(self, name: str, value: str) -> bool:
        self.calls += 1
        if isinstance(self.outcome, OSError):
            from meshctl.errors import NetError

            raise NetError(f"cannot set {name}: {self.outcome.strerror}")
        return self.outcome

    def close(self) -> None:
        return None


@pytest.mark.parametrize(
    ("outcome", "said"),
    [(False, "Linux >= 5.14"), (OSError(errno.EROFS, "Read-only file system"), "Read-only")],
)
def test_without_request_migration_pods_are_served_and_it_is_logged_once(
    outcome: bool | OSError, said: str, caplog: pytest.LogCaptureFixture
) -> None:
    proxy = inpod.InPod()
    stand_in = NoMigrate(outcome)
    proxy._sysctls = stand_in  # type: ignore[assignment]
    try:
        with caplog.at_level(logging.WARNING, logger="meshctl.net.inpod"):
            for _ in range(3):
                proxy._migrate_requests()  # one per pod: never raises
    finally:
        proxy.close()
    assert stand_in.calls == 3
    warnings = [r.getMessage() for r in caplog.records if r.name == "meshctl.net.inpod"]
    assert len(warnings) == 1, warnings
    assert said in warnings[0]


def test_on_the_drain_the_pods_listeners_close_first_and_adds_are_refused(tmp_path: Path) -> None:
    from meshctl_plugins.ztunnel.node import Pods

    from meshctl.core.wire import zds
    from tests.unit.plugins.ztunnel.test_node_pods import (
        PORTS,
        StandInIdentities,
        StandInNetns,
    )

    pods = Pods(
        ports=PORTS,
        mark=0x539,
        trust_domain="cluster.local",
        identities=StandInIdentities(),  # type: ignore[arg-type]
        netns=StandInNetns(),
    )

    def netns(name: str) -> int:
        (tmp_path / name).touch()
        return os.open(tmp_path / name, os.O_RDONLY)

    info = zds.WorkloadInfo("web", "shop", "default")
    assert pods.add(zds.Add("uid-1", info), netns("one")).ok
    served = pods.pods["uid-1"]
    pods.stop_listening()
    assert all(sock.fileno() == -1 for sock in served.listeners.values())
    assert os.fstat(served.netns_fd)  # the pod itself is kept: its connections drain
    refused = pods.add(zds.Add("uid-2", info), netns("two"))
    assert "shutting down" in (refused.error or "")
    assert list(pods.pods) == ["uid-1"]
    pods.close()
