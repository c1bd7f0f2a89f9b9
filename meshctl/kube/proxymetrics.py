"""The proxies' metrics read through the API server, for ``meshctl stat`` and ``meshctl top``.

Through the ``pods/proxy`` subresource (``GET /api/v1/namespaces/NS/pods/POD:15020/proxy/
stats/prometheus``), not port forwarding: 15020 listens on the pod's address (Prometheus scrapes
it there), so one plain HTTPS GET in the client's own pool does, with no websocket stream and no
thread per forward; port forwarding stays for the loopback-only admin port. Invariants: never
``exec``; at most ``workers`` requests at once, each with ``timeout``; a proxy that does not
answer, refuses or sends no Prometheus text is a reason string in the result, never an exception.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING

from meshctl.core.stat.exposition import MetricsError, Snapshot, parse
from meshctl.errors import KubeError
from meshctl.kube import api, objects
from meshctl.kube.client import Kube
from meshctl.kube.resources import DEPLOYMENTS, PODS

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Pod

METRICS_PORT = 15020
NODE_PROXY_SELECTOR = "app.kubernetes.io/name=meshctl-ztunnel"  # the node proxy's DaemonSet pods

PodKey = tuple[str, str]  # (namespace, name)


def pods(kube: Kube, namespace: str | None) -> list[Pod]:
    """The pods of ``namespace`` (None: of every namespace)."""
    return objects.list_objects(kube, PODS, namespace)[0]


def node_proxies(kube: Kube) -> list[Pod]:
    """The node proxy pods, wherever the mesh is installed."""
    return objects.list_objects(kube, PODS, None, label_selector=NODE_PROXY_SELECTOR)[0]


def deployment_names(kube: Kube, namespace: str | None) -> list[tuple[str, str]]:
    """(namespace, name) of each Deployment of ``namespace`` (None: of every namespace)."""
    found = objects.list_objects(kube, DEPLOYMENTS, namespace)[0]
    out = []
    for item in found:
        meta = item.get("metadata")
        if isinstance(meta, dict):
            out.append((str(meta.get("namespace") or ""), str(meta.get("name") or "")))
    return out


def scrape_one(kube: Kube, key: PodKey, *, timeout: float) -> Snapshot | str:
    """One proxy's metrics now, or why there are none."""
    namespace, name = key
    path = f"/api/v1/namespaces/{namespace}/pods/{name}:{METRICS_PORT}/proxy/stats/prometheus"
    started = time.monotonic()
    try:
        text = api.request_text(kube, path, timeout=timeout)
    except KubeError as exc:
        return _short(exc.message)
    at = (started + time.monotonic()) / 2  # the moment the proxy most likely rendered it
    try:
        return parse(text, at=at)
    except MetricsError as exc:
        return f"its metrics are unreadable: {exc.message}"


def scrape(
    kube: Kube, keys: Sequence[PodKey], *, timeout: float, workers: int = 8
) -> dict[PodKey, Snapshot | str]:
    """Every proxy of ``keys`` scraped, ``workers`` at a time."""
    if not keys:
        return {}
    with ThreadPoolExecutor(max_workers=max(1, min(workers, len(keys)))) as pool:
        answers = pool.map(lambda k: scrape_one(kube, k, timeout=timeout), keys)
        return dict(zip(keys, answers, strict=True))


def _short(message: str) -> str:
    return message if len(message) <= 200 else message[:197] + "..."
