"""A foreign mutating webhook that intercepts the pods meshctl injects (MSH0401): Istio's own
``istio-sidecar-injector`` left behind, a second injector, anything that mutates the same pod
creations and may add its own proxy or fight over the pod spec.

A webhook configuration is foreign when it is not labelled ``app.kubernetes.io/name=meshctl``.
One of its webhooks intercepts a pod when a rule covers pod CREATE (``operations`` CREATE or *,
``resources`` pods or *, ``apiGroups`` "" or *) and its namespace and object selectors match.
The pods probed are every pod and pod template in the snapshot, and one pod without labels in
every namespace (what a new ``kubectl run`` would be); a probe counts when a meshctl webhook
selects it too.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from meshctl.core.k8s.inject.pipeline import IGNORED_NAMESPACES

from . import codes, selectors
from .findings import Finding
from .installation import installation, is_meshctl_webhook
from .snapshot import Snapshot, mapping, sequence

_SHOWN = 3  # namespaces named in a message


def check(snapshot: Snapshot) -> Iterator[Finding]:
    ours = installation(snapshot).injection_webhooks()
    namespaces = snapshot.namespaces()
    probes: list[tuple[str, Mapping[str, str]]] = [(ns, {}) for ns in namespaces]
    probes += [(w.namespace, w.labels) for w in snapshot.workloads()]
    probes = [(ns, labels) for ns, labels in probes if ns not in IGNORED_NAMESPACES]
    for config in snapshot.of_kind("MutatingWebhookConfiguration"):
        if is_meshctl_webhook(config):
            continue
        hooks = [h for h in sequence(config.obj.get("webhooks")) if _intercepts_pods(h)]
        shared: dict[str, set[str]] = {}
        for ns, labels in probes:
            ns_labels = namespaces.get(ns, {})
            for hook in hooks:
                if _matches(hook, ns_labels, labels) and any(
                    _matches(h, ns_labels, labels)
                    for c in ours
                    for h in sequence(c.get("webhooks"))
                ):
                    shared.setdefault(ns, set()).add(str(mapping(hook).get("name", "?")))
        if not shared:
            continue
        names = sorted(shared)
        shown = ", ".join(names[:_SHOWN]) + (
            f" and {len(names) - _SHOWN} more" if len(names) > _SHOWN else ""
        )
        hooks_named = ", ".join(sorted({h for s in shared.values() for h in s}))
        yield Finding(
            codes.FOREIGN_INJECTION_WEBHOOK,
            config.subject,
            f"Its webhook {hooks_named} intercepts the pods meshctl injects in namespace "
            f"{shown}: each new pod is mutated by both (two proxies, or specs that fight)",
            f"remove the other injector (kubectl delete mutatingwebhookconfiguration "
            f"{config.name}) or narrow its namespaceSelector/objectSelector so that it selects "
            "none of meshctl's namespaces",
            tuple(names),
        )


def _intercepts_pods(hook: Any) -> bool:
    for entry in sequence(mapping(hook).get("rules")):
        rule = mapping(entry)
        groups = sequence(rule.get("apiGroups"))
        operations = sequence(rule.get("operations"))
        resources = sequence(rule.get("resources"))
        if (
            ("" in groups or "*" in groups)
            and ("CREATE" in operations or "*" in operations)
            and ("pods" in resources or "*" in resources or "*/*" in resources)
        ):
            return True
    return False


def _matches(hook: Any, ns_labels: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    hook = mapping(hook)
    return selectors.holds(hook.get("namespaceSelector"), ns_labels) and selectors.holds(
        hook.get("objectSelector"), labels
    )
