"""A stream to a port on a pod's loopback through the API server's port forwarding, and one
HTTP GET over it.

What ``istioctl proxy-config`` does to reach a proxy's admin port (15000 listens on 127.0.0.1
only): ``pods/portforward`` over a websocket, then plain HTTP/1.0 on the forwarded stream.
Invariants: one connection (and one client) per call, closed before returning; every wait has
the timeout; a failure is a one-line ``KubeError`` naming the pod and port.
"""

from __future__ import annotations

import contextlib
import socket
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
