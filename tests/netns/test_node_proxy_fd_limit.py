"""A node proxy started under a low soft descriptor limit still serves every pod it is given.

In node mode the supervisor holds each served pod's netns and listeners (4 descriptors a pod), and
a descriptor it cannot receive from the node agent drops the agent's connection. Started under
systemd's default soft limit (1024, the hard one far higher), a node used to stop at 250 pods
(tests/bench/bench_scale_nodeproxy.py); here the same with a soft limit of 96 and 40 pods.
"""

from __future__ import annotations

import resource
from pathlib import Path

import pytest

from tests.harness.netns import NetnsFactory
from tests.netns.ambient_harness import NodeProxy, write_ca_dir
from tests.netns.zds_peer import AgentPeer
from tests.netns.ztunnel_harness import Ca, write_local_config

pytestmark = pytest.mark.netns

SOFT_LIMIT = 96
PODS = 40  # 160 descriptors of pods alone


def _soft_limit(pid: int) -> int:
    for line in Path(f"/proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max open files"):
            return int(line.split()[3])
    raise AssertionError("no open-files line in /proc/PID/limits")


def test_node_proxy_under_a_low_soft_fd_limit_serves_pods_beyond_it(tmp_path):
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    assert hard >= 4 * PODS + 200, f"hard limit {hard} too low for this test"
    factory = NetnsFactory()
    try:
        node = factory("node")
        agent = AgentPeer(tmp_path / "zds.sock")
        proxy = NodeProxy(
            node, "", tmp_path, write_local_config(tmp_path / "local.yaml", workloads=[]),
            log_path=tmp_path / "proxy.log", group=None, socket_path=agent.path,
            ca_dir=write_ca_dir(Ca.create(tmp_path / "certs"), tmp_path / "ca"),
        )  # fmt: skip
        resource.setrlimit(resource.RLIMIT_NOFILE, (SOFT_LIMIT, hard))  # what the proxy inherits
        try:
            proxy.start(wait_ready=False)
        finally:
            resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
        try:
            agent.accept()
            for i in range(PODS):
                error = agent.add(f"uid-{i}", factory(f"p{i}").path, f"pod{i}", "bench", "sa")
                assert error == "", f"pod {i}: {error}; {proxy.log_text()}"
            assert agent.snapshot_sent() == ""
            proxy.wait_ready()
            assert len(proxy.config_dump()["workloadState"]) == PODS
            assert _soft_limit(proxy.supervisor_pid()) == hard
            assert "Too many open files" not in proxy.log_text(None)
        finally:
            proxy.stop()
            agent.close()
    finally:
        factory.close()
