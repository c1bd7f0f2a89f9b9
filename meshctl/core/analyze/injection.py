"""Checks on what namespaces and pods ask of the mesh: injection or ambient labels with nothing
installed to serve them (MSH0201-MSH0203), pods the webhook should have injected running without
a sidecar (MSH0204), namespaces with workloads and no word on the mesh (MSH0206), and
conflicting revision labels and claims (MSH0301-MSH0303).

Which pods must carry a sidecar is decided as the webhook decides it: a meshctl webhook's
namespace and object selectors match the pod (``selectors.holds``), and the injector would not
skip it (hostNetwork, ``sidecar.istio.io/inject=false`` label or annotation, a system namespace:
``inject.pipeline.skip_reason``). Finished pods (Succeeded, Failed), pods without a status (a
manifest in a file, not created yet: the webhook will see it) and anything being deleted are left
alone.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

from meshctl.core.k8s import layout
from meshctl.core.k8s.ambient import DATAPLANE_MODE
from meshctl.core.k8s.inject.errors import InjectError
from meshctl.core.k8s.inject.pipeline import IGNORED_NAMESPACES, skip_reason
from meshctl.core.k8s.inject.webhook_config import ISTIO_NAMESPACE_LABEL, NAMESPACE_LABEL

from . import codes, selectors
from .findings import Finding
from .installation import (
    MANAGED_BY_LABEL,
    MESHCTL,
    PART_OF_LABEL,
    REVISION_LABEL,
    Installation,
    installation,
    wanted,
)
from .snapshot import Item, Snapshot, field, has_sidecar, mapping, sequence

DEFAULT = layout.DEFAULT_REVISION
# Any of these on a namespace is a decision about the mesh, enabled or not.
MESH_LABELS = (NAMESPACE_LABEL, ISTIO_NAMESPACE_LABEL, REVISION_LABEL, DATAPLANE_MODE)
EXISTING = ("Pending", "Running", "Unknown")  # the phases of a pod that exists and is not done


def check(snapshot: Snapshot) -> Iterator[Finding]:
    mesh = installation(snapshot)
    namespaces = snapshot.namespaces()
    unmeshed = _unmeshed_namespaces(snapshot, mesh)
    for item in snapshot.of_kind("Namespace"):
        # a namespace being deleted takes its problems with it
        if item.name not in IGNORED_NAMESPACES and not _deleting(item):
            yield from _namespace(item, mesh)
            if item.name in unmeshed:
                yield _not_meshed(item)
    yield from _default_claims(mesh)
    webhooks = mesh.injection_webhooks()
    for pod in snapshot.of_kind("Pod"):
        labels = namespaces.get(pod.namespace, {})
        finding = _pod(pod, labels, webhooks, mesh)
        if finding is not None:
            yield finding


def _namespace(item: Item, mesh: Installation) -> Iterator[Finding]:
    want = wanted(item.labels)
    ns = (item.name,)
    if want.revision == DEFAULT and not mesh.serves(DEFAULT):
        asked = want.injection_label or f"{REVISION_LABEL}={DEFAULT}"
        yield Finding(
            codes.INJECTION_WITHOUT_CONTROL_PLANE,
            item.subject,
            f"The namespace is labelled {asked} but no control plane serves the default "
            f"revision{_installed(mesh)}: its new pods get no sidecar (or are refused while the "
            "webhook has no control plane behind it)",
            "install the mesh ('meshctl install'), or remove the label "
            f"(kubectl label namespace {item.name} {asked.split('=')[0]}-)",
            ns,
        )
    elif want.revision is not None and want.revision != DEFAULT and not mesh.serves(want.revision):
        yield Finding(
            codes.REVISION_NOT_INSTALLED,
            item.subject,
            f"The namespace is labelled {REVISION_LABEL}={want.revision} but no control plane "
            f"of that revision or tag is installed{_installed(mesh)}",
            f"install it ('meshctl install --revision {want.revision}'), or label the namespace "
            "with an installed revision (kubectl label namespace "
            f"{item.name} {REVISION_LABEL}=REVISION --overwrite)",
            ns,
        )
    if want.ambient and not mesh.node_proxies:
        yield Finding(
            codes.AMBIENT_WITHOUT_NODE_PROXY,
            item.subject,
            "The namespace is labelled istio.io/dataplane-mode=ambient but no node proxy "
            "(DaemonSet meshctl-ztunnel) is installed: its pods are not meshed",
            "install the ambient profile ('meshctl install --profile ambient'), or remove the "
            f"label (kubectl label namespace {item.name} istio.io/dataplane-mode-)",
            ns,
        )
    if want.injection_label and want.revision_label is not None:
        yield Finding(
            codes.CONFLICTING_INJECTION_LABELS,
            item.subject,
            f"The namespace carries {want.injection_label} and "
            f"{REVISION_LABEL}={want.revision_label}: the injection label wins and the revision "
            "label is ignored",
            f"keep one: kubectl label namespace {item.name} "
            f"{want.injection_label.split('=')[0]}- (to use the revision), or "
            f"{REVISION_LABEL}- (to use the default)",
            ns,
        )
    if want.ambient and want.revision is not None:
        yield Finding(
            codes.SIDECAR_AND_AMBIENT,
            item.subject,
            "The namespace is labelled for sidecar injection and for ambient mode: its pods get "
            "sidecars and the node proxy leaves them alone",
            f"choose one: kubectl label namespace {item.name} istio.io/dataplane-mode- (sidecars)"
            ", or remove the injection label (ambient)",
            ns,
        )


def _unmeshed_namespaces(snapshot: Snapshot, mesh: Installation) -> set[str]:
    """Namespaces with workloads where nothing says whether they belong in the mesh: no
    injection, revision or dataplane-mode label, no meshed pod, and none of the mesh's own
    components (its namespace is outside the mesh on purpose)."""
    labelled = {
        i.name
        for i in snapshot.of_kind("Namespace")
        if any(k in i.labels for k in MESH_LABELS) or i.labels.get(MANAGED_BY_LABEL) == MESHCTL
    }
    own = {i.namespace for i in snapshot.items if i.labels.get(PART_OF_LABEL) == MESHCTL}
    own |= {p.namespace for plane in mesh.control_planes.values() for p in plane}
    own |= {p.namespace for p in mesh.node_proxies}
    meshed = {
        p.namespace
        for p in snapshot.of_kind("Pod")
        if has_sidecar(p) or DATAPLANE_MODE in p.labels or REVISION_LABEL in p.labels
    }
    populated = {w.namespace for w in snapshot.workloads()}
    return populated - labelled - own - meshed


def _not_meshed(item: Item) -> Finding:
    return Finding(
        codes.NAMESPACE_NOT_MESHED,
        item.subject,
        "The namespace has workloads but no label says whether they belong in the mesh: they "
        "run without proxies",
        f"kubectl label namespace {item.name} istio-injection=enabled (sidecars) or "
        f"istio.io/dataplane-mode=ambient (ambient), then restart its workloads; or "
        f"istio-injection=disabled to say it stays outside",
        (item.name,),
    )


def _deleting(item: Item) -> bool:
    return bool(field(item.obj, "metadata", "deletionTimestamp"))


def _installed(mesh: Installation) -> str:
    names = mesh.names()
    return f" (installed: {', '.join(names)})" if names else " (none is installed)"


def _default_claims(mesh: Installation) -> Iterator[Finding]:
    claims = list(mesh.control_planes.get(DEFAULT, ()))
    pointing = mesh.tags.get(DEFAULT)
    if pointing is not None and pointing != DEFAULT and DEFAULT in mesh.control_planes:
        # a tag "default" moved the default revision's namespaces elsewhere while a control
        # plane still installs itself as the default revision
        claims += list(mesh.control_planes.get(pointing, ()))
    if len(claims) < 2:
        return
    names = ", ".join(sorted(c.subject.ref for c in claims))
    for claim in claims:  # each is a party to the conflict; the order of -f files changes nothing
        yield Finding(
            codes.DEFAULT_REVISION_CLAIMED_TWICE,
            claim.subject,
            f"Control planes {names} all claim the default revision: namespaces labelled for "
            "injection are served by whichever webhook the API server calls first",
            "uninstall one of them ('meshctl uninstall -n NAMESPACE'), or install it under its "
            "own revision ('meshctl install --revision NAME')",
        )


def _pod(
    pod: Item,
    ns_labels: Mapping[str, str],
    webhooks: list[Mapping[str, object]],
    mesh: Installation,
) -> Finding | None:
    obj = pod.obj
    # A pod without a status was never created (a manifest in a file): the webhook will see it.
    if field(obj, "status", "phase") not in EXISTING or _deleting(pod) or has_sidecar(pod):
        return None
    if not isinstance(obj.get("spec"), Mapping):
        return None
    # labels and annotations as text: a file may hold ``sidecar.istio.io/inject: false``
    template = {
        "metadata": {"labels": pod.labels, "annotations": pod.annotations},
        "spec": obj["spec"],
    }
    try:
        if skip_reason(template, pod.namespace) is not None:  # type: ignore[arg-type]
            return None
    except InjectError:
        return None  # an unreadable inject label: the webhook refuses such a pod anyway
    if not any(_selects(w, ns_labels, pod.labels) for w in webhooks):
        return None
    revision = pod.labels.get(REVISION_LABEL) or wanted(ns_labels).revision or DEFAULT
    owner = _owner(obj)
    restart = (
        f"kubectl rollout restart {owner} -n {pod.namespace}"
        if owner
        else f"delete and recreate the pod (kubectl delete pod {pod.name} -n {pod.namespace})"
    )
    why = (
        "it was created before the webhook (or while injection was bypassed)"
        if mesh.serves(revision)
        else f"no control plane serves revision {revision}"
    )
    return Finding(
        codes.POD_MISSING_SIDECAR,
        pod.subject,
        f"The pod runs without a sidecar although the injection labels select it: {why}; its "
        "traffic bypasses the mesh's mTLS and policies",
        f"restart its workload so the webhook injects it: {restart}",
        (pod.namespace,),
    )


def _selects(config: Mapping[str, object], ns_labels: Mapping[str, str], labels: Any) -> bool:
    return any(
        selectors.holds(mapping(hook).get("namespaceSelector"), ns_labels)
        and selectors.holds(mapping(hook).get("objectSelector"), labels)
        for hook in sequence(config.get("webhooks"))
    )


def _owner(obj: Mapping[str, Any]) -> str:
    """``deployment/web`` for a pod of a Deployment's ReplicaSet, ``statefulset/db`` ...; ""
    for a bare pod."""
    for ref in sequence(field(obj, "metadata", "ownerReferences")):
        kind, name = str(mapping(ref).get("kind", "")), str(mapping(ref).get("name", ""))
        if kind == "ReplicaSet" and name.count("-"):
            return f"deployment/{name.rsplit('-', 1)[0]}"
        if kind in ("StatefulSet", "DaemonSet", "ReplicaSet"):
            return f"{kind.lower()}/{name}"
    return ""
