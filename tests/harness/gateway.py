"""The standalone gateway under test: Kubernetes objects written to a file, ``meshctl gateway
run -f`` started on loopback with a port offset, and a tiny HTTP/1.1 backend that echoes what
it received (method, target, headers, body) so tests check what the gateway forwarded."""

from __future__ import annotations

import base64
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import yaml

GROUP = "gateway.networking.k8s.io/v1"
OWN_PORTS = (15000, 15020, 15021)
# The smallest configuration with a route: for tests that need a valid -f file.
MINIMAL = """\
apiVersion: gateway.networking.k8s.io/v1
kind: GatewayClass
metadata: {name: meshctl}
spec: {controllerName: meshctl.io/gateway-controller}
---
apiVersion: gateway.networking.k8s.io/v1
kind: Gateway
metadata: {name: gw, namespace: a}
spec: {gatewayClassName: meshctl, listeners: [{name: http, port: 80, protocol: HTTP}]}
---
apiVersion: gateway.networking.k8s.io/v1
kind: HTTPRoute
metadata: {name: web, namespace: a}
spec:
  parentRefs: [{name: gw}]
  rules: [{backendRefs: [{name: web, port: 80}]}]
---
apiVersion: v1
kind: Service
metadata: {name: web, namespace: a}
spec: {ports: [{port: 80}]}
"""


def gateway_class() -> dict[str, Any]:
    return {
        "apiVersion": GROUP,
        "kind": "GatewayClass",
        "metadata": {"name": "meshctl"},
        "spec": {"controllerName": "meshctl.io/gateway-controller"},
    }


def gateway(
    *listeners: dict[str, Any], name: str = "gw", namespace: str = "infra"
) -> dict[str, Any]:
    return {
        "apiVersion": GROUP,
        "kind": "Gateway",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"gatewayClassName": "meshctl", "listeners": list(listeners)},
    }


def http_listener(name: str = "http", port: int = 80, **extra: Any) -> dict[str, Any]:
    return {
        "name": name,
        "port": port,
        "protocol": "HTTP",
        "allowedRoutes": {"namespaces": {"from": "All"}},
        **extra,
    }


def https_listener(name: str, hostname: str, secret: str, port: int = 443) -> dict[str, Any]:
    return {
        "name": name,
        "port": port,
        "protocol": "HTTPS",
        "hostname": hostname,
        "tls": {"mode": "Terminate", "certificateRefs": [{"name": secret}]},
        "allowedRoutes": {"namespaces": {"from": "All"}},
    }


def route(
    name: str,
    rules: Sequence[dict[str, Any]],
    hostnames: Sequence[str] = (),
    namespace: str = "app",
) -> dict[str, Any]:
    spec: dict[str, Any] = {
        "parentRefs": [{"name": "gw", "namespace": "infra"}],
        "rules": list(rules),
    }
    if hostnames:
        spec["hostnames"] = list(hostnames)
    return {
        "apiVersion": GROUP,
        "kind": "HTTPRoute",
        "metadata": {
            "name": name,
            "namespace": namespace,
            "creationTimestamp": "2026-01-01T00:00:00Z",
        },
        "spec": spec,
    }


def rule(path: str = "/", *backends: str, **extra: Any) -> dict[str, Any]:
    """A PathPrefix rule to ``backends`` ("name:port")."""
    out: dict[str, Any] = {"matches": [{"path": {"type": "PathPrefix", "value": path}}], **extra}
    out["backendRefs"] = [{"name": b.split(":")[0], "port": int(b.split(":")[1])} for b in backends]
    return out


def service(name: str, ports: Sequence[int] = (80,), namespace: str = "app") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": name, "namespace": namespace},
        "spec": {
            "selector": {"app": name},
            "ports": [{"name": f"p{p}", "port": p, "targetPort": 8080} for p in ports],
        },
    }


