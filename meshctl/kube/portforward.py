"""A stream to a port on a pod's loopback through the API server's port forwarding, one HTTP
GET over it, and a local port relayed to it (for a client that dials an address: gRPC).

What ``istioctl proxy-config`` does to reach a proxy's admin port (15000 listens on 127.0.0.1
only): ``pods/portforward`` over a websocket, then plain HTTP/1.0 on the forwarded stream.
Invariants: one connection (and one client) per call, closed before returning; every wait has
the timeout; a failure is a one-line ``KubeError`` naming the pod and port.
"""

from __future__ import annotations

import contextlib
import select
import socket
import threading
import time
from collections.abc import Iterator

from meshctl.errors import KubeError
from meshctl.kube.client import Kube


@contextlib.contextmanager
def stream(kube: Kube, namespace: str, pod: str, port: int) -> Iterator[socket.socket]:
    """A stream to ``127.0.0.1:port`` inside the pod (a socket), closed on exit. Raises
    ``KubeError`` when the API server refuses the forwarding."""
    from kubernetes.client import ApiClient, CoreV1Api
    from kubernetes.client.exceptions import ApiException
    from kubernetes.stream import portforward

    where = f"pod {namespace}/{pod} port {port}"
    # A client of its own (same configuration): kubernetes' stream() swaps its client's call_api
    # while it connects, so two forwards at once on one client (verify --proxy checks pods in
    # parallel) could restore each other's websocket transport onto it.
    own = ApiClient(kube.api.configuration)
    try:
        forward = portforward(
            CoreV1Api(own).connect_get_namespaced_pod_portforward,
            pod,
            namespace,
            ports=str(port),
        )
    except (ApiException, OSError, ValueError) as exc:
        own.close()
        raise KubeError(
            f"port-forward to {where}: {exc}",
            hint="port forwarding needs 'create pods/portforward' and a reachable kubelet",
        ) from exc
    try:
        yield forward.socket(port)
        error = forward.error(port)
        if error:
            raise KubeError(f"port-forward to {where}: {error}", hint="is the pod listening?")
    finally:
        with contextlib.suppress(Exception):
            forward.close()
        own.close()


def http_get(
    kube: Kube,
    namespace: str,
    pod: str,
    port: int,
    path: str,
    *,
    timeout: float = 10.0,
    limit: int | None = None,
) -> tuple[int, bytes]:
    """``GET path`` on ``127.0.0.1:port`` inside the pod; the status and the body (with
    ``limit``: reading stops once that many bytes arrived, so a huge answer is cut, not held)."""
    where = f"pod {namespace}/{pod} port {port}"
    data = b""
    try:
        with stream(kube, namespace, pod, port) as sock:
            sock.settimeout(timeout)
            request = f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nAccept: */*\r\n\r\n"
            sock.sendall(request.encode())
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    chunk = sock.recv(65536)
                except TimeoutError:
                    break
                if not chunk:
                    break
                data += chunk
                if limit is not None and len(data) >= limit:
                    data = data[:limit]
                    break
    except OSError as exc:
        raise KubeError(f"port-forward to {where}: {exc}", hint="is the pod running?") from exc
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise KubeError(
            f"{where} answered no HTTP ({len(data)} bytes)", hint="is this the proxy's admin port?"
        ) from None
    return status, body


@contextlib.contextmanager
def local_port(kube: Kube, namespace: str, pod: str, port: int) -> Iterator[int]:
    """A port on 127.0.0.1 whose every connection is relayed to ``port`` inside the pod over
    its own forwarded stream (what ``kubectl port-forward`` does); closed on exit with every
    relay. A connection the API server refuses to forward is closed at once (the client sees
    the connection drop)."""
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(8)
    listener.settimeout(0.2)
    stop = threading.Event()
    relays: list[threading.Thread] = []

    def accept() -> None:
        while not stop.is_set():
            try:
                conn, _ = listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            relay = threading.Thread(target=_relay, args=(conn,), daemon=True)
            relay.start()
            relays.append(relay)

    def _relay(conn: socket.socket) -> None:
        with (
            conn,
            contextlib.suppress(KubeError, OSError),
            stream(kube, namespace, pod, port) as remote,
        ):
            _pump(conn, remote, stop)

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    try:
        yield listener.getsockname()[1]
    finally:
        stop.set()
        listener.close()
        acceptor.join(timeout=2.0)
        for relay in relays:
            relay.join(timeout=2.0)


def _pump(a: socket.socket, b: socket.socket, stop: threading.Event) -> None:
    """Copy bytes both ways until either side closes or ``stop`` is set."""
    peers = {a: b, b: a}
    while not stop.is_set():
        readable, _, _ = select.select(list(peers), [], [], 0.2)
        for sock in readable:
            data = sock.recv(65536)
            if not data:
                return
            peers[sock].sendall(data)
