"""The live objects ``meshctl analyze`` reads, listed from the cluster in one pass.

Owns which kinds are listed (what the checks in ``meshctl.core.analyze`` need: namespaces, pods,
services, the controllers whose templates make pods, mutating webhook configurations and
AuthorizationPolicies) and that they are listed in every namespace (a policy in the root
namespace, a webhook or a control plane elsewhere concern the namespace analyzed), returned as
plain dicts. Invariants: reads only; a kind the server does not serve (the AuthorizationPolicy
CRD not installed) reads as no objects; any other API error reaches the caller as a ``KubeError``.
"""

from __future__ import annotations

from typing import Any

from meshctl.kube import objects
from meshctl.kube.client import Kube
from meshctl.kube.discovery import Mapper
from meshctl.kube.resources import (
    DAEMONSETS,
    DEPLOYMENTS,
    MUTATING_WEBHOOK_CONFIGURATIONS,
    NAMESPACES,
    PODS,
    SERVICES,
    Resource,
)

STATEFULSETS: Resource[dict[str, object]] = Resource("apps", "v1", "statefulsets", "StatefulSet")
# Listed at the first version the server serves (v1 since Istio 1.22, v1beta1 before).
AUTHORIZATION_POLICY_VERSIONS = ("security.istio.io/v1", "security.istio.io/v1beta1")

LISTED: tuple[Resource[Any], ...] = (
    NAMESPACES,
    PODS,
    SERVICES,
    DEPLOYMENTS,
    STATEFULSETS,
    DAEMONSETS,
    MUTATING_WEBHOOK_CONFIGURATIONS,
)


def live_objects(kube: Kube) -> list[dict[str, Any]]:
    """Every object of the listed kinds, in every namespace (items carry apiVersion and kind)."""
    found: list[dict[str, Any]] = []
    for resource in LISTED:
        items, _ = objects.list_objects(kube, resource)
        found += [dict(i) for i in items]
    mapper = Mapper(kube)
    for api_version in AUTHORIZATION_POLICY_VERSIONS:
        if mapper.served(api_version, "AuthorizationPolicy"):
            items, _ = objects.list_objects(
                kube, mapper.resource(api_version, "AuthorizationPolicy")
            )
            found += items
            break
    return found
