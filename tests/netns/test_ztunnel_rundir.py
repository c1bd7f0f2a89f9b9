"""``meshctl ztunnel run`` keeps the workers' metrics in its run directory: a run killed hard
leaves nothing in /tmp, and the next start removes what it left there (issue 24)."""

from __future__ import annotations

import os
import signal

import pytest

from meshctl.core.pki.identity import SpiffeId
from tests.harness.netns import node_with_pods
from tests.netns.ztunnel_harness import TD, Ca, Sidecar
from tests.netns.ztunnel_topology import local_config

pytestmark = pytest.mark.netns


def _metrics_dirs(run_dir):
    return sorted(p.name for p in run_dir.iterdir() if p.name.startswith("metrics-"))


def test_a_killed_proxy_leaks_nothing_outside_its_run_dir_and_the_next_start_cleans_it(tmp_path):
    run_dir, tmpdir = tmp_path / "run", tmp_path / "tmp"
    tmpdir.mkdir()
    with node_with_pods(1) as node:
        (pod,) = node.pods
        cert = Ca.create(tmp_path / "certs").issue("a", SpiffeId(TD, "default", "client"))
        config = local_config(tmp_path / "local.yaml", pod.ip, "10.99.0.2", "10.99.0.3")
        env = {"MESHCTL_RUN_DIR": str(run_dir), "TMPDIR": str(tmpdir)}
        first = Sidecar(pod.ns, "default/client/client", cert, config, env=env).start()
        try:
            (left,) = _metrics_dirs(run_dir)
            assert (run_dir / left / ".lock").exists()
            os.kill(first.supervisor_pid(), signal.SIGKILL)  # no chance to clean up
            first.proc.wait(10)
        finally:
            first.stop()
        assert _metrics_dirs(run_dir) == [left]  # what a SIGKILL leaves...
        second = Sidecar(pod.ns, "default/client/client", cert, config, env=env).start()
        try:
            (now,) = _metrics_dirs(run_dir)  # ...the next start removed; its own is there
            assert now != left
        finally:
            assert second.stop() == 0
        assert _metrics_dirs(run_dir) == []  # a clean stop removes its own
    assert list(tmpdir.iterdir()) == []  # nothing went to $TMPDIR (/tmp by default)


def test_the_default_run_dir_is_under_tmpdir_not_loose_in_it(tmp_path):
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    with node_with_pods(1) as node:
        (pod,) = node.pods
        cert = Ca.create(tmp_path / "certs").issue("a", SpiffeId(TD, "default", "client"))
        config = local_config(tmp_path / "local.yaml", pod.ip, "10.99.0.2", "10.99.0.3")
        car = Sidecar(pod.ns, "default/client/client", cert, config, env={"TMPDIR": str(tmpdir)})
        car.start()
        try:
            assert [p.name for p in tmpdir.iterdir()] == [f"meshctl-ztunnel-{os.geteuid()}"]
            assert len(_metrics_dirs(tmpdir / f"meshctl-ztunnel-{os.geteuid()}")) == 1
        finally:
            car.stop()
