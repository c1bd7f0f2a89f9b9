"""``meshctl upgrade`` as data: the values come back from the install record, and the plan names
what applying this version's manifest creates, changes (field by field), leaves and prunes."""

from __future__ import annotations

import json

import pytest

from meshctl import components
from meshctl.core.k8s.install import manifest as mf
from meshctl.core.k8s.install import upgrade as up
from meshctl.errors import MeshctlError

REGISTRY = components.load()


def record(values: dict[str, object], *, revision: str = "canary", profile: str = "minimal"):
    installed = REGISTRY.resolve(
        profile=profile, files=[("test", values)], revision=revision, namespace="mesh"
    )
    own = mf.own_objects(REGISTRY, installed)
    found = next(r.object for r in own if r.kind == "ConfigMap")
    return installed, json.loads(json.dumps(found))


def test_the_record_gives_back_the_installed_values():
    installed, found = record(
        {"image": "reg/meshctl:1", "components": {"controlplane": {"replicas": 1}}}
    )
    values = up.recorded_values(REGISTRY, found)
    assert values == installed
    assert (values.revision, values.namespace, values.profile) == ("canary", "mesh", "minimal")
    assert values.image == "reg/meshctl:1"


def test_the_upgrades_own_set_goes_over_the_record():
    _, found = record({"image": "reg/meshctl:1"})
    values = up.recorded_values(REGISTRY, found, assignments=["image=reg/meshctl:2"])
    assert values.image == "reg/meshctl:2"
    assert values.revision == "canary"


def test_a_broken_record_is_named():
    _, found = record({})
    found["data"]["values.json"] = "{not json"
    with pytest.raises(MeshctlError, match=r"values\.json is not JSON"):
        up.recorded_values(REGISTRY, found)


def test_the_plan_names_created_changed_unchanged_and_pruned_objects():
    old, _ = record({"image": "reg/meshctl:1"})
    new, _ = record({"image": "reg/meshctl:2"})
    before = {r.key: r.object for r in mf.render(REGISTRY, old)}
    rendered = mf.render(REGISTRY, new)
    deployment = next(r for r in rendered if r.kind == "Deployment")
    service = next(r for r in rendered if r.kind == "Service")
    live = {k: v for k, v in before.items() if k != service.key}  # the Service is gone
    leftover = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "old-thing", "namespace": "mesh", "labels": {mf.COMPONENT_LABEL: "x"}},
    }
    steps = {s.key: s for s in up.plan(rendered, live, [*before.values(), leftover])}
    assert steps[service.key].action == up.CREATE
    changed = steps[deployment.key]
    assert changed.action == up.CHANGE
    assert any("containers[discovery].image is 'reg/meshctl:1'" in f for f in changed.fields)
    assert steps[mf.key_of(leftover)].action == up.PRUNE
    unchanged = [s for s in steps.values() if s.action == up.UNCHANGED]
    assert unchanged  # RBAC, the webhook configuration ... did not change
    assert up.summary(list(steps.values())).startswith("1 to create, ")
    rows = up.table(list(steps.values()))
    assert {r["action"] for r in rows} == {up.CREATE, up.CHANGE, up.PRUNE}


def test_the_same_version_and_values_plan_no_change():
    values, _ = record({})
    rendered = mf.render(REGISTRY, values)
    live = {r.key: r.object for r in rendered}
    steps = up.plan(rendered, live, list(live.values()))
    assert {s.action for s in steps} == {up.UNCHANGED}
