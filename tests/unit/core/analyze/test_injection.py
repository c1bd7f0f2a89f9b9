"""Injection and ambient checks: labels nothing serves (MSH0201-MSH0203), pods without their
sidecar (MSH0204), conflicting labels and claims (MSH0301-MSH0303)."""

from __future__ import annotations

import pytest

from .objects import (
    codes,
    control_plane,
    deployment,
    healthy,
    injector,
    namespace,
    node_proxy,
    pod,
    run,
)


def without(objects, kind):
    return [o for o in objects if o["kind"] != kind]


def test_an_injection_label_without_a_control_plane_is_an_error():
    objects = without(without(healthy(), "Deployment"), "MutatingWebhookConfiguration")
    found = run([*objects, pod("web-0", sidecar=False)])
    assert [f.code.id for f in found] == ["MSH0201", "MSH0204"]
    assert found[0].subject.ref == "Namespace shop"
    assert "istio-injection=enabled" in found[0].message
    assert "no control plane serves revision default" in found[1].message


@pytest.mark.parametrize(
    "labels",
    [{"meshctl-injection": "enabled"}, {"istio-injection": "enabled"}, {"istio.io/rev": "default"}],
)
def test_each_way_of_asking_for_the_default_revision_needs_its_control_plane(labels):
    assert codes([namespace("app", **labels)]) == ["MSH0201"]
    assert codes([namespace("app", **labels), control_plane()]) == []


def test_a_disabled_injection_label_asks_for_nothing():
    assert codes([namespace("app", **{"istio-injection": "disabled"})]) == []


def test_a_revision_label_naming_no_installed_revision_is_an_error():
    found = run([*healthy(), namespace("canaried", **{"istio.io/rev": "canary"})])
    assert [f.code.id for f in found] == ["MSH0202"]
    assert "installed: default" in found[0].message


def test_a_revision_label_is_served_by_its_control_plane_or_a_tag():
    objects = [*healthy(), namespace("canaried", **{"istio.io/rev": "canary"})]
    assert codes([*objects, control_plane(revision="canary")]) == []
    tag = injector()
    tag["metadata"]["name"] = "meshctl-revision-tag-canary"
    tag["metadata"]["labels"]["istio.io/tag"] = "canary"
    assert codes([*objects, tag]) == []


def test_an_ambient_namespace_needs_the_node_proxy():
    ambient = namespace("amb", **{"istio.io/dataplane-mode": "ambient"})
    found = run([*healthy(), ambient])
    assert [f.code.id for f in found] == ["MSH0203"]
    assert codes([*healthy(), ambient, node_proxy()]) == []


def test_a_pod_created_before_the_webhook_is_an_error_with_its_restart():
    bare = pod("web-0", sidecar=False)
    bare["metadata"]["ownerReferences"] = [{"kind": "ReplicaSet", "name": "web-5d8f7c9b4"}]
    found = run([*healthy(), bare])
    assert [f.code.id for f in found] == ["MSH0204"]
    assert found[0].subject.ref == "Pod shop/web-0"
    assert "created before the webhook" in found[0].message
    assert "kubectl rollout restart deployment/web -n shop" in found[0].fix


@pytest.mark.parametrize(
    "change",
    [
        {"labels": {"app": "web", "sidecar.istio.io/inject": "false"}},
        {"annotations": {"sidecar.istio.io/inject": "false"}},
        {"hostNetwork": True},
    ],
)
def test_a_pod_opted_out_of_injection_is_silent(change):
    assert codes([*healthy(), pod("web-0", sidecar=False, **change)]) == []


def test_a_finished_pod_or_one_in_an_unlabelled_namespace_is_silent():
    done = pod("job-1", sidecar=False)
    done["status"]["phase"] = "Succeeded"
    assert codes([*healthy(), done, pod("x", "plain", sidecar=False)]) == []


def test_a_pod_that_asks_for_injection_itself_is_checked_in_an_unlabelled_namespace():
    asked = pod("x", "plain", {"sidecar.istio.io/inject": "true"}, sidecar=False)
    assert codes([*healthy(), asked]) == ["MSH0204"]


def test_both_injection_label_and_revision_is_a_warning():
    both = namespace("shop", **{"istio-injection": "enabled", "istio.io/rev": "default"})
    objects = [o for o in healthy() if o["metadata"]["name"] != "shop" or o["kind"] != "Namespace"]
    assert codes([*objects, both]) == ["MSH0301"]


def test_sidecar_and_ambient_labels_together_are_a_warning():
    both = namespace("amb", **{"istio-injection": "enabled", "istio.io/dataplane-mode": "ambient"})
    assert codes([*healthy(), node_proxy(), both]) == ["MSH0303"]


def test_two_control_planes_claiming_the_default_revision_is_an_error():
    found = run([*healthy(), control_plane("other-mesh")])
    assert [f.code.id for f in found] == ["MSH0302", "MSH0302"]
    assert [f.subject.namespace for f in found] == ["meshctl-system", "other-mesh"]
    assert "Deployment meshctl-system/meshctl-controlplane" in found[0].message
    assert codes([*healthy(), control_plane(revision="canary")]) == []


def test_a_pod_manifest_not_yet_created_is_silent_the_webhook_will_see_it():
    manifest = pod("web-0", sidecar=False)
    del manifest["status"]
    assert codes([*healthy(), manifest]) == []


def test_a_namespace_with_workloads_and_no_mesh_label_is_info():
    objects = [*healthy(), namespace("legacy"), deployment("billing", "legacy", {"app": "b"})]
    found = run(objects)
    assert [(f.code.id, f.level.label, f.subject.ref) for f in found] == [
        ("MSH0206", "Info", "Namespace legacy")
    ]


@pytest.mark.parametrize(
    "extra",
    [
        [namespace("legacy", **{"istio-injection": "disabled"})],  # a decision
        [namespace("legacy")],  # no workload
        [namespace("legacy"), pod("a", "legacy")],  # a meshed pod (its own label)
        [namespace("legacy"), control_plane("legacy", "canary")],  # the mesh's own namespace
    ],
)
def test_an_empty_deliberate_meshed_or_mesh_namespace_is_not_reported(extra):
    assert codes([*healthy(), *extra]) == []


def test_what_is_being_deleted_is_not_reported():
    going = pod("web-0", sidecar=False)
    going["metadata"]["deletionTimestamp"] = "2026-12-06T18:00:00Z"
    ns = namespace("old", **{"istio.io/rev": "gone"})
    ns["metadata"]["deletionTimestamp"] = "2026-12-06T18:00:00Z"
    assert codes([*healthy(), going, ns]) == []
