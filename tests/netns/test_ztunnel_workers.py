"""Several data-plane workers: they share the listeners, metrics add up, one dying is survived."""

from __future__ import annotations

import hashlib
import os
import signal
import socket
import time
from pathlib import Path

import pytest

from tests.netns.ztunnel_harness import echo_roundtrip, metric_sum
from tests.netns.ztunnel_topology import APP_PORT, two_pod_mesh

pytestmark = pytest.mark.netns


def _tcp_sockets(pid: int) -> int:
    count = 0
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            count += str(fd.readlink()).startswith("socket:")
        except OSError:
            continue  # closed while we looked
    return count


def test_two_workers_share_connections_add_up_metrics_and_survive_one_dying(tmp_path):
    with two_pod_mesh(tmp_path, extra_a=("--workers", "2")) as m:
        workers = m.car_a.dataplane_pids(2)
        assert len(workers) == 2
        assert m.car_a.config_dump()["worker"]["of"] == 2
        before = {pid: _tcp_sockets(pid) for pid in workers}
        addr = (m.b.ip, APP_PORT)
        held = []
        for i in range(40):  # held open (mode E waits for our FIN), so each worker keeps its own
            s = m.a.ns.socket()
            s.settimeout(10)
            s.connect(addr)
            s.sendall(b"E" + b"%d" % i)
            held.append(s)
            time.sleep(0.01)
        # Each connection is open at A once its tunnel stream is up; poll rather than guess how
        # long that takes on a loaded machine.
        end = time.monotonic() + 10
        while m.car_a.config_dump()["connections"]["open"] < 40 and time.monotonic() < end:
            time.sleep(0.05)
        grew = {pid: _tcp_sockets(pid) - before[pid] for pid in workers}
        assert all(n > 0 for n in grew.values()), grew  # both workers accepted connections
        # /config_dump (served by worker 0) shows every worker's connections, not only its own.
        dump = m.car_a.config_dump()
        assert dump["workersMissing"] == []
        assert sorted(w["pid"] for w in dump["workers"]) == workers
        per_worker = {w["index"]: w["open"] for w in dump["workers"]}
        assert sum(per_worker.values()) == 40
        assert all(n > 0 for n in per_worker.values()), per_worker
        assert dump["connections"]["open"] == 40
        flows = dump["connections"]["flows"]
        assert len(flows) == 40
        assert {f["worker"] for f in flows} == {0, 1}
        assert {f["src"]["addr"] for f in flows} == {f"{m.a.ip}:{s.getsockname()[1]}" for s in held}
        for i, s in enumerate(held):
            s.shutdown(socket.SHUT_WR)
            reply = b""
            while chunk := s.recv(65536):
                reply += chunk
            s.close()
            assert reply == hashlib.sha256(b"%d" % i).digest() + b"%d" % i
        opened = "istio_tcp_connections_opened_total"
        assert metric_sum(m.car_a.metrics(), opened, reporter="source") == 40  # sum of both
        # Kill the worker that does not serve HTTP: the other keeps serving at once, counters
        # of the dead one still count, and the supervisor starts a replacement.
        victim = workers[1] if m.car_a.config_dump()["worker"]["pid"] == workers[0] else workers[0]
        os.kill(victim, signal.SIGKILL)
        assert echo_roundtrip(m.a.ns, addr, b"after", timeout=5)[32:] == b"after"
        end = time.monotonic() + 10
        while victim in m.car_a.dataplane_pids(1) or len(m.car_a.dataplane_pids(1)) < 2:
            assert time.monotonic() < end, "no replacement worker"
            time.sleep(0.05)
        for _ in range(10):
            assert echo_roundtrip(m.a.ns, addr, b"again", timeout=5)[32:] == b"again"
        assert metric_sum(m.car_a.metrics(), opened, reporter="source") == 40 + 11
        assert metric_sum(m.car_a.metrics(), "istio_open_sockets") == 0
