"""One window of ``meshctl stat``/``top``: list the pods of the scope, scrape their proxies
twice, and hand the pure core the rest.

Gateways of every namespace are scraped too: a gateway reports its requests to backends
wherever those run. Invariant: only reads (lists, and ``pods/proxy`` GETs through the API
server); a proxy that does not answer becomes a row's reason (``meshctl.core.stat.rows``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass

from meshctl.core.k8s.gatewaypod import GATEWAY_NAME_LABEL
from meshctl.core.stat.pods import INGRESS_SELECTOR, MeshPod, mesh_pod
from meshctl.core.stat.rows import Plan, PodKey, Scrape, plan
from meshctl.errors import KubeError
from meshctl.kube import objects, proxymetrics
from meshctl.kube.client import Kube
from meshctl.kube.resources import PODS

SCRAPE_TIMEOUT = 10.0  # seconds, at most, for one proxy (--request-timeout if shorter)
WORKERS = 8  # proxies scraped at once


@dataclass(frozen=True, slots=True, kw_only=True)
class Scope:
    namespace: str | None  # None: every namespace
    pods: list[MeshPod]
    plan: Plan


def scope(kube: Kube, namespace: str | None) -> Scope:
    """The pods of ``namespace`` and every proxy that reports their traffic."""
    pods = [mesh_pod(p) for p in proxymetrics.pods(kube, namespace)]
    # Cluster-wide reads: an identity allowed one namespace only still gets its own pods' rows
    # (the gateways elsewhere are then missing, and ambient pods say why they have no figures).
    unseen = ""
    try:
        gateways = [
            mesh_pod(p)
            for selector in (GATEWAY_NAME_LABEL, INGRESS_SELECTOR)
            for p in objects.list_objects(kube, PODS, None, label_selector=selector)[0]
        ]
    except KubeError:
        gateways = []
    try:
        nodes = [mesh_pod(p) for p in proxymetrics.node_proxies(kube)]
    except KubeError as exc:
        nodes, unseen = [], f"cannot list the node proxies: {exc.message}"
    return Scope(
        namespace=namespace, pods=pods, plan=plan([*pods, *gateways], nodes, unseen=unseen)
    )


def timeout(kube: Kube) -> float:
    return min(kube.request_timeout, SCRAPE_TIMEOUT) if kube.request_timeout else SCRAPE_TIMEOUT


def scrape(kube: Kube, where: Scope, keys: list[PodKey] | None = None) -> Scrape:
    chosen = list(where.plan.proxies) if keys is None else keys
    return proxymetrics.scrape(kube, chosen, timeout=timeout(kube), workers=WORKERS)


def window(
    kube: Kube, where: Scope, seconds: float, *, started: Callable[[int], None] | None = None
) -> tuple[Scrape, Scrape, float]:
    """Both scrapes of a window of ``seconds`` and its measured length."""
    before = scrape(kube, where)
    begin = time.monotonic()
    if started is not None:
        started(len(before))
    time.sleep(seconds)
    after = scrape(kube, where)
    return before, after, time.monotonic() - begin
