"""The test node leaves the machine as it found it, and lets no pod traffic off the machine.

One test, in order: stop the session's node; snapshot the host; start a node in a subprocess
that runs a pod and is then SIGKILLed (no teardown at all: shims, the pod, its mounts, netns,
veth, the bridge, kubelet's sysctls and chains stay behind); start the session's node again,
which must first clean up the dead run by its state file; prove the forwarding guard with real
traffic; stop it; the host must equal the snapshot.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest
from kubernetes import client as k8s

from tests.harness import nodehost
from tests.harness import workloads as wl
from tests.harness.kube import REPO_ROOT
from tests.harness.node import TestNode
from tests.harness.wait import eventually

pytestmark = pytest.mark.node

# A /30 between the host and a namespace this test creates: the "outside" a pod must not reach
# through the host's forwarding (it is no address off the machine: the netns is ours).
OUTSIDE_HOST, OUTSIDE_NS = "10.250.200.1", "10.250.200.2"


def start_dead_run() -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.node", "--start-then-wait"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.strip() != "ready":
        proc.kill()
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"the node run to be killed did not start: {line!r}\n{err[-4000:]}")
    return proc


def shim_pids() -> list[int]:
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes()
            except OSError:
                continue
            if b"containerd-shim-runc-v2" in cmdline and str(nodehost.WORKDIR).encode() in cmdline:
                found.append(int(entry.name))
    return found


def test_node_cleans_a_killed_run_guards_forwarding_and_restores_the_host(
    kube_node: TestNode, netns_factory
):
    kube_node.stop()
    before = nodehost.HostSnapshot.take()

    dead = start_dead_run()
    running = nodehost.HostSnapshot.take()
    changed = before.differences(running)
    # The run changed the host the way a node does (so the restore below is not vacuous).
    assert any(line.startswith("sysctl net/ipv4/ip_forward") for line in changed), changed
    assert any(line.startswith("links: added") and nodehost.BRIDGE in line for line in changed)
    assert nodehost.guard_in_place()
    dead.send_signal(signal.SIGKILL)
    dead.wait(30)
    dead.stdout.close()
    dead.stderr.close()
    # What a killed run leaves: its record, the pod's shim, mounts, the bridge.
    assert nodehost.read_state() is not None
    old_shims = shim_pids()
    assert old_shims, "the killed run's pod shim should outlive it"
    assert nodehost.mounts_under([str(nodehost.WORKDIR)])
    assert nodehost.BRIDGE in nodehost.host_links()

    cluster = kube_node.start()
    assert kube_node.cleaned_dead_run
    assert not set(old_shims) & set(shim_pids())
    with cluster.api_client() as api:
        # The old run's etcd was thrown away with it: its pod is not in the new cluster.
        assert [p.metadata.name for p in wl.pods(api, "default")] == []
        check_forwarding_guard(kube_node, api, netns_factory)

    kube_node.stop()
    after = nodehost.HostSnapshot.take()
    assert before.differences(after) == []
    assert shim_pids() == []
    assert nodehost.mounts_under([str(nodehost.WORKDIR), *nodehost.HOST_PATHS]) == []
    assert not nodehost.WORKDIR.exists()
    assert nodehost.read_state() is None


def check_forwarding_guard(kube_node: TestNode, api, netns_factory) -> None:
    """A pod reaches pods on the bridge, but the host forwards nothing of it anywhere else."""
    outside = netns_factory("out")
    host_end = f"mto{os.urandom(3).hex()}"
    subprocess.run(
        [
            "ip",
            "link",
            "add",
            host_end,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            outside.name,
        ],
        check=True,
    )
    try:
        subprocess.run(["ip", "addr", "add", f"{OUTSIDE_HOST}/30", "dev", host_end], check=True)
        subprocess.run(["ip", "link", "set", host_end, "up"], check=True)
        outside.run(["ip", "addr", "add", f"{OUTSIDE_NS}/30", "dev", "eth0"])
        outside.run(["ip", "link", "set", "eth0", "up"])
        outside.run(["ip", "route", "add", "default", "via", OUTSIDE_HOST])
        listener = outside.socket()
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((OUTSIDE_NS, 9000))
        listener.listen()
        accepted: list[bytes] = []

        def serve() -> None:
            listener.settimeout(15)
            try:
                conn, _ = listener.accept()
            except OSError:
                return
            with conn:
                accepted.append(conn.recv(100))

        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        # The host itself reaches the namespace (no forwarding involved): the path is sound.
        with socket.create_connection((OUTSIDE_NS, 9000), timeout=5) as sock:
            sock.sendall(b"from the host")
        thread.join(10)
        assert accepted == [b"from the host"]

        image = kube_node.image("busybox")
        core = k8s.CoreV1Api(api)
        for name in ("a", "b"):
            core.create_namespaced_pod(
                "default", wl.busybox_pod(name, image, ["sh", "-c", "exec nc -l -p 9000"])
            )
        a = wl.wait_pod_ready(api, "default", "a")
        b = wl.wait_pod_ready(api, "default", "b")
        # Pod -> pod on the bridge works.
        sent = wl.pod_exec(
            api, "default", "a", ["sh", "-c", f"echo hi | nc -w 2 {b.status.pod_ip} 9000"]
        )
        assert sent.returncode == 0, sent
        # Pod -> the namespace behind the host would need forwarding out of the bridge: dropped.
        accepted.clear()
        thread = threading.Thread(target=serve, daemon=True)
        thread.start()
        blocked = wl.pod_exec(
            api, "default", "a", ["sh", "-c", f"echo leak | nc -w 3 {OUTSIDE_NS} 9000"]
        )
        thread.join(20)
        assert accepted == [], "a pod's packet was forwarded off the node bridge"
        assert blocked.returncode != 0
        assert a.status.pod_ip != b.status.pod_ip
        listener.close()
    finally:
        subprocess.run(["ip", "link", "del", host_end], check=False)
    eventually("the guard to stay in place", nodehost.guard_in_place, timeout=1)
