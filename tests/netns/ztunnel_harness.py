"""Running ``meshctl ztunnel run`` inside test namespaces, and the peers the tests talk to.

Helpers, not fixtures: certificates minted with the core CA, a ``Sidecar`` (the supervisor in a
pod namespace as the proxy's group, waited for until ready, stopped and checked on exit), the
sidecar capture rules installed by ``meshctl iptables apply``, HTTP GETs and an HBONE test
client that run inside a namespace, an echo server with both half-close orders, and a raw
packet capture on a veth. Every sidecar started is remembered: after each test
``unhandled_errors_since_last_check`` scans their logs (supervisor and data planes share one)
for an exception that reached the event loop or a task, which fails the test (conftest.py).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

import h2.config
import h2.connection
import h2.events
import pytest
import yaml

from meshctl.core.pki import certs
from meshctl.core.pki.identity import SpiffeId
from tests.harness.netns import Netns

TD = "cluster.local"
PROXY_GID = 1337  # Istio's proxy uid/gid, exempt from capture (the rules' default)


@dataclass
class Ca:
    """A development CA in a folder; ``issue`` writes a workload's cert dir."""

    root: certs.KeyPair
    folder: Path

    @classmethod
    def create(cls, folder: Path, trust_domain: str = TD) -> Ca:
        now = datetime.now(UTC)
        return cls(
            certs.mint_root(trust_domain=trust_domain, now=now, ttl=timedelta(days=1)), folder
        )

    def issue(
        self,
        name: str,
        identity: SpiffeId,
        *,
        ttl: timedelta = timedelta(hours=1),
        not_before: datetime | None = None,
    ) -> Path:
        out = self.folder / name
        out.mkdir(parents=True, exist_ok=True)
        now = datetime.now(UTC)
        leaf = certs.mint_workload(self.root, identity, now=now, ttl=ttl, not_before=not_before)
        (out / certs.KEY_FILE).write_bytes(leaf.key_pem)
        (out / certs.CERT_CHAIN_FILE).write_bytes(leaf.cert_pem)
        (out / certs.ROOT_CERT_FILE).write_bytes(self.root.cert_pem)
        return out


def workload(
    name: str,
    ns: str,
    ip: str,
    *,
    protocol: str = "HBONE",
    sa: str | None = None,
    services: dict | None = None,
    policies: list[str] | None = None,
) -> dict:
    doc = {
        "uid": f"Kubernetes//Pod/{ns}/{name}",
        "name": name,
        "namespace": ns,
        "serviceAccount": sa or name,
        "trustDomain": TD,
        "clusterId": "Kubernetes",
        "workloadIps": [ip],
        "protocol": protocol,
        "services": services or {},  # ztunnel's reader requires the field
    }
    if policies:
        doc["authorizationPolicies"] = policies
    return doc


def write_local_config(path: Path, **doc: list) -> Path:
    path.write_text(yaml.safe_dump(doc))
    return path


# What asyncio/uvloop and our task guard write when an exception escapes a callback or a task:
# never a peer's fault to cause (a peer's misbehaviour is an event), so always a bug.
UNHANDLED_MARKERS = (
    "Fatal error",
    "Traceback (most recent call last)",
    "Exception in callback",
    "exception was never retrieved",
    "Unhandled exception",
    "connection task failed",
)
_STARTED: list[Sidecar] = []


def unhandled_errors_since_last_check() -> list[str]:
    """Log lines of every sidecar started since the last call that show an escaped exception."""
    found = []
    cars, _STARTED[:] = list(_STARTED), []
    for car in cars:
        text = car.log_text(tail=None)
        for line in text.splitlines():
            if any(marker in line for marker in UNHANDLED_MARKERS):
                found.append(f"{car.workload}: {line.strip()[:300]}")
        if car._own_log and car.log_path is not None:
            car.log_path.unlink(missing_ok=True)
    return found


@pytest.fixture(autouse=True)
def no_exception_escapes_the_data_plane() -> Iterator[None]:
    """Fail the test if an exception reached the event loop or a task of a sidecar it started
    (imported into the conftest of every directory whose tests start data planes)."""
    unhandled_errors_since_last_check()  # a previous test's leftovers are its own
    yield
    found = unhandled_errors_since_last_check()
    if found:
        pytest.fail(
            "an exception reached the event loop or a task (a bug, whatever the peer did):\n"
            + "\n".join(found[:20])
        )


