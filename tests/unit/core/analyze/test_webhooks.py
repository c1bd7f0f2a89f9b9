"""MSH0401: a foreign mutating webhook intercepting the pods meshctl injects (seed 003: Istio's
own sidecar injector left on the cluster)."""

from __future__ import annotations

import base64
from typing import Any

from .objects import codes, healthy, namespace, run


def istio_injector(**hook: Any) -> dict[str, Any]:
    webhook = {
        "name": "namespace.sidecar-injector.istio.io",
        "clientConfig": {"service": {"name": "istiod", "namespace": "istio-system"}},
        "namespaceSelector": {"matchLabels": {"istio-injection": "enabled"}},
        "rules": [
            {
                "apiGroups": [""],
                "apiVersions": ["v1"],
                "operations": ["CREATE"],
                "resources": ["pods"],
            }
        ],
        **hook,
    }
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {"name": "istio-sidecar-injector", "labels": {"app": "sidecar-injector"}},
        "webhooks": [webhook],
    }


def test_istios_injector_on_the_same_namespaces_is_an_error():
    found = run([*healthy(), istio_injector()])
    assert [f.code.id for f in found] == ["MSH0401"]
    assert found[0].subject.ref == "MutatingWebhookConfiguration istio-sidecar-injector"
    assert "namespace shop" in found[0].message
    assert found[0].namespaces == ("shop",)


def test_a_webhook_selecting_other_namespaces_is_silent():
    other = istio_injector(namespaceSelector={"matchLabels": {"team": "legacy"}})
    assert codes([*healthy(), other, namespace("legacy", team="legacy")]) == []


def test_a_webhook_that_does_not_intercept_pod_creation_is_silent():
    services = istio_injector(
        rules=[{"apiGroups": [""], "operations": ["CREATE"], "resources": ["services"]}]
    )
    updates = istio_injector(
        rules=[{"apiGroups": [""], "operations": ["UPDATE"], "resources": ["pods"]}]
    )
    assert codes([*healthy(), services]) == []
    assert codes([*healthy(), updates]) == []


def test_a_catch_all_webhook_is_reported_and_matched_by_expressions():
    catch_all = istio_injector(
        namespaceSelector={
            "matchExpressions": [
                {
                    "key": "kubernetes.io/metadata.name",
                    "operator": "NotIn",
                    "values": ["kube-system"],
                }
            ]
        },
        rules=[{"apiGroups": ["*"], "operations": ["*"], "resources": ["*"]}],
    )
    assert codes([*healthy(), catch_all]) == ["MSH0401"]


def test_meshctls_own_webhooks_are_never_foreign():
    assert codes(healthy()) == []


def test_without_meshctls_webhook_in_the_snapshot_its_rendered_selectors_are_used():
    objects = [o for o in healthy() if o["kind"] != "MutatingWebhookConfiguration"]
    assert codes([*objects, istio_injector()]) == ["MSH0401"]


def test_a_revision_tag_set_by_meshctl_tag_is_meshctls_own_and_serves_its_namespaces():
    """``meshctl tag set prod --revision canary`` writes a configuration analyze must read as
    meshctl's (not a foreign webhook, MSH0401) whose tag serves ``istio.io/rev=prod`` (no
    MSH0202)."""
    from meshctl.core.k8s import tags

    from .objects import codes, control_plane, injector, namespace, pod

    canary_injector = injector("canary")
    canary_injector["metadata"]["labels"][tags.COMPONENT_LABEL] = "controlplane"  # as install
    pem = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"
    for hook in canary_injector["webhooks"]:
        hook["clientConfig"]["caBundle"] = base64.b64encode(pem).decode()
    revision = tags.revision_of(canary_injector)
    assert revision is not None
    tag = tags.webhook("prod", revision)
    objects = [
        namespace("meshctl-system"),
        control_plane(revision="canary"),
        canary_injector,
        tag,
        namespace("shop", **{"istio.io/rev": "prod"}),
        pod("web-1"),
    ]
    found = codes(objects)
    assert "MSH0401" not in found
    assert "MSH0202" not in found
    # Without the tag, the same namespace names nothing installed.
    assert "MSH0202" in codes([o for o in objects if o is not tag])
