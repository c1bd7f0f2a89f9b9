"""Istio's east-west gateway between two networks: a client in network A reaches services in
network B only through ``meshctl gateway run`` on 15443 (AUTO_PASSTHROUGH), with mTLS end to
end: the server sees the client's SPIFFE id, the client sees the server's, and what the gateway
forwards is the client's TLS records byte for byte (never the plaintext), to a plain endpoint
directly and to a meshed one inside HBONE with the gateway's identity as the outer layer only.
Names that route nowhere are closed, the reason in the access log.

Topology (every namespace and link made by the test): ``A`` (client) -- ``gw`` (the gateway,
no forwarding) -- ``B`` (servers). A and B have no route to each other.
"""

from __future__ import annotations

import contextlib
import http.client
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from meshctl.core.pki.identity import SpiffeId
from tests.harness import gateway as gw
from tests.harness.netns import Netns, NetnsFactory, random_subnet, veth_pair
from tests.netns.ztunnel_harness import (
    TD,
    Ca,
    Sidecar,
    http_get,
    metric_sum,
    workload,
    write_local_config,
)

pytestmark = pytest.mark.netns

APP_PORT = 8443
CLIENT = SpiffeId(TD, "a", "client-sa")
SERVER = SpiffeId(TD, "b", "web-sa")
GATEWAY = SpiffeId(TD, "istio-system", "eastwest-sa")
MARKER = b"secret-payload-4f1d"  # the application's plaintext: never on the gateway's wire


def _uri_sans(cert: dict[str, Any]) -> list[str]:
    return [v for k, v in cert.get("subjectAltName", ()) if k == "URI"]


class _Tls:
    """One TLS side over a blocking socket through memory BIOs, so every byte that crossed the
    wire is recorded (``raw_in``, ``raw_out``)."""

    def __init__(self, sock: socket.socket, context: ssl.SSLContext, **kwargs: Any) -> None:
        self.incoming, self.outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        self.sock = sock
        self.obj = context.wrap_bio(self.incoming, self.outgoing, **kwargs)
        self.raw_in = bytearray()
        self.raw_out = bytearray()

    def _flush(self) -> None:
        data = self.outgoing.read()
        if data:
            self.raw_out += data
            self.sock.sendall(data)

    def _fill(self) -> None:
        data = self.sock.recv(65536)
        if not data:
            raise ConnectionError("the peer closed the connection")
        self.raw_in += data
        self.incoming.write(data)

    def _step(self, call: Any, *args: Any) -> Any:
        while True:
            try:
                result = call(*args)
            except ssl.SSLWantReadError:
                self._flush()
                self._fill()
                continue
            self._flush()
            return result

    def handshake(self) -> None:
        self._step(self.obj.do_handshake)

    def send(self, data: bytes) -> None:
        self._step(self.obj.write, data)

    def line(self) -> bytes:
        out = b""
        while not out.endswith(b"\n"):
            out += self._step(self.obj.read, 65536)
        return out


def _context(side: int, cert_dir: Path) -> ssl.SSLContext:
    context = ssl.SSLContext(side)
    context.load_cert_chain(cert_dir / "cert-chain.pem", cert_dir / "key.pem")
    context.load_verify_locations(cert_dir / "root-cert.pem")
    context.verify_mode = ssl.CERT_REQUIRED
    if side == ssl.PROTOCOL_TLS_CLIENT:
        context.check_hostname = False  # Istio checks the peer's SPIFFE SAN, not a DNS name
    return context


@dataclass
class _Served:
    peer: list[str]  # the client's URI SANs, as the server's mTLS saw them
    line: bytes
    raw_in: bytes  # every byte the server's socket received


@dataclass
class _App:
    """The mTLS application in network B: terminates the client's mTLS itself, answers
    ``peer=<client SPIFFE id>``, records every byte its socket received."""

    context: ssl.SSLContext
    listener: socket.socket
    served: list[_Served] = field(default_factory=list)
    accepted: int = 0

    def serve(self) -> None:
        while True:
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            threading.Thread(target=self._one, args=(conn,), daemon=True).start()

    def _one(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError, ssl.SSLError, ConnectionError):
            conn.settimeout(10)
            tls = _Tls(conn, self.context, server_side=True)
            tls.handshake()
            peer = _uri_sans(tls.obj.getpeercert() or {})
            line = tls.line()
            # Recorded before answering: once the client has the answer, the test reads this
            # (the client sends nothing after its line, so nothing is missed).
            self.served.append(_Served(peer=peer, line=line, raw_in=bytes(tls.raw_in)))
            tls.send(f"peer={','.join(peer)}\n".encode())