def meshctl_argv(*args: str) -> list[str]:
    return [sys.executable, "-c", "from meshctl.entry import run; run()", *args]


def http_get(
    ns: Netns,
    port: int,
    path: str,
    host: str = "127.0.0.1",
    method: str = "GET",
    timeout: float = 5,
) -> tuple[int, str]:
    with ns.socket() as s:
        s.settimeout(timeout)
        s.connect((host, port))
        s.sendall(f"{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body.decode()


@dataclass
class Sidecar:
    """``meshctl ztunnel run`` for one workload in one namespace."""

    ns: Netns
    workload: str
    cert_dir: Path
    local_config: Path | None  # None: workloads come from discovery (``extra``/``env`` say where)
    extra: tuple[str, ...] = ()
    log_path: Path | None = None
    env: dict[str, str] = field(default_factory=dict)  # e.g. the injector's proxy env
    # The proxy runs as the group the capture rules exempt (``--gid-owner``): uid 1337 cannot
    # run the test interpreter, which lives under /root (trap 9 of the performance notes).
    group: int | None = PROXY_GID
    # A frozen meshctl to run instead of this interpreter (its data plane is then the frozen
    # binary re-executing itself).
    binary: str | None = None
    # --log-level for the supervisor (ZT_LOG overrides "info"); None: its own default.
    log_level: str | None = field(default_factory=lambda: os.environ.get("ZT_LOG", "info"))
    proc: subprocess.Popen[bytes] | None = None
    _log: object = field(default=None, repr=False)
    _own_log: bool = field(default=False, repr=False)  # a temporary file, removed when scanned

    def run_args(self) -> list[str]:
        """The arguments of ``meshctl ztunnel run`` for this proxy."""
        return [
            "--workload",
            self.workload,
            "--cert-dir",
            str(self.cert_dir),
            *(("--local-config", str(self.local_config)) if self.local_config else ()),
            *self.extra,
        ]

    def start(self, wait_ready: bool = True) -> Sidecar:
        command = (lambda *args: [self.binary, *args]) if self.binary else meshctl_argv
        level = ("--log-level", self.log_level) if self.log_level else ()
        argv = command(*level, "ztunnel", "run", *self.run_args())
        if self.log_path is None:  # always a file: the log is scanned for escaped exceptions
            fd, name = tempfile.mkstemp(prefix="sidecar-", suffix=".log")
            os.close(fd)
            self.log_path = Path(name)
            self._own_log = True
        log = self.log_path.open("wb")
        self._log = log
        _STARTED.append(self)
        env = {**os.environ, "MESHCTL_RELOAD_INTERVAL": "200ms", **self.env}
        ids = {} if self.group is None else {"group": self.group, "extra_groups": []}
        self.proc = self.ns.popen(argv, stdout=log, stderr=log, env=env, **ids)
        if wait_ready:
            self.wait_ready()
        return self

    def wait_ready(self, timeout: float = 20) -> None:
        end = time.monotonic() + timeout
        last = "no answer"
        while time.monotonic() < end:
            assert self.proc is not None
            if self.proc.poll() is not None:
                raise AssertionError(f"sidecar exited {self.proc.returncode}: {self.log_text()}")
            try:
                status, body = http_get(self.ns, 15021, "/healthz/ready", timeout=1)
                if status == 200:
                    return
                last = body
            except OSError as exc:
                last = str(exc)
            time.sleep(0.05)
        raise AssertionError(f"sidecar not ready after {timeout}s: {last}; {self.log_text()}")

    def log_text(self, tail: int | None = 4000) -> str:
        """The end of the sidecar's log (``tail`` characters; None: all of it)."""
        text = self.log_path.read_text(errors="replace") if self.log_path else ""
        return text[-tail:] if tail is not None else text

    def metrics(self) -> str:
        return http_get(self.ns, 15020, "/stats/prometheus")[1]

    def config_dump(self) -> dict:
        return json.loads(http_get(self.ns, 15000, "/config_dump")[1])

    def dataplane_pid(self) -> int:
        return self.dataplane_pids(1)[0]

    def dataplane_pids(self, count: int) -> list[int]:
        """The data-plane workers, once there are ``count`` of them: among the supervisor's
        children and, while it runs, the fork server's (meshctl/forkserver.py; the workers it
        forked become the supervisor's when it retires)."""
        end = time.monotonic() + 10
        children: list[int] = []
        while time.monotonic() < end:
            server = self.fork_server_pid()
            candidates = _children(self.supervisor_pid()) + (_children(server) if server else [])
            children = sorted(pid for pid in candidates if _is_worker(pid))
            if len(children) >= count:
                return children
            time.sleep(0.02)
        raise AssertionError(f"{len(children)} data plane children, wanted {count}")

    def fork_server_pid(self) -> int | None:
        """The supervisor's fork server (the data-plane workers' parent), if it runs one: named
        so (forked from the supervisor, it has the supervisor's command line), or re-executed
        as ``fork-server`` (a restart's)."""
        for pid in _children(self.supervisor_pid()):
            with contextlib.suppress(OSError):  # gone meanwhile
                named = Path(f"/proc/{pid}/comm").read_text().strip() == "fork-server"
                if (named or _command(pid) == "fork-server") and not _is_worker(pid):
                    return pid
        return None

    def supervisor_pid(self) -> int:
        """The process running ``ztunnel run``.

        ``ip netns exec`` execs its command, so that is the Popen pid, except for a one-file
        frozen binary: there the Popen pid is PyInstaller's bootloader, which unpacks the
        archive and runs Python as its only child (the data plane it re-executes reuses that
        unpacked archive and is a single process). The one-dir tree (its manifest beside the
        executable) unpacks nothing and runs Python in the one process.
        """
        assert self.proc is not None
        if self.binary is None or (Path(self.binary).parent / "meshctl-tree.json").is_file():
            return self.proc.pid
        end = time.monotonic() + 10
        while not (children := _children(self.proc.pid)):
            assert time.monotonic() < end, "the frozen binary's bootloader started no child"
            time.sleep(0.02)
        return children[0]

    def stop(self, timeout: float = 15) -> int:
        if self.proc is None:
            return 0
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        if hasattr(self._log, "close"):
            self._log.close()  # type: ignore[union-attr]
        return self.proc.returncode


def _children(pid: int) -> list[int]:
    """``pid``'s live children (not one that has exited and awaits its parent's wait)."""
    path = Path(f"/proc/{pid}/task/{pid}/children")
    return sorted(int(c) for c in path.read_text().split() if not _exited(int(c)))


def _command(pid: int) -> str:
    """The meshctl command ``pid`` runs (the word after the executable, or after ``-m meshctl``)."""
    argv = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")
    words = argv[3:] if argv[1:3] == [b"-m", b"meshctl"] else argv[1:]
    return next((w.decode() for w in words if not w.startswith(b"-")), "")


def _is_worker(pid: int) -> bool:
    """A data-plane worker: exec'd as ``ztunnel-dataplane``, or forked by the fork server and
    named so (a fork keeps the server's command line; its name, /proc/PID/comm, is the
    command's, cut to 15 bytes)."""
    try:
        if Path(f"/proc/{pid}/comm").read_text().strip() == "ztunnel-dataplane"[:15]:
            return True
        return _command(pid) == "ztunnel-dataplane"
    except OSError:
        return False


def _exited(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    return stat.rsplit(")", 1)[1].split()[0] in ("Z", "X")


def metric_sum(text: str, name: str, **labels: str) -> float:
    """Sum of a Prometheus metric's samples whose labels include ``labels``."""
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name + "{") and not line.startswith(name + " "):
            continue
        head, _, value = line.rpartition(" ")
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total


def capture(ns: Netns, *flags: str) -> None:
    """Install the sidecar capture rules in ``ns`` with the iptables plugin's CLI."""
    argv = meshctl_argv("iptables", "apply", "--netns", ns.name, *flags)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 0, f"capture rules in {ns.name}: {done.stderr}"


class EchoServer:
    """Echo with both half-close orders, in a namespace, on a thread per connection.

    Mode ``E``: read to EOF, answer sha256 + the bytes, close (client half-closes first).
    Mode ``S`` + 8-byte N: send N deterministic bytes and half-close, then read to EOF and
    record the digest of what arrived in ``received`` (server half-closes first).
    Mode ``R`` + 8-byte N: read N bytes, then reset the connection (TCP RST) with whatever else
    was sent left unread, as iperf3's server does at the end of a run.
    """

    def __init__(self, ns: Netns, ip: str, port: int) -> None:
        self.sock = ns.socket(family_of(ip))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((ip, port))
        self.sock.listen(2048)
        self.received: list[str] = []
        self.peers: list[tuple[str, int]] = []
        self._stop = False
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while not self._stop:
            try:
                conn, addr = self.sock.accept()
            except OSError:
                return
            self.peers.append(addr)
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            mode = conn.recv(1)
            if mode == b"E":
                data = _read_all(conn)
                conn.sendall(hashlib.sha256(data).digest() + data)
            elif mode == b"S":
                n = int.from_bytes(_read_exact(conn, 8), "big")
                conn.sendall(pattern(n))
                conn.shutdown(socket.SHUT_WR)
                self.received.append(hashlib.sha256(_read_all(conn)).hexdigest())
            elif mode == b"R":
                _read_exact(conn, int.from_bytes(_read_exact(conn, 8), "big"))
                conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))

    def close(self) -> None:
        self._stop = True
        self.sock.close()


