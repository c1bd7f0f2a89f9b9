"""The rows of ``meshctl stat`` and ``meshctl top``: which proxies to scrape for a scope, and two
scrapes of them turned into one row per Deployment, pod or namespace.

A pod's figures come from its own proxy (sidecar, gateway); an ambient pod's from the node proxy
of its node, by workload (its row says so when other pods of that workload share the node). A
row whose proxies did not answer both scrapes keeps the figures of those that did and names the
others in ``reason``. ``meshed`` counts the pods with a proxy (sidecar, ambient or gateway) among
the running ones. Pure: pods, scrapes and times in, rows out.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal

from meshctl.core.stat.exposition import Snapshot
from meshctl.core.stat.figures import Figures, Proxy, Target, attribute, summary, total
from meshctl.core.stat.pods import MeshPod

Kind = Literal["deploy", "pod", "ns"]
PodKey = tuple[str, str]
Scrape = Mapping[PodKey, Snapshot | str]  # a snapshot, or why there is none


@dataclass(frozen=True, slots=True, kw_only=True)
class Plan:
    """The proxies to scrape: each one's key and what it is; and the node proxy of each node."""

    proxies: Mapping[PodKey, Proxy]
    node_proxy: Mapping[str, PodKey]  # node name -> the node proxy pod serving it
    unseen: str = ""  # why the node proxies could not be listed (none is then no answer)


def plan(pods: Sequence[MeshPod], node_proxies: Sequence[MeshPod], *, unseen: str = "") -> Plan:
    """Every proxy that reports traffic of ``pods``: their sidecars and gateways, and the node
    proxies of the nodes their ambient pods run on."""
    proxies: dict[PodKey, Proxy] = {}
    nodes: dict[str, PodKey] = {}
    for p in node_proxies:
        if p.running and p.node and p.node not in nodes:
            nodes[p.node] = (p.namespace, p.name)
    for p in pods:
        if not p.running:
            continue
        if p.mode in ("sidecar", "gateway"):
            kind: Literal["sidecar", "gateway"] = "sidecar" if p.mode == "sidecar" else "gateway"
            proxies[(p.namespace, p.name)] = Proxy(
                kind=kind, namespace=p.namespace, pod=p.name, workload=p.workload
            )
        elif p.mode == "ambient" and p.node in nodes:
            ns, name = nodes[p.node]
            proxies[nodes[p.node]] = Proxy(kind="node", namespace=ns, pod=name, node=p.node)
    return Plan(proxies=proxies, node_proxy=nodes, unseen=unseen)


def figures(
    plan: Plan, before: Scrape, after: Scrape
) -> tuple[dict[Target, Figures], dict[PodKey, str]]:
    """The window's figures by target, and why each proxy without two scrapes has none."""
    found: dict[Target, Figures] = {}
    missing: dict[PodKey, str] = {}
    for key, proxy in plan.proxies.items():
        first, second = before.get(key, "not scraped"), after.get(key, "not scraped")
        if isinstance(second, str):
            missing[key] = second
            continue
        if isinstance(first, str):
            missing[key] = first
            continue
        for target, part in attribute(proxy, first, second).items():
            found.setdefault(target, Figures()).add(part)
    return found, missing


def _proxy_of(pod: MeshPod, p: Plan) -> PodKey | None:
    if pod.mode in ("sidecar", "gateway"):
        return (pod.namespace, pod.name)
    if pod.mode == "ambient":
        return p.node_proxy.get(pod.node)
    return None


def _reasons(pods: Sequence[MeshPod], p: Plan, missing: Mapping[PodKey, str]) -> list[str]:
    out: list[str] = []
    for pod in pods:
        if not pod.running:
            continue
        key = _proxy_of(pod, p)
        if pod.mode == "ambient" and key is None:
            why = f"pod {pod.name}: " + (
                p.unseen or f"no node proxy runs on node {pod.node or '?'}"
            )
        elif key is not None and key in missing:
            via = "" if key == (pod.namespace, pod.name) else f" (node proxy {key[1]})"
            why = f"pod {pod.name}{via}: {missing[key]}"
        else:
            continue
        if why not in out:
            out.append(why)
    return out


def _row(
    namespace: str,
    name: str,
    pods: Sequence[MeshPod],
    parts: Sequence[Figures],
    window: float,
    reasons: list[str],
) -> dict[str, object]:
    running = [p for p in pods if p.running]
    meshed = sum(1 for p in running if p.mode)
    f = total([Figures(seconds=window), *parts])
    row: dict[str, object] = {
        "namespace": namespace,
        "name": name,
        "meshed": f"{meshed}/{len(running)}",
        "meshedPods": meshed,
        "pods": len(running),
        **summary(f),
    }
    row["reason"] = "; ".join(reasons) if reasons else None
    return row


def rows(
    kind: Kind,
    *,
    pods: Sequence[MeshPod],
    plan: Plan,
    before: Scrape,
    after: Scrape,
    window: float,
    deployments: Sequence[PodKey] = (),
    name: str | None = None,
) -> list[dict[str, object]]:
    """One row per Deployment (``deployments``), pod or namespace of ``pods``; only ``name``'s
    when given. Sorted by namespace and name."""
    found, missing = figures(plan, before, after)
    out: list[dict[str, object]] = []
    if kind == "deploy":
        for ns, deploy in sorted(deployments):
            if name is not None and deploy != name:
                continue
            members = [p for p in pods if p.namespace == ns and p.workload == deploy]
            parts = [f for t, f in found.items() if t.namespace == ns and t.workload == deploy]
            out.append(_row(ns, deploy, members, parts, window, _reasons(members, plan, missing)))
    elif kind == "ns":
        for ns in sorted({p.namespace for p in pods}):
            if name is not None and ns != name:
                continue
            members = [p for p in pods if p.namespace == ns]
            parts = [f for t, f in found.items() if t.namespace == ns]
            out.append(_row(ns, ns, members, parts, window, _reasons(members, plan, missing)))
    else:
        for pod in sorted(pods, key=lambda p: (p.namespace, p.name)):
            if name is not None and pod.name != name:
                continue
            out.append(_pod_row(pod, pods, found, plan, missing, window))
    return out


def _pod_row(
    pod: MeshPod,
    pods: Sequence[MeshPod],
    found: Mapping[Target, Figures],
    p: Plan,
    missing: Mapping[PodKey, str],
    window: float,
) -> dict[str, object]:
    reasons = _reasons([pod], p, missing)
    if pod.mode == "ambient":
        parts = [
            f
            for t, f in found.items()
            if (t.namespace, t.workload, t.node) == (pod.namespace, pod.workload, pod.node)
        ]
        sharing = [
            q
            for q in pods
            if q.running
            and q.mode == "ambient"
            and (q.namespace, q.workload, q.node) == (pod.namespace, pod.workload, pod.node)
        ]
        if len(sharing) > 1:
            reasons.append(
                f"node proxy figures of the {len(sharing)} {pod.workload} pods on {pod.node}"
            )
    else:
        parts = [f for t, f in found.items() if (t.namespace, t.pod) == (pod.namespace, pod.name)]
    return _row(pod.namespace, pod.name, [pod], parts, window, reasons)