@contextlib.contextmanager
def _app(ns: Netns, cert_dir: Path) -> Iterator[_App]:
    listener = ns.socket()
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("0.0.0.0", APP_PORT))  # noqa: S104 (inside the test's namespace)
    listener.listen(16)
    app = _App(_context(ssl.PROTOCOL_TLS_SERVER, cert_dir), listener)
    thread = threading.Thread(target=app.serve, daemon=True)
    thread.start()
    try:
        yield app
    finally:
        listener.close()


@dataclass(frozen=True)
class _Networks:
    a: Netns
    gw: Netns
    b: Netns
    gw_a: str  # the gateway's address in network A
    b_ip: str  # the servers' address in network B


@pytest.fixture
def networks(netns_factory: NetnsFactory) -> _Networks:
    net_a = random_subnet()
    net_b = random_subnet()
    while net_b == net_a:
        net_b = random_subnet()
    a, gw_ns, b = netns_factory("neta"), netns_factory("ewgw"), netns_factory("netb")
    host = lambda net, i: str(net.network_address + i)  # noqa: E731
    veth_pair(a, gw_ns, a_addr=f"{host(net_a, 2)}/24", b_addr=f"{host(net_a, 1)}/24")
    veth_pair(gw_ns, b, a_addr=f"{host(net_b, 1)}/24", b_addr=f"{host(net_b, 2)}/24", a_name="eth1")
    return _Networks(a=a, gw=gw_ns, b=b, gw_a=host(net_a, 1), b_ip=host(net_b, 2))


def _objects(b_ip: str) -> list[dict[str, Any]]:
    east_west = gw.gateway(
        {"name": "cross-network", "port": 15443, "protocol": "TLS", "tls": {"mode": "Passthrough"}},
        name="eastwest",
        namespace="istio-system",
    )
    east_west["metadata"]["labels"] = {"topology.istio.io/network": "network-b"}
    out: list[dict[str, Any]] = [gw.gateway_class(), east_west]
    # web: an unmeshed pod (plain TCP from the gateway); mesh: an ambient pod (HBONE).
    for name, labels in (("web", {}), ("mesh", {"istio.io/dataplane-mode": "ambient"})):
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Service",
                "metadata": {"name": name, "namespace": "b"},
                "spec": {"ports": [{"name": "tls", "port": APP_PORT, "targetPort": APP_PORT}]},
            }
        )
        slice_ = gw.endpoint_slice(name, [(b_ip, True)], APP_PORT, APP_PORT, namespace="b")
        slice_["ports"][0]["name"] = "tls"
        slice_["endpoints"][0]["targetRef"] = {"kind": "Pod", "name": f"{name}-0"}
        out.append(slice_)
        out.append(
            {
                "apiVersion": "v1",
                "kind": "Pod",
                "metadata": {"name": f"{name}-0", "namespace": "b", "labels": labels},
                "spec": {"serviceAccountName": SERVER.service_account},
            }
        )
    return out


def _get(ns: Netns, path: str) -> tuple[int, str]:
    with ns.entered():  # the connection's socket is made in the namespace
        conn = http.client.HTTPConnection("127.0.0.1", 15020, timeout=2)
        conn.connect()
    with contextlib.closing(conn):
        conn.request("GET", path)
        response = conn.getresponse()
        return response.status, response.read().decode()