def endpoint_slice(
    service_name: str,
    endpoints: Sequence[tuple[str, bool]],
    port: int,
    service_port: int = 80,
    namespace: str = "app",
) -> dict[str, Any]:
    """A slice of ``service_name`` with (address, ready) endpoints listening on ``port``."""
    return {
        "apiVersion": "discovery.k8s.io/v1",
        "kind": "EndpointSlice",
        "metadata": {
            "name": f"{service_name}-{port}",
            "namespace": namespace,
            "labels": {"kubernetes.io/service-name": service_name},
        },
        "addressType": "IPv4",
        "ports": [{"name": f"p{service_port}", "port": port}],
        "endpoints": [
            {"addresses": [address], "conditions": {"ready": ready}} for address, ready in endpoints
        ],
    }


def tls_secret(name: str, chain: bytes, key: bytes, namespace: str = "infra") -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": {"name": name, "namespace": namespace},
        "type": "kubernetes.io/tls",
        "data": {
            "tls.crt": base64.b64encode(chain).decode(),
            "tls.key": base64.b64encode(key).decode(),
        },
    }


def write_objects(path: Path, objects: Sequence[dict[str, Any]]) -> None:
    """Written to a temporary name and renamed: the running gateway never reads half a file."""
    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump_all(objects))
    tmp.replace(path)


# --- the backend -------------------------------------------------------------------------------


class _Echo(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:  # noqa: A002 (the stdlib's name)
        pass

    def _body(self) -> bytes:
        if self.headers.get("transfer-encoding", "").lower() == "chunked":
            out = b""
            while True:
                size = int(self.rfile.readline().strip().split(b";")[0], 16)
                if size == 0:
                    self.rfile.readline()
                    return out
                out += self.rfile.read(size)
                self.rfile.readline()
        length = int(self.headers.get("content-length") or 0)
        return self.rfile.read(length) if length else b""

    def _answer(self) -> None:
        body = self._body()
        self.server.seen.append(self.path)  # type: ignore[attr-defined]
        if "/big/" in self.path:
            size = int(self.path.rsplit("/", 1)[1])
            payload = bytes(i % 251 for i in range(size))
            self.send_response(200)
            self.send_header("content-length", str(size))
            self.end_headers()
            self.wfile.write(payload)
            return
        if "/closing" in self.path:  # HTTP/1.0 style: no length, the close ends the body
            self.close_connection = True
            self.wfile.write(b"HTTP/1.1 200 OK\r\nconnection: close\r\n\r\nuntil the close")
            return
        if "/oneshot" in self.path:  # the whole response in one write (one segment)
            self.wfile.write(b"HTTP/1.1 200 OK\r\ncontent-length: 7\r\n\r\noneshot")
            return
        if "/chunked/" in self.path:
            parts = int(self.path.rsplit("/", 1)[1])
            self.send_response(200)
            self.send_header("transfer-encoding", "chunked")
            self.end_headers()
            for i in range(parts):
                chunk = f"part {i};".encode()
                self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                self.wfile.flush()
            self.wfile.write(b"0\r\n\r\n")
            return
        if "/slow/" in self.path:
            time.sleep(float(self.path.rsplit("/", 1)[1]))
        echo = {
            "server": self.server.name,  # type: ignore[attr-defined]
            "method": self.command,
            "path": self.path,
            "headers": [[k.lower(), v] for k, v in self.headers.items()],
            "body": base64.b64encode(body).decode(),
        }
        data = json.dumps(echo).encode()
        self.send_response(200)
        self.send_header("content-type", "application/json")
        self.send_header("x-backend", self.server.name)  # type: ignore[attr-defined]
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    do_GET = do_POST = do_PUT = do_HEAD = do_DELETE = _answer  # noqa: N815 (the stdlib's names)


@dataclass
class Backend:
    name: str
    server: ThreadingHTTPServer
    seen: list[str] = field(default_factory=list)

    @property
    def port(self) -> int:
        return int(self.server.server_address[1])


@contextlib.contextmanager
def backend(name: str = "web") -> Iterator[Backend]:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Echo)
    server.daemon_threads = True
    server.name = name  # type: ignore[attr-defined]
    server.seen = []  # type: ignore[attr-defined]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield Backend(name, server, server.seen)  # type: ignore[attr-defined]
    finally:
        server.shutdown()
        server.server_close()


