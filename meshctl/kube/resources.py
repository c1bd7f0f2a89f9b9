"""The kinds of Kubernetes object meshctl reads and writes, named by group, version and plural.

Owns the URL paths of the API's REST layout (``/api/v1/...`` for the core group,
``/apis/<group>/<version>/...`` otherwise; the Kubernetes API conventions). Invariant: a path is
built only from names quoted for a URL segment, so a name from a peer or a user can never reach
another resource. A ``Resource`` is typed by the view its objects are read as
(``meshctl.core.k8s.schema``), so a verb on ``PODS`` hands back a ``Pod``; a kind the code does
not read field by field is a plain JSON object (``dict[str, object]``).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Generic, TypeVar
from urllib.parse import quote

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import (
        KubeObject,
        Lease,
        Namespace,
        Pod,
        Secret,
        SelfSubjectAccessReview,
        TokenReview,
    )


# Covariant: a resource of Pods is a resource of objects (verbs hand objects out as the view;
# what they send is any JSON object).
_View_co = TypeVar("_View_co", bound=Mapping[str, object], covariant=True)
# What a verb over a ``Resource[Body]`` hands back.
Body = TypeVar("Body", bound=Mapping[str, object])


@dataclass(frozen=True, slots=True)
class Resource(Generic[_View_co]):
    """One resource type: ``Resource("apps", "v1", "deployments", "Deployment")``; ``Body`` is
    the view its objects are read as (types only: no check at run time)."""

    group: str  # "" for the core group
    version: str
    plural: str
    kind: str
    namespaced: bool = True

    @property
    def api_version(self) -> str:
        """What objects of this kind carry in ``apiVersion``."""
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(
        self, namespace: str | None = None, name: str | None = None, subresource: str | None = None
    ) -> str:
        """The collection path (``name`` None) or the object's path; all namespaces when a
        namespaced kind gets no ``namespace``."""
        base = f"/apis/{self.group}/{self.version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace is not None:
            base += f"/namespaces/{_segment(namespace)}"
        elif not self.namespaced and namespace is not None:
            raise ValueError(f"{self.plural} are cluster-scoped: no namespace")
        if self.namespaced and namespace is None and name is not None:
            raise ValueError(f"a {self.kind} is addressed by namespace and name")
        path = f"{base}/{self.plural}"
        if name is not None:
            path += f"/{_segment(name)}"
            if subresource:
                path += f"/{_segment(subresource)}"
        return path


def _segment(text: str) -> str:
    if not text or text in (".", ".."):
        raise ValueError(f"{text!r} is not a usable object name")
    return quote(text, safe="")


NAMESPACES: Resource[Namespace] = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
NODES: Resource[KubeObject] = Resource("", "v1", "nodes", "Node", namespaced=False)
PODS: Resource[Pod] = Resource("", "v1", "pods", "Pod")
SERVICES: Resource[dict[str, object]] = Resource("", "v1", "services", "Service")
# Read as plain dicts by install and verify (they own their reading of these).
CONFIG_MAPS: Resource[dict[str, Any]] = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS: Resource[Secret] = Resource("", "v1", "secrets", "Secret")
SERVICE_ACCOUNTS: Resource[KubeObject] = Resource("", "v1", "serviceaccounts", "ServiceAccount")
ENDPOINT_SLICES: Resource[dict[str, object]] = Resource(
    "discovery.k8s.io", "v1", "endpointslices", "EndpointSlice"
)
LEASES: Resource[Lease] = Resource("coordination.k8s.io", "v1", "leases", "Lease")
TOKEN_REVIEWS: Resource[TokenReview] = Resource(
    "authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False
)
MUTATING_WEBHOOK_CONFIGURATIONS: Resource[dict[str, Any]] = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
EVENTS: Resource[dict[str, object]] = Resource("", "v1", "events", "Event")
DEPLOYMENTS: Resource[dict[str, object]] = Resource("apps", "v1", "deployments", "Deployment")
DAEMONSETS: Resource[dict[str, object]] = Resource("apps", "v1", "daemonsets", "DaemonSet")
CUSTOM_RESOURCE_DEFINITIONS: Resource[dict[str, object]] = Resource(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    namespaced=False,
)
SELF_SUBJECT_ACCESS_REVIEWS: Resource[SelfSubjectAccessReview] = Resource(
    "authorization.k8s.io",
    "v1",
    "selfsubjectaccessreviews",
    "SelfSubjectAccessReview",
    namespaced=False,
)
