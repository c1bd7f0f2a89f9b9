"""The CustomResourceDefinitions the control plane reads, as data (``install`` applies them).

Owns ``AuthorizationPolicy`` (``security.istio.io``: Istio's group, kind, names and field names,
so a policy written for Istio applies unchanged; ``v1`` served and stored, ``v1beta1`` served, the
same schema). The schema is structural: every field Istio's API defines is declared with its
type, so the API server refuses a mistyped policy at admission; what discovery enforces at L4 is
documented in docs/controlplane.md. Invariant: a pure function (no cluster access). The CRD's name
is fixed by its group: where Istio is installed the two share it (install must not replace
Istio's).
"""

from __future__ import annotations

from collections.abc import Mapping

from meshctl.core.k8s.install.components import Object
from meshctl.structured import Json

# A schema node: JSON all the way down (the CRD embeds these in one another).
Node = Mapping[str, Json]

GROUP = "security.istio.io"
PLURAL = "authorizationpolicies"
CRD_NAME = f"{PLURAL}.{GROUP}"


def _strings() -> Node:
    # A fresh dict each time: shared ones would render as YAML anchors and aliases.
    return {"type": "array", "items": {"type": "string"}}


def _object(properties: Mapping[str, Json], **extra: Json) -> Node:
    return {"type": "object", "properties": properties, **extra}


def _source() -> Node:
    names = (
        "principals",
        "notPrincipals",
        "requestPrincipals",
        "notRequestPrincipals",
        "namespaces",
        "notNamespaces",
        "serviceAccounts",
        "notServiceAccounts",
        "ipBlocks",
        "notIpBlocks",
        "remoteIpBlocks",
        "notRemoteIpBlocks",
    )
    return _object({n: _strings() for n in names})


def _operation() -> Node:
    names = ("hosts", "notHosts", "ports", "notPorts", "methods", "notMethods", "paths", "notPaths")
    return _object({n: _strings() for n in names})


def _target_ref() -> Node:
    return _object(
        {
            "group": {"type": "string"},
            "kind": {"type": "string"},
            "name": {"type": "string"},
            "namespace": {"type": "string"},
        },
        required=["kind", "name"],
    )


def _spec() -> Node:
    rule = _object(
        {
            "from": {"type": "array", "items": _object({"source": _source()})},
            "to": {"type": "array", "items": _object({"operation": _operation()})},
            "when": {
                "type": "array",
                "items": _object(
                    {"key": {"type": "string"}, "values": _strings(), "notValues": _strings()},
                    required=["key"],
                ),
            },
        }
    )
    return _object(
        {
            "selector": _object(
                {"matchLabels": {"type": "object", "additionalProperties": {"type": "string"}}}
            ),
            "targetRef": _target_ref(),
            "targetRefs": {"type": "array", "items": _target_ref()},
            "action": {"type": "string", "enum": ["ALLOW", "DENY", "AUDIT", "CUSTOM"]},
            "provider": _object({"name": {"type": "string"}}),
            "rules": {"type": "array", "items": rule},
        },
        description="Istio AuthorizationPolicy; the node proxies enforce its L4 fields.",
    )


def authorization_policy_crd() -> Object:
    """The ``authorizationpolicies.security.istio.io`` CRD."""
    schema: Node = {
        "openAPIV3Schema": _object(
            {
                "spec": _spec(),
                "status": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
            }
        )
    }
    columns: list[Node] = [
        {"name": "Action", "type": "string", "jsonPath": ".spec.action"},
        {"name": "Age", "type": "date", "jsonPath": ".metadata.creationTimestamp"},
    ]
    versions: list[Object] = [
        {
            "name": name,
            "served": True,
            "storage": name == "v1",
            "schema": schema,
            "subresources": {"status": {}},
            "additionalPrinterColumns": columns,
        }
        for name in ("v1", "v1beta1")
    ]
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {
            "name": CRD_NAME,
            "labels": {"app.kubernetes.io/part-of": "meshctl"},
        },
        "spec": {
            "group": GROUP,
            "names": {
                "kind": "AuthorizationPolicy",
                "listKind": "AuthorizationPolicyList",
                "plural": PLURAL,
                "singular": "authorizationpolicy",
                "shortNames": ["ap"],
                "categories": ["istio-io", "security-istio-io"],
            },
            "scope": "Namespaced",
            "versions": versions,
        },
    }


def objects() -> list[Object]:
    """Every CRD the control plane needs, in apply order."""
    return [authorization_policy_crd()]