def family_of(ip: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in ip else socket.AF_INET


def pattern(n: int) -> bytes:
    block = hashlib.sha256(n.to_bytes(8, "big")).digest() * 2048  # 64 KiB
    return (block * (n // len(block) + 1))[:n]


def _read_all(conn: socket.socket) -> bytes:
    chunks = []
    while chunk := conn.recv(1 << 18):
        chunks.append(chunk)
    return b"".join(chunks)


def _read_exact(conn: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("short read")
        data += chunk
    return data


def echo_roundtrip(ns: Netns, addr: tuple[str, int], payload: bytes, timeout: float = 30) -> bytes:
    """Mode E from ``ns``: returns the reply (digest + bytes)."""
    with ns.socket(family_of(addr[0])) as s:
        s.settimeout(timeout)
        s.connect(addr)
        s.sendall(b"E" + payload)
        s.shutdown(socket.SHUT_WR)
        return _read_all(s)


# -- an HBONE client for refusal tests ------------------------------------------------------------


@dataclass
class HboneResult:
    status: int | None  # None: no HTTP/2 response (TLS or connection failure)
    error: str = ""
    body: bytes = b""
    goaway: tuple[int, bytes] | None = None  # the server's GOAWAY: (error code, debug data)
    close_notify: bool | None = None  # after a GOAWAY: TLS ended with close_notify (not a bare EOF)


def client_context(cert_dir: Path | None, roots: Path, *, alpn: str = "h2") -> ssl.SSLContext:
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.check_hostname = False
    ctx.load_verify_locations(cafile=str(roots))
    if cert_dir is not None:
        ctx.load_cert_chain(cert_dir / certs.CERT_CHAIN_FILE, cert_dir / certs.KEY_FILE)
    ctx.set_alpn_protocols([alpn])
    return ctx


def hbone_request(
    ns: Netns,
    addr: tuple[str, int],
    ctx: ssl.SSLContext,
    headers: list[tuple[str, str]],
    payload: bytes = b"",
    timeout: float = 10,
) -> HboneResult:
    """One request on a fresh connection; with 200, sends ``payload`` + END_STREAM and reads."""
    try:
        raw = ns.socket()
        raw.settimeout(timeout)
        raw.connect(addr)
        # Ragged EOFs raise: a TLS close without close_notify must be told apart from one with.
        tls = ctx.wrap_socket(raw, server_hostname=None, suppress_ragged_eofs=False)
    except (OSError, ssl.SSLError) as exc:
        return HboneResult(None, f"handshake: {exc}")
    with tls:
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        conn.initiate_connection()
        end_stream = headers[0][1] != "CONNECT"
        conn.send_headers(1, headers, end_stream=end_stream)
        status: int | None = None
        body = b""
        try:
            tls.sendall(conn.data_to_send())
            while True:
                data = tls.recv(65536)
                if not data:
                    return HboneResult(status, "connection closed", body)
                for ev in conn.receive_data(data):
                    if isinstance(ev, h2.events.ResponseReceived):
                        status = int(dict(ev.headers)[b":status"])
                        if status == 200:
                            conn.send_data(1, payload, end_stream=True)
                        else:
                            return HboneResult(status)
                    elif isinstance(ev, h2.events.DataReceived):
                        body += ev.data
                        conn.acknowledge_received_data(ev.flow_controlled_length, 1)
                    elif isinstance(ev, h2.events.StreamEnded | h2.events.StreamReset):
                        return HboneResult(status, "", body)
                    elif isinstance(ev, h2.events.ConnectionTerminated):
                        goaway = (int(ev.error_code or 0), ev.additional_data or b"")
                        return HboneResult(
                            status,
                            f"goaway {ev.error_code}",
                            body,
                            goaway=goaway,
                            close_notify=_ends_with_close_notify(tls),
                        )
                tls.sendall(conn.data_to_send())
        except (OSError, ssl.SSLError) as exc:
            return HboneResult(status, f"io: {exc}", body)


def _ends_with_close_notify(tls: ssl.SSLSocket) -> bool:
    """Read to the end of the TLS stream: True for close_notify, False for a bare EOF or reset."""
    try:
        while tls.recv(65536):
            pass
    except (OSError, ssl.SSLError):  # SSLEOFError: TCP closed without close_notify
        return False
    return True


@contextlib.contextmanager
def sidecars(*cars: Sidecar) -> Iterator[None]:
    try:
        for car in cars:
            car.start()
        yield
    finally:
        for car in cars:
            car.stop()


# -- a packet capture on one interface ---------------------------------------------------------

ETH_P_ALL = 0x0003
SOL_PACKET, PACKET_ADD_MEMBERSHIP, PACKET_MR_PROMISC = 263, 1, 1  # <linux/if_packet.h>


@dataclass(frozen=True)
class Segment:
    """The payload of one captured IPv4 TCP frame."""

    src: tuple[str, int]
    dst: tuple[str, int]
    payload: bytes


class Sniffer:
    """Every frame on ``ifname`` in ``ns`` (an AF_PACKET socket, no tcpdump), until ``stop``.

    The veth may hand over GRO-merged frames of up to 64 KiB; the socket buffer is sized so a
    burst is not dropped before the reader thread takes it.
    """

    def __init__(self, ns: Netns | None, ifname: str, *, promiscuous: bool = False) -> None:
        with ns.entered() if ns is not None else contextlib.nullcontext():
            self.sock = socket.socket(socket.AF_PACKET, socket.SOCK_RAW, socket.htons(ETH_P_ALL))
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 32 << 20)
        self.sock.bind((ifname, ETH_P_ALL))
        if promiscuous:
            # A bridge hands its own taps only the frames for the host unless it is promiscuous;
            # the membership (packet(7)) ends with the socket, leaving the device as it was.
            index = socket.if_nametoindex(ifname)
            mreq = struct.pack("iHH8s", index, PACKET_MR_PROMISC, 0, b"")
            self.sock.setsockopt(SOL_PACKET, PACKET_ADD_MEMBERSHIP, mreq)
        self.sock.settimeout(0.1)
        self.frames: list[bytes] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._read, daemon=True)
        self._thread.start()

    def _read(self) -> None:
        while not self._stop.is_set():
            try:
                self.frames.append(self.sock.recv(1 << 17))
            except TimeoutError:
                continue
            except OSError:
                return

    def stop(self) -> list[Segment]:
        time.sleep(0.2)  # frames of the last exchange are still on their way to the socket
        self._stop.set()
        self._thread.join(5)
        self.sock.close()
        return [seg for frame in self.frames if (seg := _tcp_segment(frame)) is not None]


def _tcp_segment(frame: bytes) -> Segment | None:
    """IPv4 TCP payload of an Ethernet frame (RFC 791, RFC 9293 header layouts), else None."""
    if len(frame) < 14 + 20 or frame[12:14] != b"\x08\x00":
        return None
    ip = frame[14:]
    ihl = (ip[0] & 0x0F) * 4
    total = int.from_bytes(ip[2:4], "big") or len(ip)  # 0 in GSO frames: take what we got
    if ip[9] != socket.IPPROTO_TCP:
        return None
    tcp = ip[ihl:total]
    offset = (tcp[12] >> 4) * 4
    src = (socket.inet_ntoa(ip[12:16]), int.from_bytes(tcp[0:2], "big"))
    dst = (socket.inet_ntoa(ip[16:20]), int.from_bytes(tcp[2:4], "big"))
    return Segment(src, dst, bytes(tcp[offset:]))


def stream_bytes(segments: list[Segment], src_port: int | None, dst_port: int | None) -> bytes:
    """The captured payload of segments matching the ports, concatenated in capture order."""
    return b"".join(
        s.payload
        for s in segments
        if (src_port is None or s.src[1] == src_port) and (dst_port is None or s.dst[1] == dst_port)
    )
