"""What meshctl has installed, as the snapshot shows it: control planes by revision, revision
tags, injection webhooks and the node proxy; and what a namespace's labels ask of them.

How install marks its objects (plugins/controlplane/manifest.py, plugins/ztunnel/manifest.py,
meshctl/core/k8s/inject/webhook_config.py): a control plane is a Deployment labelled
``app.kubernetes.io/name=meshctl-controlplane`` and ``istio.io/rev=<revision>``; its injection
webhook is a MutatingWebhookConfiguration labelled ``app.kubernetes.io/name=meshctl`` and
``istio.io/rev``; a revision tag is such a webhook configuration that also carries
``istio.io/tag=<tag>`` (Istio's convention); the node proxy is the DaemonSet labelled
``app.kubernetes.io/name=meshctl-ztunnel``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from meshctl.core.k8s import layout
from meshctl.core.k8s.ambient import DATAPLANE_MODE
from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.webhook_config import (
    ISTIO_NAMESPACE_LABEL,
    NAMESPACE_LABEL,
    WebhookTarget,
    webhook_configuration,
)

from .snapshot import Item, Snapshot

NAME_LABEL = "app.kubernetes.io/name"
PART_OF_LABEL = "app.kubernetes.io/part-of"  # on every object install renders
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MESHCTL = "meshctl"
REVISION_LABEL = ann.REVISION_LABEL
TAG_LABEL = "istio.io/tag"
CONTROL_PLANE_NAME = layout.CONTROL_PLANE_SERVICE
WEBHOOK_NAME = "meshctl"
NODE_PROXY_NAME = "meshctl-ztunnel"
AMBIENT = "ambient"


@dataclass(frozen=True, slots=True)
class Installation:
    control_planes: Mapping[str, tuple[Item, ...]] = field(default_factory=dict)  # by revision
    tags: Mapping[str, str] = field(default_factory=dict)  # tag -> revision
    webhooks: tuple[Item, ...] = ()  # meshctl's MutatingWebhookConfigurations
    node_proxies: tuple[Item, ...] = ()

    def serves(self, revision: str) -> bool:
        """Whether a control plane runs for ``revision`` (a tag: for the revision it points to)."""
        return revision in self.control_planes or (
            revision in self.tags and self.tags[revision] in self.control_planes
        )

    def names(self) -> list[str]:
        """Installed revisions and tags, for messages."""
        return sorted({*self.control_planes, *(t for t in self.tags if self.serves(t))})

    def injection_webhooks(self) -> list[Mapping[str, object]]:
        """meshctl's webhook configurations; when none is in the snapshot (files alone, no
        install), the default revision's as install renders it, so the selectors are known."""
        if self.webhooks:
            return [w.obj for w in self.webhooks]
        target = WebhookTarget(service=CONTROL_PLANE_NAME)
        return [webhook_configuration(ca_bundle=None, target=target)]


def installation(snapshot: Snapshot) -> Installation:
    planes: dict[str, list[Item]] = {}
    for item in snapshot.of_kind("Deployment"):
        if item.labels.get(NAME_LABEL) == CONTROL_PLANE_NAME:
            revision = item.labels.get(REVISION_LABEL) or layout.DEFAULT_REVISION
            planes.setdefault(revision, []).append(item)
    webhooks = [
        i
        for i in snapshot.of_kind("MutatingWebhookConfiguration")
        if i.labels.get(NAME_LABEL) == WEBHOOK_NAME
    ]
    tags = {
        w.labels[TAG_LABEL]: w.labels.get(REVISION_LABEL, layout.DEFAULT_REVISION)
        for w in webhooks
        if w.labels.get(TAG_LABEL)
    }
    proxies = [
        i for i in snapshot.of_kind("DaemonSet") if i.labels.get(NAME_LABEL) == NODE_PROXY_NAME
    ]
    return Installation(
        control_planes={r: tuple(p) for r, p in planes.items()},
        tags=tags,
        webhooks=tuple(webhooks),
        node_proxies=tuple(proxies),
    )


def is_meshctl_webhook(item: Item) -> bool:
    return item.labels.get(NAME_LABEL) == WEBHOOK_NAME


@dataclass(frozen=True, slots=True)
class Wanted:
    """What a namespace's labels ask for: a sidecar revision (None: none) and ambient mode."""

    revision: str | None
    ambient: bool
    injection_label: str = ""  # the label that asked for the default revision, if one did
    revision_label: str | None = None  # istio.io/rev's value, if set


def wanted(labels: Mapping[str, str]) -> Wanted:
    """The webhook's precedence (webhook_config.py): ``meshctl-injection`` or
    ``istio-injection`` ``=enabled`` asks for the default revision and wins over
    ``istio.io/rev``; a namespace carrying such a label with another value asks for none."""
    rev = labels.get(REVISION_LABEL)
    ambient = labels.get(DATAPLANE_MODE) == AMBIENT
    for label in (NAMESPACE_LABEL, ISTIO_NAMESPACE_LABEL):
        if label in labels:
            enabled = labels[label] == "enabled"
            return Wanted(
                layout.DEFAULT_REVISION if enabled else None,
                ambient,
                injection_label=f"{label}={labels[label]}",
                revision_label=rev,
            )
    return Wanted(rev or None, ambient, revision_label=rev)
