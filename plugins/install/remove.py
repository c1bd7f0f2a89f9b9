"""Uninstall: which objects go, in which order, and waiting until they are gone.

Without ``--purge``: the objects of one revision (by label), and the shared ones once no other
revision's install record needs them, but never the namespace or the CRDs (they hold the CA
secret and users' policies). With ``--purge``: everything meshctl made, in every revision,
listed by label across every resource type the server serves, the namespace and CRDs included.
Invariants: only objects carrying our labels are ever deleted; webhook configurations go first
(no pod is sent to a webhook that is going away), workloads with foreground propagation (gone
means their pods are gone, so the CNI DaemonSet's cleanup on each node has run).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping, Sequence

from meshctl.core.k8s import ambient
from meshctl.core.k8s.install import manifest as mf
from meshctl.core.k8s.install.components import Made, Registry, Values
from meshctl.errors import KubeError
from meshctl.kube import objects
from meshctl.kube.inventory import Inventory

from .apply import NEVER_PRUNED, all_kinds, enabled_by_records

log = logging.getLogger(__name__)

# An object as the cluster returned it (read only: its shape is the server's).
Live = Mapping[str, object]
_FOREGROUND = frozenset({"Deployment", "DaemonSet", "StatefulSet", "ReplicaSet", "Job"})


def targets(inventory: Inventory, registry: Registry, values: Values, *, purge: bool) -> list[Live]:
    """What uninstall deletes, in deletion order."""
    if purge:
        found: list[Live] = []
        selector = f"{mf.MANAGED_BY_LABEL}={mf.MANAGED_BY}"
        for resource in inventory.mapper.listable():
            if resource.kind in ("Event",):
                continue
            try:
                items, _ = objects.list_objects(inventory.kube, resource, label_selector=selector)
            except KubeError as exc:  # an aggregated API that is down holds nothing of ours
                log.info("cannot list %s: %s", resource.plural, exc)
                continue
            found += items
    else:
        kinds = all_kinds(registry, values)
        found = list(inventory.list_labelled(kinds, mf.selector(values.revision)))
        still_needed = enabled_by_records(inventory, values.namespace, exclude=values.revision)
        for live in inventory.list_labelled(kinds, mf.selector(None)):
            if live.get("kind") in NEVER_PRUNED:
                continue
            if mf.component_of(live) not in still_needed:
                found.append(live)
        installed = _installed(inventory, registry, values)
        for component in registry.enabled(installed):
            if component.revisioned or component.name not in still_needed:
                found += _made(inventory, component.made_objects(installed))
    unique = {mf.key_of(o): o for o in found if not _owned_by_another(o)}
    return sorted(unique.values(), key=lambda o: mf.kind_rank(str(o.get("kind"))), reverse=True)


def _installed(inventory: Inventory, registry: Registry, values: Values) -> Values:
    """The values the revision was installed with (its install record), else ``values``: what
    its processes made depends on them (an alias ConfigMap name, for one)."""
    from meshctl.core.k8s.install.upgrade import recorded_values
    from meshctl.kube.resources import CONFIG_MAPS

    name = values.revisioned(mf.RECORD_NAME)
    record = objects.get(inventory.kube, CONFIG_MAPS, name, values.namespace)
    return recorded_values(registry, record) if record else values


def _made(inventory: Inventory, made: Sequence[Made]) -> list[Live]:
    """The objects a component's processes made (e.g. root ConfigMaps under an alias name)."""
    found: list[Live] = []
    for selection in made:
        if not inventory.mapper.served(selection.api_version, selection.kind):
            continue
        resource = inventory.mapper.resource(selection.api_version, selection.kind)
        items, _ = objects.list_objects(
            inventory.kube,
            resource,
            label_selector=selection.label_selector,
            field_selector=selection.field_selector or None,
        )
        found += items
    return found


def _owned_by_another(obj: Live) -> bool:
    """Objects a controller made from ours (an EndpointSlice of our Service): their owner's
    deletion removes them, and deleting them first only makes the controller recreate them."""
    refs = mf.lookup(obj, "metadata", "ownerReferences")
    listed = refs if isinstance(refs, list) else ()
    return any(isinstance(ref, Mapping) and ref.get("controller") for ref in listed)


def stages(items: list[Live]) -> list[list[Live]]:
    """Webhook configurations and workloads first, the rest once those are gone: a control
    plane still draining would recreate the root ConfigMaps deleted beside it."""
    first_rank = mf.kind_rank("DaemonSet")
    early = [o for o in items if mf.kind_rank(str(o.get("kind"))) >= first_rank]
    late = [o for o in items if mf.kind_rank(str(o.get("kind"))) < first_rank]
    return [group for group in (early, late) if group]


def delete(inventory: Inventory, items: list[Live], say: Callable[[str], None]) -> None:
    for obj in items:
        resource = inventory.resource(obj)
        key = mf.key_of(obj)
        namespace = key.namespace or None if resource.namespaced else None
        kind = str(obj.get("kind"))
        gone = objects.delete(
            inventory.kube,
            resource,
            key.name,
            namespace,
            propagation="Foreground" if kind in _FOREGROUND else "Background",
        )
        if gone:
            say(f"deleting {mf.key_of(obj)}")


def left_redirected(inventory: Inventory) -> list[str]:
    """Pods still redirected for ambient on nodes where no node agent runs any more: their
    agent was removed without releasing them (killed, or older than the release on exit), so
    they refuse every connection until restarted."""
    from meshctl.kube.resources import PODS

    pods, _ = objects.list_objects(inventory.kube, PODS)
    served = [str((p.get("spec") or {}).get("nodeName")) for p in pods if ambient.runs_agent(p)]
    return ambient.left_captured(pods, served)