# --- the gateway -------------------------------------------------------------------------------


def _free(port: int) -> bool:
    with socket.socket() as sock:
        try:
            sock.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_offset(listener_ports: Sequence[int]) -> int:
    """An offset under which every port the gateway binds is free on loopback now."""
    for _ in range(200):
        offset = random.randrange(20000, 45000)  # noqa: S311 (not a secret)
        if all(_free(p + offset) for p in (*listener_ports, *OWN_PORTS)):
            return offset
    raise RuntimeError("no free port offset")


@dataclass
class Running:
    proc: subprocess.Popen[str]
    offset: int
    config: Path
    log: Path

    def port(self, listener_port: int) -> int:
        return listener_port + self.offset

    def output(self) -> str:
        return self.log.read_text()

    def wait_log(self, text: str, timeout: float = 10.0) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            out = self.output()
            if text in out:
                return out
            time.sleep(0.05)
        raise AssertionError(f"{text!r} not in the gateway's log:\n{self.output()}")


def metric(running: Running, name: str, **labels: str) -> float:
    """The sum of ``name``'s samples whose labels include ``labels`` (0 when none), from the
    gateway's Prometheus endpoint."""
    import http.client

    conn = http.client.HTTPConnection("127.0.0.1", 15020 + running.offset, timeout=5)
    conn.request("GET", "/stats/prometheus")
    text = conn.getresponse().read().decode()
    wanted = [f'{k}="{v}"' for k, v in labels.items()]
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name + "{") and all(w in line for w in wanted):
            total += float(line.rsplit(" ", 1)[1])
    return total


def wait_ready(port: int, proc: subprocess.Popen[str], log: Path, timeout: float = 20.0) -> None:
    import http.client

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"gateway exited {proc.returncode}:\n{log.read_text()}")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=1)
            conn.request("GET", "/healthz/ready")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.1)
    raise AssertionError(f"gateway not ready:\n{log.read_text()}")


@contextlib.contextmanager
def run_gateway(
    tmp: Path,
    objects: Sequence[dict[str, Any]],
    *,
    listener_ports: Sequence[int] = (80, 443),
    args: Sequence[str] = (),
    env: dict[str, str] | None = None,
) -> Iterator[Running]:
    config = tmp / "gateway.yaml"
    write_objects(config, objects)
    offset = free_offset(listener_ports)
    log = tmp / "gateway.log"
    with log.open("w") as out:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "meshctl",
                "gateway",
                "run",
                "-f",
                str(config),
                "--bind-address",
                "127.0.0.1",
                "--port-offset",
                str(offset),
                "--reload-interval",
                "100ms",
                *args,
            ],
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env={**os.environ, "HOME": str(tmp), **(env or {})},
        )
    try:
        wait_ready(15021 + offset, proc, log)
        yield Running(proc, offset, config, log)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


# --- certificates ------------------------------------------------------------------------------


def server_cert(*names: str, label: str = "") -> tuple[bytes, bytes]:
    """A self-signed server certificate for ``names`` (DNS SANs): (chain PEM, key PEM). ``label``
    goes into the subject's organisation, so tests tell two certificates for one name apart."""
    from datetime import UTC, datetime, timedelta

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name(
        [
            x509.NameAttribute(NameOID.COMMON_NAME, names[0]),
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, label or names[0]),
        ]
    )
    now = datetime.now(UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.SubjectAlternativeName([x509.DNSName(n) for n in names]), False)
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


def peer_organisation(der: bytes) -> str:
    from cryptography import x509
    from cryptography.x509.oid import NameOID

    cert = x509.load_der_x509_certificate(der)
    return str(cert.subject.get_attributes_for_oid(NameOID.ORGANIZATION_NAME)[0].value)


# --- an HBONE peer ------------------------------------------------------------------------------