@dataclass
class _Gateway:
    proc: subprocess.Popen[bytes]
    log: Path
    ns: Netns

    def output(self) -> str:
        return self.log.read_text()

    def wait_log(self, text: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if text in (out := self.output()):
                return out
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in the gateway's log:\n{self.output()}")


@contextlib.contextmanager
def _gateway(networks: _Networks, tmp: Path, cert_dir: Path) -> Iterator[_Gateway]:
    config = tmp / "eastwest.yaml"
    config.write_text(yaml.safe_dump_all(_objects(networks.b_ip)))
    log = tmp / "gateway.log"
    env = {
        "HOME": str(tmp),
        "PATH": "/usr/bin:/bin",
        "POD_NAMESPACE": GATEWAY.namespace,
        "SERVICE_ACCOUNT": GATEWAY.service_account,
        "MESHCTL_CERT_DIR": str(cert_dir),
    }
    argv = [sys.executable, "-m", "meshctl", "gateway", "run", "-f", str(config)]
    with log.open("wb") as out:
        proc = networks.gw.popen(argv, stdout=out, stderr=subprocess.STDOUT, env=env)
    running = _Gateway(proc, log, networks.gw)
    try:
        deadline = time.monotonic() + 30
        while True:
            assert proc.poll() is None, f"gateway exited {proc.returncode}:\n{running.output()}"
            with contextlib.suppress(OSError):
                if _get(networks.gw, "/healthz/ready")[0] == 200:
                    break
            assert time.monotonic() < deadline, f"gateway not ready:\n{running.output()}"
            time.sleep(0.1)
        yield running
        assert "Traceback" not in running.output()  # every refusal is an outcome, not a crash
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _call(networks: _Networks, cert_dir: Path, sni: str) -> tuple[_Tls, bytes]:
    """From network A through the gateway: mTLS with ``sni``, one line each way."""
    sock = networks.a.socket()
    sock.settimeout(10)
    sock.connect((networks.gw_a, 15443))
    tls = _Tls(sock, _context(ssl.PROTOCOL_TLS_CLIENT, cert_dir), server_hostname=sni)
    with sock:
        tls.handshake()
        tls.send(b"hello " + MARKER + b"\n")
        return tls, tls.line()


def _records(data: bytes) -> list[int]:
    """The content types of ``data`` read as whole TLS records (RFC 8446 §5.1); fails on any
    byte that is not part of one."""
    types, at = [], 0
    while at < len(data):
        assert at + 5 <= len(data), f"a partial record header at {at}"
        kind, major, length = data[at], data[at + 1], int.from_bytes(data[at + 3 : at + 5])
        assert kind in (20, 21, 22, 23), f"content type {kind} at {at}"
        assert major == 3, f"no TLS record at {at}"
        assert length <= 2**14 + 256, f"a record of {length} bytes at {at}"
        types.append(kind)
        at += 5 + length
    assert at == len(data)
    return types


@pytest.fixture
def certs(tmp_path: Path) -> dict[str, Path]:
    ca = Ca.create(tmp_path / "ca")
    return {
        "client": ca.issue("client", CLIENT),
        "server": ca.issue("server", SERVER),
        "gateway": ca.issue("gateway", GATEWAY),
    }


def test_network_a_reaches_network_b_only_through_the_gateway(networks):
    with networks.a.socket() as sock:
        sock.settimeout(3)
        with pytest.raises(OSError, match="unreachable"):  # no route at all: ENETUNREACH
            sock.connect((networks.b_ip, APP_PORT))


def test_a_client_in_network_a_reaches_a_server_in_b_with_mtls_end_to_end(
    networks, certs, tmp_path
):
    with _app(networks.b, certs["server"]) as app, _gateway(networks, tmp_path, certs["gateway"]):
        tls, answer = _call(networks, certs["client"], f"outbound_.{APP_PORT}_._.web.b.svc.{TD}")
        assert answer == f"peer={CLIENT}\n".encode()  # the server saw the client, not the gateway
        assert _uri_sans(tls.obj.getpeercert() or {}) == [str(SERVER)]
        (served,) = app.served
        # What reached the server is what the client sent, byte for byte: TLS records only.
        assert served.raw_in == bytes(tls.raw_out)
        types = _records(served.raw_in)
        assert types[0] == 22  # the ClientHello first ...
        assert 23 in types  # ... and the session's application data, encrypted
        assert MARKER not in served.raw_in
        assert served.line == b"hello " + MARKER + b"\n"  # the server's mTLS decrypted it
        status, metrics = _get(networks.gw, "/stats/prometheus")
    assert status == 200
    opened = [
        line
        for line in metrics.splitlines()
        if line.startswith("istio_tcp_connections_opened_total{")
        and 'destination_service_name="web"' in line
    ]
    assert opened, metrics
    assert float(opened[0].rsplit(" ", 1)[1]) >= 1


def test_a_meshed_server_gets_the_clients_tls_inside_hbone_with_the_gateways_identity_outside(
    networks, certs, tmp_path
):
    with (
        _app(networks.b, certs["server"]) as app,
        gw.hbone_peer(
            certs["server"], APP_PORT, netns=networks.b.name, address=networks.b_ip
        ) as peer,
        _gateway(networks, tmp_path, certs["gateway"]) as running,
    ):
        tls, answer = _call(networks, certs["client"], f"outbound_.{APP_PORT}_._.mesh.b.svc.{TD}")
        assert answer == f"peer={CLIENT}\n".encode()
        assert _uri_sans(tls.obj.getpeercert() or {}) == [str(SERVER)]
        log = running.wait_log("auto-passthrough b/mesh:8443")
    # The outer HBONE layer is the gateway's; the inner session is the client's, untouched.
    assert peer.seen == [{"authority": f"{networks.b_ip}:{APP_PORT}", "san": [str(GATEWAY)]}]
    (served,) = app.served
    assert served.raw_in == bytes(tls.raw_out)
    assert MARKER not in served.raw_in
    assert served.line == b"hello " + MARKER + b"\n"
    assert f"identity={SERVER}" in log


@pytest.mark.parametrize(
    ("sni", "reason"),
    [
        (f"web.b.svc.{TD}", "bad-sni"),
        (f"outbound_.{APP_PORT}_._.nope.b.svc.{TD}", "unknown-service (no Service b/nope)"),
        (f"outbound_.9999_._.web.b.svc.{TD}", "unknown-port (Service b/web has no port 9999"),
    ],
)
def test_a_name_that_routes_nowhere_is_closed_with_the_reason_logged(
    networks, certs, tmp_path, sni, reason
):
    with (
        _app(networks.b, certs["server"]) as app,
        _gateway(networks, tmp_path, certs["gateway"]) as running,
    ):
        with pytest.raises((ConnectionError, ssl.SSLError, OSError)):
            _call(networks, certs["client"], sni)
        log = running.wait_log(reason)
        assert app.accepted == 0  # nothing reached network B
    line = next(line for line in log.splitlines() if reason in line)
    assert f"sni={sni}" in line
    assert "flags=NR" in line


def test_meshctls_own_node_proxy_in_b_takes_the_gateways_hbone_and_passes_the_client_session_on(
    networks, certs, tmp_path
):
    """The destination is meshctl's node proxy (``ztunnel run``) for the meshed pod in B, not a
    test peer: its inbound sees the gateway's identity; the app behind it the client's."""
    config = write_local_config(
        tmp_path / "local.yaml",
        workloads=[workload("mesh-0", "b", networks.b_ip, sa=SERVER.service_account)],
        services=[],
        policies=[],
    )
    node_proxy = Sidecar(
        networks.b,
        f"b/mesh-0/{SERVER.service_account}",
        certs["server"],
        config,
        log_path=tmp_path / "node-proxy.log",
        group=None,  # no capture rules in B: the gateway dials its 15008 directly
    )
    with (
        _app(networks.b, certs["server"]) as app,
        _gateway(networks, tmp_path, certs["gateway"]),
    ):
        node_proxy.start()
        try:
            sni = f"outbound_.{APP_PORT}_._.mesh.b.svc.{TD}"
            tls, answer = _call(networks, certs["client"], sni)
            _, metrics = http_get(networks.b, 15020, "/stats/prometheus")
        finally:
            node_proxy.stop()
    assert answer == f"peer={CLIENT}\n".encode()
    assert _uri_sans(tls.obj.getpeercert() or {}) == [str(SERVER)]
    (served,) = app.served
    assert served.raw_in == bytes(tls.raw_out)
    assert MARKER not in served.raw_in
    assert served.line == b"hello " + MARKER + b"\n"
    opened = metric_sum(
        metrics,
        "istio_tcp_connections_opened_total",
        reporter="destination",
        source_principal=str(GATEWAY),
        destination_principal=str(SERVER),
    )
    assert opened == 1
    log = node_proxy.log_text(tail=None)
    assert f"src.identity={GATEWAY}" in log
    assert f"dst.hbone_addr={networks.b_ip}:{APP_PORT}" in log
