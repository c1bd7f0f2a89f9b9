"""The app probes the kubelet sends to ``:15020/app-health/<container>/<kind>``, run from the pod.

Owns running each prober of ``ISTIO_KUBE_APP_PROBERS`` against the app the way Istio's agent
does: to the pod's own address (or the probe's ``host``), from the inbound passthrough source
127.0.0.6 (which the sidecar capture rules return, besides the proxy's exempt uid/gid), with the
probe's own timeout; HTTP GET over h11 (HTTPS without certificate checks, redirects to the same
host followed up to 10, as the kubelet does), TCP connect, and gRPC ``grpc.health.v1.Health/Check``
over h2 with the protobuf messages of ``meshctl/proto/health.proto``. The answer is 200 when the
app is healthy, 503 when not (or not in time), 404 for a path the injector did not write.
Invariants: a probe never outlives its timeout, its sockets are closed on every path, and no
failure of the app (refusal, reset, garbage) escapes as anything but a 503.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import logging
import socket
import ssl
import struct
from collections.abc import Callable
from typing import TYPE_CHECKING, Any
from urllib.parse import urljoin, urlsplit

from meshctl.core.k8s.appprobes import (
    GRPC_HEALTH_PATH,
    HEALTHY,
    NOT_FOUND,
    UNHEALTHY,
    Grpc,
    HttpGet,
    Prober,
    TcpSocket,
    http_healthy,
)

if TYPE_CHECKING:
    from meshctl.proxy.responder import Response

log = logging.getLogger("meshctl.probes")

MAX_REDIRECTS = 10  # the kubelet's limit
_SCRAPE_TIMEOUT = 5.0  # seconds for the app's metrics (Prometheus' own default is 10 s)
_MAX_METRICS = 32 * 1024 * 1024
_MAX_BODY = 10 * 1024  # what the kubelet reads of a probe's body
_USER_AGENT = "kube-probe/meshctl"  # when the kubelet's request named none
# Close without lingering in TIME-WAIT for a minute per probe (the kubelet's probe dialer).
_LINGER = struct.pack("ii", 1, 1)

NewSocket = Callable[..., socket.socket]


class ProbeFailedError(Exception):
    """The app did not pass the probe; the message says why (it goes into the 503's body)."""


class AppProbes:
    """The probers of one pod and the code that runs them."""

    def __init__(
        self,
        probers: dict[str, Prober],
        *,
        pod_ip: str,
        new_socket: NewSocket,
        app_metrics: tuple[int, str] | None = None,
    ) -> None:
        self.probers = probers
        self.pod_ip = pod_ip
        self.app_metrics = app_metrics
        self._new_socket = new_socket
        self._tls: ssl.SSLContext | None = None  # made on the first HTTPS probe

    async def handle(self, method: str, path: str, headers: dict[str, str]) -> Response:
        """The answer for the kubelet's request to ``path``."""
        prober = self.probers.get(path)
        if prober is None:
            return _text(NOT_FOUND, f"no app probe at {path[:200]}\n")
        if method not in ("GET", "HEAD"):
            return _text(405, "use GET\n")
        agent = headers.get("user-agent") or _USER_AGENT
        try:
            async with asyncio.timeout(prober.timeout):
                detail = await self.run(prober, agent)
        except TimeoutError:
            detail = f"no answer within {prober.timeout:g}s"
            status = UNHEALTHY
        except ProbeFailedError as exc:
            detail, status = str(exc), UNHEALTHY
        except (OSError, ssl.SSLError, EOFError, ValueError) as exc:
            detail, status = _reason(exc), UNHEALTHY
        else:
            status = HEALTHY
        if status != HEALTHY:
            log.info("probe %s failed: %s", path, detail)
        return _text(status, detail + "\n")

    async def app_metrics_text(self) -> bytes:
        """The app's Prometheus text for the merged ``/stats/prometheus`` (b"" without one, or
        when the app does not answer 200 in time: the proxy's own metrics still go out)."""
        if self.app_metrics is None:
            return b""
        port, path = self.app_metrics
        url = f"http://{_join(self.pod_ip or '127.0.0.1', port)}{path}"
        accept = (("Accept", "text/plain;version=0.0.4;q=1,*/*;q=0.1"),)
        try:
            async with asyncio.timeout(_SCRAPE_TIMEOUT):
                status, _, body = await self._get(url, accept, _USER_AGENT, limit=_MAX_METRICS)
        except (OSError, ssl.SSLError, TimeoutError, ProbeFailedError) as exc:
            log.warning("app metrics from %s not merged: %s", url, _reason(exc))
            return b""
        if status != 200:
            log.warning("app metrics from %s not merged: HTTP %d", url, status)
            return b""
        # OpenMetrics' end marker would end the merged text early for Prometheus.
        lines = [line for line in body.splitlines() if line.strip() != b"# EOF"]
        return b"\n".join(lines) + b"\n" if lines else b""

    async def run(self, prober: Prober, agent: str) -> str:
        """Runs ``prober`` once; returns what passed, raises ``ProbeFailedError`` otherwise."""
        action = prober.action
        if isinstance(action, HttpGet):
            return await self._http(action, agent)
        if isinstance(action, TcpSocket):
            sock = await self._connect(action.host or self.pod_ip, action.port)
            sock.close()
            return f"tcp port {action.port} open"
        return await self._grpc(action, agent)

    # -- connections -------------------------------------------------------------------------

    async def _connect(self, host: str, port: int) -> socket.socket:
        """A connected socket to ``host:port`` (a name is resolved first)."""
        loop = asyncio.get_running_loop()
        ip = host or "127.0.0.1"
        try:
            ipaddress.ip_address(ip)
        except ValueError:
            infos = await loop.getaddrinfo(ip, port, type=socket.SOCK_STREAM)
            if not infos:
                raise ProbeFailedError(f"cannot resolve {host}") from None
            ip = str(infos[0][4][0])
        sock = self._new_socket(ip, inbound=True)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER)
            await loop.sock_connect(sock, (ip, port))
        except BaseException:
            sock.close()
            raise
        return sock

    async def _open(
        self, host: str, port: int, *, tls: bool, server_name: str | None
    ) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
        sock = await self._connect(host, port)
        if tls and self._tls is None:
            # No trust store loaded: the kubelet does not verify probe certificates either.
            self._tls = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
            self._tls.check_hostname = False
            self._tls.verify_mode = ssl.CERT_NONE
        try:
            return await asyncio.open_connection(
                sock=sock,
                ssl=self._tls if tls else None,
                server_hostname=server_name if tls else None,
            )
        except BaseException:
            sock.close()
            raise

    # -- HTTP ----------------------------------------------------------------------------------

    async def _http(self, action: HttpGet, agent: str) -> str:
        host = action.host or self.pod_ip or "127.0.0.1"
        scheme = action.scheme.lower()
        url = f"{scheme}://{_join(host, action.port)}{_slash(action.path)}"
        for _ in range(MAX_REDIRECTS + 1):
            status, location, _ = await self._get(url, action.headers, agent)
            if status in (301, 302, 303, 307, 308) and location:
                target = urljoin(url, location)
                if urlsplit(target).hostname != urlsplit(url).hostname:
                    # The kubelet counts a redirect elsewhere as a success (it does not follow).
                    return f"HTTP {status} to another host"
                url = target
                continue
            if http_healthy(status):
                return f"HTTP {status}"
            raise ProbeFailedError(f"HTTP {status} from {urlsplit(url).path}")
        raise ProbeFailedError(f"more than {MAX_REDIRECTS} redirects")

    async def _get(
        self, url: str, extra: tuple[tuple[str, str], ...], agent: str, *, limit: int = 0
    ) -> tuple[int, str, bytes]:
        """One GET on a new connection: the status, any Location header and (up to ``limit``
        bytes) the body. A reply that is not HTTP is a ``ProbeFailedError``."""
        # Imported on the first HTTP probe: the data plane's start (and restart) stays lean.
        import h11

        try:
            return await self._exchange(h11, url, extra, agent, limit)
        except h11.ProtocolError as exc:
            raise ProbeFailedError(f"not an HTTP answer: {exc}") from None

    async def _exchange(
        self, h11: Any, url: str, extra: tuple[tuple[str, str], ...], agent: str, limit: int
    ) -> tuple[int, str, bytes]:
        parts = urlsplit(url)
        port = parts.port or (443 if parts.scheme == "https" else 80)
        host = parts.hostname or ""
        names = {name.lower() for name, _ in extra}
        headers = [(name, value) for name, value in extra if name.lower() != "host"]
        given_host = next((v for n, v in extra if n.lower() == "host"), None)
        headers.insert(0, ("Host", given_host or _join(host, port)))
        if "user-agent" not in names:
            headers.append(("User-Agent", agent))
        if "accept" not in names:
            headers.append(("Accept", "*/*"))
        headers.append(("Connection", "close"))
        target = parts.path or "/"
        if parts.query:
            target += "?" + parts.query
        reader, writer = await self._open(
            host, port, tls=parts.scheme == "https", server_name=given_host or host
        )
        try:
            conn = h11.Connection(h11.CLIENT)
            request = h11.Request(method="GET", target=target, headers=headers)
            writer.write(conn.send(request) + conn.send(h11.EndOfMessage()))
            await writer.drain()
            response: Any = None
            body = bytearray()
            while True:
                event = conn.next_event()
                if event is h11.NEED_DATA:
                    data = await reader.read(_MAX_BODY)
                    conn.receive_data(data)
                    continue
                if isinstance(event, h11.Response):
                    response = event
                    if not limit:
                        break
                elif isinstance(event, h11.Data):
                    body += event.data
                    if len(body) > limit:
                        raise ProbeFailedError(f"body larger than {limit} bytes")
                elif isinstance(event, h11.EndOfMessage | h11.ConnectionClosed):
                    break
            if response is None:
                raise ProbeFailedError("connection closed before a response")
            location = next((v for n, v in response.headers if n == b"location"), b"")
            return response.status_code, location.decode("latin-1"), bytes(body)
        finally:
            writer.close()
            with contextlib.suppress(OSError, ssl.SSLError):
                await writer.wait_closed()

    # -- gRPC ----------------------------------------------------------------------------------

    async def _grpc(self, action: Grpc, agent: str) -> str:
        """``grpc.health.v1.Health/Check`` over HTTP/2 without TLS (the kubelet's gRPC probe)."""
        import h2.config
        import h2.connection
        import h2.events

        from meshctl.proto import health_pb2

        host = self.pod_ip or "127.0.0.1"
        reader, writer = await self._open(host, action.port, tls=False, server_name=None)
        try:
            conn = h2.connection.H2Connection(
                h2.config.H2Configuration(client_side=True, header_encoding=None)
            )
            conn.initiate_connection()
            conn.send_headers(
                1,
                [
                    (b":method", b"POST"),
                    (b":scheme", b"http"),
                    (b":path", GRPC_HEALTH_PATH.encode()),
                    (b":authority", _join(host, action.port).encode()),
                    (b"content-type", b"application/grpc"),
                    (b"te", b"trailers"),
                    (b"user-agent", agent.encode("latin-1", "replace")),
                ],
            )
            message = health_pb2.HealthCheckRequest(service=action.service).SerializeToString()
            # gRPC's length-prefixed message: not compressed, 4-byte big-endian length.
            conn.send_data(1, b"\0" + len(message).to_bytes(4, "big") + message, end_stream=True)
            writer.write(conn.data_to_send())
            await writer.drain()
            body = bytearray()
            grpc_status: bytes | None = None
            grpc_message = b""
            while True:
                data = await reader.read(65536)
                if not data:
                    raise ProbeFailedError("gRPC connection closed before the answer")
                for event in conn.receive_data(data):
                    if isinstance(event, h2.events.ResponseReceived | h2.events.TrailersReceived):
                        fields = dict(event.headers)
                        if (status := fields.get(b":status")) not in (None, b"200"):
                            raise ProbeFailedError(f"gRPC answered HTTP {status!r}")
                        if b"grpc-status" in fields:
                            grpc_status = fields[b"grpc-status"]
                            grpc_message = fields.get(b"grpc-message", b"")
                    elif isinstance(event, h2.events.DataReceived):
                        body += event.data
                        conn.acknowledge_received_data(event.flow_controlled_length, 1)
                    elif isinstance(event, h2.events.StreamReset):
                        raise ProbeFailedError(f"gRPC stream reset ({event.error_code!r})")
                    elif isinstance(event, h2.events.ConnectionTerminated):
                        raise ProbeFailedError(f"gRPC connection closed ({event.error_code!r})")
                    elif isinstance(event, h2.events.StreamEnded):
                        return _health(grpc_status, grpc_message, bytes(body))
                writer.write(conn.data_to_send())
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()


def _health(status: bytes | None, message: bytes, body: bytes) -> str:
    """The outcome of a finished Check call: SERVING passes, anything else fails."""
    from meshctl.proto import health_pb2

    if status is None:
        raise ProbeFailedError("gRPC answer without grpc-status")
    if status != b"0":
        raise ProbeFailedError(
            f"gRPC status {status.decode('latin-1')}: {message.decode('latin-1')[:200]}"
        )
    if len(body) < 5 or body[0] != 0 or int.from_bytes(body[1:5], "big") != len(body) - 5:
        raise ProbeFailedError("gRPC answer is not one uncompressed message")
    response = health_pb2.HealthCheckResponse.FromString(body[5:])
    name = health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)
    if name != "SERVING":
        raise ProbeFailedError(f"gRPC health {name}")
    return "gRPC health SERVING"


def _text(status: int, body: str) -> Response:
    return status, "text/plain; charset=utf-8", body.encode()


def _join(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _slash(path: str) -> str:
    return path if path.startswith("/") else "/" + path


def _reason(exc: BaseException) -> str:
    if isinstance(exc, ConnectionRefusedError):
        return "connection refused"
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror.lower()
    return f"{type(exc).__name__}: {exc}"[:200]