@dataclass
class HbonePeer:
    """A meshed workload's port 15008, as the tests need it: mTLS (TLS 1.3, ALPN h2, client
    certificate required), CONNECT streams relayed to ``target`` on 127.0.0.1; it records each
    CONNECT's authority and the client's URI SANs."""

    address: str
    seen: list[dict[str, Any]] = field(default_factory=list)


class _HboneServer:
    """The peer's connections: each CONNECT stream relayed to the target port."""

    def __init__(self, peer: HbonePeer, target: int) -> None:
        self.peer, self.target = peer, target
        self.tasks: set[Any] = set()

    async def client(self, reader: Any, writer: Any) -> None:
        import asyncio

        import h2.config
        import h2.connection
        import h2.events

        peercert = writer.get_extra_info("peercert")
        sans = [v for k, v in peercert.get("subjectAltName", ()) if k == "URI"]
        conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        conn.initiate_connection()
        writer.write(conn.data_to_send())
        upstreams: dict[int, Any] = {}

        window = asyncio.Event()

        async def pump(sid: int, up: asyncio.StreamReader) -> None:
            while data := await up.read(65536):
                while data:  # within the gateway's flow-control windows
                    room = min(conn.local_flow_control_window(sid), conn.max_outbound_frame_size)
                    if room <= 0:
                        window.clear()
                        await window.wait()
                        continue
                    conn.send_data(sid, data[:room])
                    data = data[room:]
                    writer.write(conn.data_to_send())
            conn.end_stream(sid)
            writer.write(conn.data_to_send())

        while data := await reader.read(65536):
            for event in conn.receive_data(data):
                if isinstance(event, h2.events.RequestReceived):
                    headers = dict(event.headers)
                    authority = headers[b":authority"].decode()
                    self.peer.seen.append({"authority": authority, "san": sans})
                    up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.target)
                    upstreams[event.stream_id] = up_writer
                    conn.send_headers(event.stream_id, [(":status", "200")])
                    task = asyncio.ensure_future(pump(event.stream_id, up_reader))
                    self.tasks.add(task)
                    task.add_done_callback(self.tasks.discard)
                elif isinstance(event, h2.events.DataReceived):
                    upstreams[event.stream_id].write(event.data)
                    conn.acknowledge_received_data(event.flow_controlled_length, event.stream_id)
                elif isinstance(event, h2.events.WindowUpdated | h2.events.RemoteSettingsChanged):
                    window.set()
                elif isinstance(event, h2.events.StreamReset):
                    up = upstreams.pop(event.stream_id, None)
                    if up is not None:
                        up.close()
            writer.write(conn.data_to_send())
        writer.close()


@contextlib.contextmanager
def hbone_peer(
    cert_dir: Path, target: int, *, netns: str | None = None, address: str = ""
) -> Iterator[HbonePeer]:
    """The peer on ``address`` (a random loopback one by default); with ``netns`` its thread
    runs inside that namespace, so it listens and relays to ``target`` there."""
    import asyncio
    import ssl

    address = address or f"127.0.{random.randrange(1, 250)}.{random.randrange(2, 250)}"  # noqa: S311
    peer = HbonePeer(address)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    ctx.load_cert_chain(cert_dir / "cert-chain.pem", cert_dir / "key.pem")
    ctx.load_verify_locations(cert_dir / "root-cert.pem")
    ctx.verify_mode = ssl.CERT_REQUIRED
    ctx.set_alpn_protocols(["h2"])
    loop = asyncio.new_event_loop()
    started = threading.Event()
    handler = _HboneServer(peer, target)

    async def serve() -> None:
        server = await asyncio.start_server(handler.client, address, 15008, ssl=ctx)
        started.set()
        async with server:
            await server.serve_forever()

    task = loop.create_task(serve())

    def run() -> None:
        if netns is not None:
            from pyroute2 import netns as namespaces

            # setns(2) moves this thread only (no pushns: its saved stack is process-wide)
            namespaces.setns(netns, flags=0)
        with contextlib.suppress(asyncio.CancelledError):
            loop.run_until_complete(task)

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    assert started.wait(10)
    try:
        yield peer
    finally:
        loop.call_soon_threadsafe(task.cancel)
        thread.join(10)
