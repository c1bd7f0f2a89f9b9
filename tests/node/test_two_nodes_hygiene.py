"""A killed two-node run is cleaned up by the next start, and the host is as before.

Stop the session's node; snapshot the host; start node 1 and node 2 in a subprocess that runs a
pod on node 2 and is then SIGKILLed (no teardown: node 2's shim and pod keep its namespaces
alive, and with them the link ``mtnode2h``); start the session's node again, which must first
clean up the dead run by its state file, node 2 included; stop it; the host must equal the
snapshot.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import nodehost
from tests.harness.kube import REPO_ROOT
from tests.harness.node import TestNode
from tests.harness.node2 import LINK_HOST

pytestmark = pytest.mark.node


def node2_processes() -> list[int]:
    """Processes of a node run (naming its work dir) in another network namespace than ours:
    node 2's shims and the like."""
    ours = Path("/proc/self/ns/net").stat().st_ino
    marker = str(nodehost.WORKDIR).encode()
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if marker in (entry / "cmdline").read_bytes() and (
                (entry / "ns/net").stat().st_ino != ours
            ):
                found.append(int(entry.name))
        except OSError:
            continue
    return found


def test_a_killed_two_node_run_is_cleaned_up_by_the_next_start(kube_node: TestNode):
    kube_node.stop()
    before = nodehost.HostSnapshot.take()
    dead = subprocess.Popen(
        [sys.executable, "-m", "tests.harness.node2", "--start-then-wait"],
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO_ROOT)},
    )
    assert dead.stdout is not None
    line = dead.stdout.readline()
    if line.strip() != "ready":
        dead.kill()
        _, err = dead.communicate(timeout=60)
        pytest.fail(f"the two-node run to be killed did not start: {line!r}\n{err[-4000:]}")
    assert LINK_HOST in nodehost.host_links()
    dead.send_signal(signal.SIGKILL)
    dead.wait(30)
    dead.stdout.close()
    assert dead.stderr is not None
    dead.stderr.close()
    # What the killed run leaves of node 2: its shim (so its namespaces), the link.
    old = node2_processes()
    assert old, "node 2's pod shim should outlive the run"
    assert LINK_HOST in nodehost.host_links()
    assert nodehost.read_state() is not None

    kube_node.start()
    assert kube_node.cleaned_dead_run
    assert not set(old) & set(node2_processes())
    assert LINK_HOST not in nodehost.host_links()

    kube_node.stop()
    after = nodehost.HostSnapshot.take()
    assert before.differences(after) == []
    assert node2_processes() == []
    assert not nodehost.WORKDIR.exists()
