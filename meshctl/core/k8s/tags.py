"""Revision tags as data: which revision a tag names, its webhook configuration, who uses it.

A tag (``meshctl tag set prod --revision canary``) is one MutatingWebhookConfiguration,
``meshctl-revision-tag-<tag>``, whose webhooks select what the revision's own webhooks select for
the revision's name, but for the tag's (namespaces labelled ``istio.io/rev=<tag>``, or pods so
labelled in unlabelled namespaces), and send those pods to the revision's injector, with the
revision's ``caBundle`` (the revision's control plane keeps it current afterwards). Moving a
namespace between revisions is moving its tag, as istioctl's ``istio-revision-tag-<tag>``. The
``default`` tag also takes ``meshctl-injection=enabled``, ``istio-injection=enabled`` and
``sidecar.istio.io/inject=true`` pods, as the default revision's webhook does. Invariants: a tag
never has the name of an installed revision (both webhooks would match the same namespaces: pods
injected twice); a tag only names an installed revision whose webhook already carries its CA
bundle; values in, values out (no cluster access here).
"""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.pipeline import IGNORED_NAMESPACES
from meshctl.core.k8s.inject.webhook_config import (
    ISTIO_NAMESPACE_LABEL,
    NAMESPACE_LABEL,
    NAMESPACE_NAME_LABEL,
    WebhookTarget,
    webhook_configuration,
)
from meshctl.errors import MeshctlError, UserError

TAG_LABEL = "istio.io/tag"
REVISION_LABEL = ann.REVISION_LABEL
CONFIGURATION_PREFIX = "meshctl-revision-tag-"
DEFAULT_TAG = "default"
MANAGED_BY_LABEL = "app.kubernetes.io/managed-by"
MANAGED_BY = "meshctl"
# The install's label on every object of a revision (manifest.COMPONENT_LABEL): a revision's own
# injector configuration carries it with ``controlplane``; a tag's never does, so uninstalling
# a revision never removes the tags (``uninstall`` refuses while tags name it).
COMPONENT_LABEL = "install.meshctl.io/component"
CONTROL_PLANE_COMPONENT = "controlplane"
# A tag is a label value, and it is part of an object name.
_TAG = re.compile(r"^[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?$")

Object = Mapping[str, Any]


@dataclass(frozen=True, slots=True, kw_only=True)
class Revision:
    """An installed revision as its injector's webhook configuration shows it."""

    name: str
    configuration: str  # its MutatingWebhookConfiguration
    service: str
    namespace: str
    path: str
    port: int
    ca_bundle: bytes | None  # PEM; None until its control plane's leader patched it in


@dataclass(frozen=True, slots=True, kw_only=True)
class Tag:
    """A tag found in the cluster."""

    name: str
    revision: str
    configuration: str


def configuration_name(tag: str) -> str:
    return CONFIGURATION_PREFIX + tag


def validate_tag(tag: str) -> None:
    if not _TAG.match(tag):
        raise UserError(
            f"invalid tag {tag!r}",
            hint="a tag is a label value: lower-case letters, digits and '-', "
            "starting and ending with a letter or digit, at most 63 characters",
        )


def _mapping(value: object) -> Mapping[str, Any]:
    return value if isinstance(value, Mapping) else {}


def _labels(obj: Object) -> Mapping[str, Any]:
    return _mapping(_mapping(obj.get("metadata")).get("labels"))


def revision_of(live: Object) -> Revision | None:
    """The revision whose own injector configuration ``live`` is (installed by ``meshctl
    install``), or None for any other configuration (a tag's, a foreign one)."""
    labels = _labels(live)
    name = labels.get(REVISION_LABEL)
    if labels.get(COMPONENT_LABEL) != CONTROL_PLANE_COMPONENT or not name or TAG_LABEL in labels:
        return None
    hooks = [h for h in live.get("webhooks") or () if isinstance(h, Mapping)]
    client = _mapping(hooks[0].get("clientConfig")) if hooks else {}
    service = _mapping(client.get("service"))
    if not service.get("name"):
        return None
    bundle: bytes | None = None
    if client.get("caBundle"):
        try:
            bundle = base64.b64decode(str(client["caBundle"]), validate=True)
        except (binascii.Error, ValueError):
            bundle = None
    return Revision(
        name=str(name),
        configuration=str(_mapping(live.get("metadata")).get("name") or ""),
        service=str(service["name"]),
        namespace=str(service.get("namespace") or ""),
        path=str(service.get("path") or "/inject"),
        port=int(service.get("port") or 443),
        ca_bundle=bundle,
    )


def tag_of(live: Object) -> Tag | None:
    """The tag ``live`` is (labelled ``istio.io/tag`` and named as tags are), or None."""
    labels = _labels(live)
    tag = labels.get(TAG_LABEL)
    name = str(_mapping(live.get("metadata")).get("name") or "")
    if not tag or name != configuration_name(str(tag)):
        return None
    return Tag(name=str(tag), revision=str(labels.get(REVISION_LABEL) or ""), configuration=name)


