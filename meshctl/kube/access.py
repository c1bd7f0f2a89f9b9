"""SelfSubjectAccessReview: may the identity in use do this (authorization.k8s.io/v1)?

Invariant: asks only about ourselves (what ``kubectl auth can-i`` asks); an unreachable API is a
``KubeError``, a denial is an answer (allowed False with the authorizer's reason), never an error.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

from meshctl.kube import objects
from meshctl.kube.client import Kube
from meshctl.kube.resources import SELF_SUBJECT_ACCESS_REVIEWS

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import SubjectAccessReviewStatus


@dataclass(frozen=True, slots=True)
class Access:
    verb: str
    group: str
    resource: str
    namespace: str  # "" for cluster-scoped (or all namespaces)
    subresource: str = ""

    def __str__(self) -> str:
        what = self.resource + (f"/{self.subresource}" if self.subresource else "")
        what = f"{what}.{self.group}" if self.group else what
        where = f" in namespace {self.namespace}" if self.namespace else ""
        return f"{self.verb} {what}{where}"


def review(kube: Kube, access: Access) -> tuple[bool, str]:
    """Whether ``access`` is allowed, and the authorizer's reason (empty when it gave none)."""
    attributes = {
        "verb": access.verb,
        "group": access.group,
        "resource": access.resource,
    }
    if access.namespace:
        attributes["namespace"] = access.namespace
    if access.subresource:
        attributes["subresource"] = access.subresource
    body = {
        "apiVersion": SELF_SUBJECT_ACCESS_REVIEWS.api_version,
        "kind": SELF_SUBJECT_ACCESS_REVIEWS.kind,
        "spec": {"resourceAttributes": attributes},
    }
    answer = objects.create(kube, SELF_SUBJECT_ACCESS_REVIEWS, body)
    status: SubjectAccessReviewStatus = answer.get("status") or {}
    return bool(status.get("allowed")), str(status.get("reason") or "")
