"""One HTTP GET to a port on a pod's loopback, through the API server's port forwarding.

What ``istioctl proxy-config`` does to reach a proxy's admin port (15000 listens on 127.0.0.1
only): ``pods/portforward`` over a websocket, then plain HTTP/1.0 on the forwarded stream.
Invariants: one connection per call, closed before returning; every wait has the timeout; a
failure is a one-line ``KubeError`` naming the pod and port.
"""

from __future__ import annotations

import contextlib
import time

from meshctl.errors import KubeError
from meshctl.kube.client import Kube


def http_get(
    kube: Kube, namespace: str, pod: str, port: int, path: str, *, timeout: float = 10.0
) -> tuple[int, bytes]:
    """``GET path`` on ``127.0.0.1:port`` inside the pod; the status and the body."""
    from kubernetes.client import CoreV1Api
    from kubernetes.client.exceptions import ApiException
    from kubernetes.stream import portforward

    where = f"pod {namespace}/{pod} port {port}"
    try:
        forward = portforward(
            CoreV1Api(kube.api).connect_get_namespaced_pod_portforward,
            pod,
            namespace,
            ports=str(port),
        )
    except (ApiException, OSError, ValueError) as exc:
        raise KubeError(
            f"port-forward to {where}: {exc}",
            hint="port forwarding needs 'create pods/portforward' and a reachable kubelet",
        ) from exc
    try:
        stream = forward.socket(port)
        stream.settimeout(timeout)
        request = f"GET {path} HTTP/1.0\r\nHost: 127.0.0.1:{port}\r\nAccept: */*\r\n\r\n"
        stream.sendall(request.encode())
        data = b""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            try:
                chunk = stream.recv(65536)
            except TimeoutError:
                break
            if not chunk:
                break
            data += chunk
        error = forward.error(port)
        if error:
            raise KubeError(f"port-forward to {where}: {error}", hint="is the proxy listening?")
    except OSError as exc:
        raise KubeError(f"port-forward to {where}: {exc}", hint="is the pod running?") from exc
    finally:
        with contextlib.suppress(Exception):
            forward.close()
    head, _, body = data.partition(b"\r\n\r\n")
    try:
        status = int(head.split(b" ", 2)[1])
    except (IndexError, ValueError):
        raise KubeError(
            f"{where} answered no HTTP ({len(data)} bytes)", hint="is this the proxy's admin port?"
        ) from None
    return status, body