def revisions(configurations: Iterable[Object]) -> dict[str, Revision]:
    found = (revision_of(c) for c in configurations)
    return {r.name: r for r in found if r is not None}


def tags(configurations: Iterable[Object]) -> dict[str, Tag]:
    found = (tag_of(c) for c in configurations)
    return {t.name: t for t in sorted((t for t in found if t), key=lambda t: t.name)}


def webhook(tag: str, revision: Revision) -> dict[str, object]:
    """The tag's MutatingWebhookConfiguration, pointing at ``revision``'s injector."""
    validate_tag(tag)
    if revision.ca_bundle is None:
        raise MeshctlError(
            f"revision {revision.name!r} has no CA bundle in its webhook configuration "
            f"{revision.configuration} yet",
            hint=f"wait until its control plane is ready ('meshctl verify --revision "
            f"{revision.name}'), then set the tag again",
        )
    target = WebhookTarget(
        service=revision.service,
        namespace=revision.namespace,
        port=revision.port,
        path=revision.path,
    )
    # The revision's selector matrix with the tag in the revision's place: the same webhooks the
    # revision itself would have if it were named as the tag (the default tag's included).
    out = webhook_configuration(ca_bundle=revision.ca_bundle, target=target, revision=tag)
    out["metadata"] = {
        "name": configuration_name(tag),
        "labels": {
            "app.kubernetes.io/name": "meshctl",
            "app.kubernetes.io/part-of": "meshctl",
            MANAGED_BY_LABEL: MANAGED_BY,
            TAG_LABEL: tag,
            REVISION_LABEL: revision.name,
        },
    }
    return out


def check_set(
    tag: str,
    revision: str,
    installed: Mapping[str, Revision],
    existing: Mapping[str, Tag],
    *,
    overwrite: bool,
) -> Revision:
    """The revision ``tag`` may point at, or why not (``MeshctlError``)."""
    validate_tag(tag)
    if revision not in installed:
        have = ", ".join(sorted(installed)) or "none"
        raise MeshctlError(
            f"revision {revision!r} is not installed (installed revisions: {have})",
            hint=f"install it first ('meshctl install --revision {revision}'), "
            "or name an installed one",
        )
    if tag in installed:
        extra = (
            " (it already takes meshctl-injection=enabled and istio-injection=enabled namespaces)"
            if tag == DEFAULT_TAG
            else ""
        )
        raise MeshctlError(
            f"tag {tag!r} has the name of an installed revision{extra}: both would inject the "
            "same pods",
            hint=f"use another tag name, or move its namespaces and 'meshctl uninstall "
            f"--revision {tag}' first",
        )
    current = existing.get(tag)
    if current is not None and current.revision != revision and not overwrite:
        raise MeshctlError(
            f"tag {tag!r} already points at revision {current.revision!r}",
            hint=f"pass --overwrite to move it to {revision!r}",
        )
    return installed[revision]


def namespace_uses(tag: str, labels: Mapping[str, str]) -> bool:
    """Whether a namespace with ``labels`` has its pods injected through ``tag``'s webhooks
    (as the selectors of ``webhook_configuration`` choose namespaces)."""
    if labels.get(NAMESPACE_NAME_LABEL) in IGNORED_NAMESPACES:
        return False
    explicit = NAMESPACE_LABEL in labels or ISTIO_NAMESPACE_LABEL in labels
    if labels.get(REVISION_LABEL) == tag and not explicit:
        return True
    if tag != DEFAULT_TAG:
        return False
    return labels.get(NAMESPACE_LABEL) == "enabled" or (
        labels.get(ISTIO_NAMESPACE_LABEL) == "enabled" and NAMESPACE_LABEL not in labels
    )


def namespaces_using(tag: str, namespaces: Sequence[tuple[str, Mapping[str, str]]]) -> list[str]:
    """Names of the namespaces (name, labels) whose pods ``tag`` injects."""
    return sorted(name for name, labels in namespaces if namespace_uses(tag, labels))


def rows(
    found: Mapping[str, Tag], namespaces: Sequence[tuple[str, Mapping[str, str]]]
) -> list[dict[str, object]]:
    """``tag list``: one row a tag, as istioctl's TAG REVISION NAMESPACES."""
    return [
        {
            "tag": t.name,
            "revision": t.revision,
            "namespaces": namespaces_using(t.name, namespaces),
        }
        for t in found.values()
    ]


def check_remove(
    tag: str, existing: Mapping[str, Tag], using: Sequence[str], *, force: bool
) -> Tag:
    """The tag to remove, or why not: it does not exist, or namespaces still use it (their
    new pods would be created without a proxy, or refused) unless ``force``."""
    validate_tag(tag)
    found = existing.get(tag)
    if found is None:
        have = ", ".join(existing) or "none"
        raise MeshctlError(f"tag {tag!r} not found (tags: {have})", hint="see 'meshctl tag list'")
    if using and not force:
        raise MeshctlError(
            f"tag {tag!r} is still used by namespace(s) {', '.join(using)}: their new pods "
            "would get no proxy",
            hint="relabel them (istio.io/rev=<another tag or revision>) first, "
            "or pass --force to remove it anyway",
        )
    return found
