"""The kinds of Kubernetes object meshctl reads and writes, named by group, version and plural.

Owns the URL paths of the API's REST layout (``/api/v1/...`` for the core group,
``/apis/<group>/<version>/...`` otherwise; the Kubernetes API conventions). Invariant: a path is
built only from names quoted for a URL segment, so a name from a peer or a user can never reach
another resource.
"""

from __future__ import annotations

from dataclasses import dataclass
from urllib.parse import quote


@dataclass(frozen=True, slots=True)
class Resource:
    """One resource type: ``Resource("apps", "v1", "deployments", "Deployment")``."""

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


NAMESPACES = Resource("", "v1", "namespaces", "Namespace", namespaced=False)
NODES = Resource("", "v1", "nodes", "Node", namespaced=False)
PODS = Resource("", "v1", "pods", "Pod")
SERVICES = Resource("", "v1", "services", "Service")
CONFIG_MAPS = Resource("", "v1", "configmaps", "ConfigMap")
SECRETS = Resource("", "v1", "secrets", "Secret")
SERVICE_ACCOUNTS = Resource("", "v1", "serviceaccounts", "ServiceAccount")
ENDPOINT_SLICES = Resource("discovery.k8s.io", "v1", "endpointslices", "EndpointSlice")
LEASES = Resource("coordination.k8s.io", "v1", "leases", "Lease")
TOKEN_REVIEWS = Resource(
    "authentication.k8s.io", "v1", "tokenreviews", "TokenReview", namespaced=False
)
MUTATING_WEBHOOK_CONFIGURATIONS = Resource(
    "admissionregistration.k8s.io",
    "v1",
    "mutatingwebhookconfigurations",
    "MutatingWebhookConfiguration",
    namespaced=False,
)
EVENTS = Resource("", "v1", "events", "Event")
DEPLOYMENTS = Resource("apps", "v1", "deployments", "Deployment")
DAEMONSETS = Resource("apps", "v1", "daemonsets", "DaemonSet")
CUSTOM_RESOURCE_DEFINITIONS = Resource(
    "apiextensions.k8s.io",
    "v1",
    "customresourcedefinitions",
    "CustomResourceDefinition",
    namespaced=False,
)
SELF_SUBJECT_ACCESS_REVIEWS = Resource(
    "authorization.k8s.io",
    "v1",
    "selfsubjectaccessreviews",
    "SelfSubjectAccessReview",
    namespaced=False,
)
