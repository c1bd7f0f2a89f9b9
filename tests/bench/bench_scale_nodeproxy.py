"""Benchmark: the node proxy at scale, 100 and 250 idle pods enrolled on one node.

Run (root): python -m tests.bench.bench_scale_nodeproxy [--pods 100,250] [--samples K]
    [--identities I] [--binary dist/meshctl] [--smoke]

One ``meshctl ztunnel run --mode node`` in a node namespace, its pods real network namespaces
(``lo`` up) handed over by an independent ZDS peer playing the node agent (tests/netns/zds_peer.py:
an add with the pod's netns descriptor, one ack each), as istio-cni hands them to ztunnel. The
pods are enrolled in order (service accounts ``sa<i % I>``: I identities, one certificate each)
and at each ``--pods`` point, once every pod is Up in the proxy's config dump and idle:

- memory: RSS and PSS summed over every process of the proxy (supervisor, fork server, data
  plane: it runs the data plane as a subprocess), open file descriptors, threads;
- enrollment with N already enrolled: ``--samples`` pods more, one by one, each timed from the
  ZDS add being sent to its listeners accepting (a TLS ClientHello made inside the pod to its
  port 15008 gets the data plane's answer; a listener that is open but not yet served holds the
  connection in its backlog), once with a service account already served (certificate known)
  and once with a new one (the proxy signs its certificate first); each pod deleted again after,
  so N stays N. The ZDS ack alone is reported beside it;
- after the last point, a restart: the proxy stopped (SIGTERM) and started again, the agent
  replaying its snapshot (every pod added again, then the snapshot marker), timed from the new
  process's start to the agent's connection, to every add acked (each pod's listeners open
  again: connections from then on wait in the backlog) and to every pod Up (accepting) in the
  proxy's dump; then each pod's 15008 is sent a ClientHello, in turn, to confirm.

Baselines in the same run: an idle ``python -c`` (an interpreter doing nothing), and a tiny
Python process that opens the same listeners (15001/15006/15008) in the same N namespaces
(``setns`` in, ``listen``, back), its RSS, descriptors and milliseconds per pod; and the proxy
with no pod. Targets (issue 29): RSS <= 80 MB at 100 idle pods, <= 150 MB at 250; enrollment p99
<= 100 ms at 250. Figures, not a gate. ``--smoke``: 4 and 8 pods, 3 samples; asserts only
that every figure was produced (CI, well under a minute).
"""

from __future__ import annotations

import argparse
import contextlib
import ctypes
import os
import socket
import ssl
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from tests.bench.pyspy import profiled  # noqa: E402 (after the path set-up)
from tests.bench.smoke import figures_produced  # noqa: E402
from tests.harness.netns import NetnsFactory, destroy  # noqa: E402

HBONE = 15008  # of the proxy's three listeners in each pod (15001, 15006, 15008)
RSS_GOALS_MB = {100: 80.0, 250: 150.0}
ENROLL_P99_GOAL_MS = 100.0
_CLONE_NEWNET = 0x40000000


def pct(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, round(q * (len(ordered) - 1)))]


# -- the processes measured --------------------------------------------------------------------


def process_tree(pid: int) -> list[int]:
    """``pid`` and all its descendants (every thread's children)."""
    out, todo = [], [pid]
    while todo:
        current = todo.pop()
        out.append(current)
        with contextlib.suppress(OSError):
            for task in Path(f"/proc/{current}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
    return out


@dataclass
class Footprint:
    rss_mb: float
    pss_mb: float
    fds: int
    threads: int
    processes: int
    rss_by_process: list[tuple[str, float]] = field(default_factory=list)  # (comm, MB)


def footprint(pids: list[int]) -> Footprint:
    rss = pss = 0.0
    fds = threads = 0
    each = []
    for pid in pids:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                mb = int(line.split()[1]) / 1024
                rss += mb
                each.append((Path(f"/proc/{pid}/comm").read_text().strip(), mb))
            elif line.startswith("Threads:"):
                threads += int(line.split()[1])
        for line in Path(f"/proc/{pid}/smaps_rollup").read_text().splitlines():
            if line.startswith("Pss:"):
                pss += int(line.split()[1]) / 1024
        fds += sum(1 for _ in Path(f"/proc/{pid}/fd").iterdir())
    return Footprint(rss, pss, fds, threads, len(pids), each)


# -- is a pod's listener served? ---------------------------------------------------------------


class PodSockets:
    """Sockets made inside a pod's namespace from this process (``setns`` there and back)."""

    def __init__(self) -> None:
        self._libc = ctypes.CDLL(None, use_errno=True)
        self._home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
        self._tls.check_hostname = False
        self._tls.verify_mode = ssl.CERT_NONE
        self._tls.set_alpn_protocols(["h2"])

    def socket(self, netns_path: str) -> socket.socket:
        fd = os.open(netns_path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if self._libc.setns(fd, _CLONE_NEWNET) != 0:
                raise OSError(ctypes.get_errno(), "setns into the pod")
            try:
                return socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            finally:
                if self._libc.setns(self._home, _CLONE_NEWNET) != 0:
                    raise OSError(ctypes.get_errno(), "setns home")
        finally:
            os.close(fd)

    def answers(self, netns_path: str, deadline: float) -> bool:
        """Whether the pod's HBONE port answers a ClientHello before ``deadline`` (monotonic).
        Any answer counts (a finished handshake, an alert, a reset: the data plane accepted);
        a refusal (no listener yet) is retried."""
        while time.monotonic() < deadline:
            with self.socket(netns_path) as sock:
                sock.settimeout(max(0.01, deadline - time.monotonic()))
                try:
                    sock.connect(("127.0.0.1", HBONE))
                except ConnectionRefusedError:
                    time.sleep(0.005)
                    continue
                except TimeoutError:
                    return False
                try:
                    with self._tls.wrap_socket(sock) as tls:
                        tls.do_handshake()
                except TimeoutError:
                    return False
                except (ssl.SSLError, ConnectionError):
                    pass  # the data plane answered (and refused a client without a certificate)
                return True
        return False

    def close(self) -> None:
        os.close(self._home)


# -- the baselines -------------------------------------------------------------------------------


# The plain-listener baseline's whole program (``python -c``: nothing imported beyond what it
# uses): the same listeners in each namespace given (ports + 1000, beside the proxy's own), each
# namespace's descriptor kept as the proxy keeps each pod's, then idle until stdin closes.
_LISTEN = """
import ctypes, os, socket, sys, time
libc = ctypes.CDLL(None, use_errno=True)
home = os.open("/proc/thread-self/ns/net", os.O_RDONLY)
held = []
started = time.perf_counter()
for path in sys.argv[1:]:
    fd = os.open(path, os.O_RDONLY)
    assert libc.setns(fd, 0x40000000) == 0
    for port in (15001, 15006, 15008):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(("0.0.0.0", port + 1000))
        sock.listen(4096)
        held.append(sock)
    assert libc.setns(home, 0x40000000) == 0
    held.append(fd)
per_pod = (time.perf_counter() - started) * 1000 / max(1, len(sys.argv) - 1)
print(f"ready {per_pod:.3f}", flush=True)
sys.stdin.read()
"""


@dataclass
class Baseline:
    per_pod_ms: float
    footprint: Footprint


def plain_listeners(paths: list[str]) -> Baseline:
    proc = subprocess.Popen(
        [sys.executable, "-c", _LISTEN, *paths],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline().split()
        assert line[:1] == ["ready"], line
        time.sleep(0.5)
        return Baseline(float(line[1]), footprint([proc.pid]))
    finally:
        assert proc.stdin is not None
        proc.stdin.close()
        proc.wait(10)


def idle_interpreter() -> Footprint:
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        time.sleep(0.5)
        return footprint([proc.pid])
    finally:
        proc.kill()
        proc.wait()


# -- the node -----------------------------------------------------------------------------------


@dataclass
class Point:
    pods: int
    proxy: Footprint
    plain: Baseline
    known_ms: list[float]
    new_ms: list[float]
    ack_ms: list[float]
    ramp_ack_ms: list[float]


@dataclass
class Scale:
    tmp: Path
    identities: int
    binary: str | None
    factory: Any = None
    proxy: Any = None
    agent: Any = None
    pods: list[tuple[str, Any, str]] = field(default_factory=list)  # (uid, netns, account)
    probe: PodSockets = field(default_factory=PodSockets)
    _sampled: int = 0

    @contextlib.contextmanager
    def running(self) -> Iterator[Scale]:
        from tests.netns.ambient_harness import NodeProxy, write_ca_dir
        from tests.netns.zds_peer import AgentPeer
        from tests.netns.ztunnel_harness import Ca, write_local_config

        self.factory = NetnsFactory()
        try:
            node = self.factory("node")
            ca_dir = write_ca_dir(Ca.create(self.tmp / "certs"), self.tmp / "ca")
            config = write_local_config(self.tmp / "local.yaml", workloads=[])
            self.agent = AgentPeer(self.tmp / "zds.sock")
            self.proxy = NodeProxy(
                node, "", self.tmp, config, log_path=self.tmp / "proxy.log", group=None,
                socket_path=self.agent.path, ca_dir=ca_dir, binary=self.binary,
            )  # fmt: skip
            try:
                self._start()
                yield self
            finally:
                self.proxy.stop()
                self.agent.close()
                self.probe.close()
        finally:
            self.factory.close()

    def _start(self) -> float:
        started = time.monotonic()
        self.proxy.start(wait_ready=False)
        self.agent.accept(timeout=60)
        return started

    def footprint(self) -> Footprint:
        return footprint(process_tree(self.proxy.proc.pid))

    def add(self, uid: str, ns: Any, sa: str) -> float:
        """Milliseconds from the add's send to its ack."""
        started = time.perf_counter()
        try:
            error = self.agent.add(uid, ns.path, uid, "bench", sa)
        except OSError as exc:
            error = str(exc)
        if error:
            raise RuntimeError(
                f"the add of pod {uid} ({len(self.pods)} served) failed: {error}\n"
                f"the node proxy's log ends:\n{self.proxy.log_text(3000)}"
            )
        return (time.perf_counter() - started) * 1000

    def grow(self, count: int) -> list[float]:
        """Enroll pods until ``count`` are served; the ack times of the new ones."""
        acks = []
        while len(self.pods) < count:
            i = len(self.pods)
            ns, sa = self.factory(f"p{i}"), f"sa{i % self.identities}"
            acks.append(self.add(f"pod{i}", ns, sa))
            self.pods.append((f"pod{i}", ns, sa))
        self.wait_up(count)
        return acks

    def wait_up(self, count: int, timeout: float = 300, poll: float = 0.5) -> None:
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            state = self.proxy.config_dump()["workloadState"]
            if len(state) == count and all(s["state"] == "Up" for s in state.values()):
                return
            time.sleep(poll)
        raise RuntimeError(f"{count} pods not all Up within {timeout:.0f}s")

    def enroll_once(self, sa: str) -> tuple[float, float]:
        """(add to ack, add to accepting) in ms for one more pod, deleted again after."""
        self._sampled += 1
        uid = f"sample{self._sampled}"
        ns = self.factory("s")
        try:
            started = time.perf_counter()
            ack = self.add(uid, ns, sa)
            assert self.probe.answers(ns.path, time.monotonic() + 30), f"{uid} never answered"
            accepting = (time.perf_counter() - started) * 1000
            assert self.agent.delete(uid) == ""
        finally:
            self.factory.created.remove(ns)
            destroy(ns)
        return ack, accepting

    def restart(self) -> Restart:
        """The proxy stopped and started again, the agent replaying its snapshot."""
        self.proxy.stop()
        self.agent.drop()
        started = self._start()
        connected = time.monotonic()
        for uid, ns, sa in self.pods:
            self.add(uid, ns, sa)
        assert self.agent.snapshot_sent() == ""
        acked = time.monotonic()
        self.wait_up(len(self.pods), poll=0.05)
        up = time.monotonic()
        for uid, ns, _ in self.pods:
            assert self.probe.answers(ns.path, time.monotonic() + 120), f"{uid} after restart"
        probed = time.monotonic()
        return Restart(connected - started, acked - started, up - started, probed - up)


@dataclass
class Restart:
    """Seconds from the new proxy's start to: the agent's connection, every pod's add acked
    (its listeners open again), every pod Up (accepting) in the proxy's dump; and the seconds a
    ClientHello to every pod's 15008 then takes, one after another (confirmation, not a wait)."""

    connected: float
    acked: float
    up: float
    probe_pass: float


def measure_point(scale: Scale, pods: int, samples: int) -> Point:
    ramp = scale.grow(pods)
    time.sleep(2.0)  # idle: the certificates and the first config pushes are done
    proxy = scale.footprint()
    plain = plain_listeners([ns.path for _, ns, _ in scale.pods])
    known, new, acks = [], [], []
    for i in range(samples):
        ack, ms = scale.enroll_once(f"sa{i % scale.identities}")
        known.append(ms)
        acks.append(ack)
        ack, ms = scale.enroll_once(f"new{pods}-{i}")
        new.append(ms)
    return Point(pods, proxy, plain, known, new, acks, ramp)


# -- report --------------------------------------------------------------------------------------


def p50_p99(values: list[float]) -> str:
    return f"p50 {statistics.median(values):6.1f} ms  p99 {pct(values, 0.99):6.1f} ms"


def report(
    points: list[Point], empty: Footprint, idle: Footprint, restart: Restart
) -> dict[str, float]:
    figures: dict[str, float] = {}
    print(
        f"node proxy, no pods: RSS {empty.rss_mb:.1f} MB (PSS {empty.pss_mb:.1f}), "
        f"{empty.fds} fds, {empty.threads} threads, {empty.processes} processes"
    )
    print(f"baseline: idle python -c: RSS {idle.rss_mb:.1f} MB (PSS {idle.pss_mb:.1f})")
    figures |= {"rss_empty_mb": empty.rss_mb, "rss_idle_python_mb": idle.rss_mb}
    for p in points:
        goal = RSS_GOALS_MB.get(p.pods)
        verdict = "" if goal is None else f" (target <= {goal:.0f}: {_met(p.proxy.rss_mb, goal)})"
        per_pod = (p.proxy.rss_mb - empty.rss_mb) * 1024 / p.pods
        print(f"-- {p.pods} idle pods")
        print(
            f"  RSS            {p.proxy.rss_mb:7.1f} MB (PSS {p.proxy.pss_mb:.1f}), "
            f"{per_pod:.0f} KB per pod{verdict}"
        )
        print(
            "  of which       " + ", ".join(f"{n} {mb:.1f} MB" for n, mb in p.proxy.rss_by_process)
        )
        print(
            f"  descriptors    {p.proxy.fds:7d}  threads {p.proxy.threads}, "
            f"processes {p.proxy.processes}"
        )
        print(
            f"  plain listeners (baseline: one python, same listeners in the same netns): "
            f"RSS {p.plain.footprint.rss_mb:.1f} MB, {p.plain.footprint.fds} fds, "
            f"{p.plain.per_pod_ms:.2f} ms per pod"
        )
        goal_text = (
            f" (target p99 <= {ENROLL_P99_GOAL_MS:.0f}: "
            f"{_met(pct(p.known_ms, 0.99), ENROLL_P99_GOAL_MS)})"
            if p.pods >= 250
            else ""
        )
        print(f"  enroll, known identity: add to accepting {p50_p99(p.known_ms)}{goal_text}")
        print(f"  enroll, new identity:   add to accepting {p50_p99(p.new_ms)}")
        print(f"  of which add to ack:                     {p50_p99(p.ack_ms)}")
        print(f"  while ramping up to {p.pods}: add to ack {p50_p99(p.ramp_ack_ms)}")
        n = p.pods
        figures |= {
            f"rss_{n}_mb": p.proxy.rss_mb,
            f"pss_{n}_mb": p.proxy.pss_mb,
            f"fds_{n}": float(p.proxy.fds),
            f"plain_rss_{n}_mb": p.plain.footprint.rss_mb,
            f"plain_ms_per_pod_{n}": p.plain.per_pod_ms,
            f"enroll_known_p50_{n}_ms": statistics.median(p.known_ms),
            f"enroll_known_p99_{n}_ms": pct(p.known_ms, 0.99),
            f"enroll_new_p99_{n}_ms": pct(p.new_ms, 0.99),
            f"ack_p99_{n}_ms": pct(p.ack_ms, 0.99),
        }
    last = points[-1].pods
    print(
        f"-- restart with {last} pods: agent connected after {restart.connected:.2f} s, every "
        f"add acked (listeners open) after {restart.acked:.2f} s, every pod Up after "
        f"{restart.up:.2f} s (then a ClientHello to each, in turn: {restart.probe_pass:.2f} s)"
    )
    print(
        f"   baseline: the plain process opens {last} pods' listeners in "
        f"{points[-1].plain.per_pod_ms * last / 1000:.2f} s"
    )
    figures |= {
        "restart_connected_s": restart.connected,
        "restart_acked_s": restart.acked,
        "restart_up_s": restart.up,
        "restart_probe_pass_s": restart.probe_pass,
    }
    return figures


def _met(value: float, goal: float) -> str:
    return "met" if value <= goal else "NOT met"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pods", default="100,250", help="scale points, ascending")
    parser.add_argument("--samples", type=int, default=30, help="pods timed at each point")
    parser.add_argument("--identities", type=int, default=25, help="service accounts in use")
    parser.add_argument("--binary", help="a frozen meshctl to run instead of this interpreter")
    parser.add_argument(
        "--profile", type=Path, help="py-spy the proxy's processes while enrolling (raw stacks)"
    )
    parser.add_argument("--smoke", action="store_true", help="tiny sizes: does every figure come?")
    args = parser.parse_args()
    if os.geteuid() != 0:
        sys.exit("needs root (network namespaces)")
    if args.smoke:
        args.pods, args.samples, args.identities = "4,8", 3, 2
    points_wanted = sorted(int(p) for p in args.pods.split(","))
    idle = idle_interpreter()
    points: list[Point] = []
    with tempfile.TemporaryDirectory(prefix="bench-scale-np-") as tmp:
        scale = Scale(Path(tmp), args.identities, args.binary)
        with scale.running():
            assert scale.agent.snapshot_sent() == ""
            scale.proxy.wait_ready(timeout=60)
            time.sleep(1.0)
            empty = scale.footprint()
            with profiled(scale.proxy.proc.pid, args.profile):
                for n in points_wanted:
                    points.append(measure_point(scale, n, args.samples))
            restart = scale.restart()
    print(
        f"node proxy scale bench: {os.cpu_count()} CPUs, load {os.getloadavg()[0]:.2f}"
        f"{' (smoke)' if args.smoke else ''}"
    )
    figures = report(points, empty, idle, restart)
    if args.smoke:
        return figures_produced(figures)
    return 0


if __name__ == "__main__":
    sys.exit(main())
