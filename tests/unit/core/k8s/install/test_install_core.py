"""The pure parts of install and verify: whose an object is, which foreign webhooks overlap ours
(seed 003), drift named by field, and the verify report and exit code decided in one place."""

from __future__ import annotations

import yaml

from meshctl import components
from meshctl.core.k8s.install import drift, ownership
from meshctl.core.k8s.install import manifest as mf
from meshctl.core.k8s.install.checks import (
    Check,
    Outcome,
    Ran,
    Result,
    exit_code,
    report_json,
    report_text,
)

SEED_003 = {
    "apiVersion": "admissionregistration.k8s.io/v1",
    "kind": "MutatingWebhookConfiguration",
    "metadata": {"name": "w-istio-sidecar-injector-istio-system"},
    "webhooks": [
        {
            "name": "sidecar-injector.istio.io",
            "clientConfig": {"service": {"name": "istiod", "namespace": "istio-system"}},
            "rules": [
                {
                    "operations": ["CREATE"],
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "resources": ["pods"],
                }
            ],
            "namespaceSelector": {"matchLabels": {"istio-injection": "enabled"}},
        }
    ],
}


def our_webhooks(revision: str = "default") -> list[dict]:
    registry = components.load()
    values = registry.resolve(profile="default", revision=revision)
    return [
        r.object for r in mf.render(registry, values) if r.kind == "MutatingWebhookConfiguration"
    ]


def test_seed_003s_leftover_webhook_overlaps_ours_and_names_its_service():
    found = ownership.overlaps(SEED_003, our_webhooks())
    assert [o.configuration for o in found] == ["w-istio-sidecar-injector-istio-system"]
    assert found[0].service == ("istio-system", "istiod")
    assert found[0].failure_policy == "Fail"


def test_a_webhook_that_does_not_intercept_pod_creation_does_not_overlap():
    other = yaml.safe_load(yaml.safe_dump(SEED_003))
    other["webhooks"][0]["rules"][0]["resources"] = ["services"]
    other["webhooks"][0]["namespaceSelector"] = {}
    assert ownership.overlaps(other, our_webhooks()) == []
    other["webhooks"][0]["rules"][0]["resources"] = ["pods"]
    other["webhooks"][0]["rules"][0]["operations"] = ["UPDATE"]
    assert ownership.overlaps(other, our_webhooks()) == []


def test_selectors_are_satisfiable_only_together():
    assert ownership.satisfiable([{"matchLabels": {"a": "1"}}, {}])
    assert not ownership.satisfiable(
        [
            {"matchLabels": {"a": "1"}},
            {"matchExpressions": [{"key": "a", "operator": "DoesNotExist"}]},
        ]
    )
    assert not ownership.satisfiable(
        [{"matchExpressions": [{"key": "a", "operator": "In", "values": ["1"]}]},
         {"matchExpressions": [{"key": "a", "operator": "NotIn", "values": ["1"]}]}]
    )  # fmt: skip


def test_ours_is_our_label_or_our_field_manager():
    assert ownership.is_ours({"metadata": {"labels": {mf.COMPONENT_LABEL: "cni"}}})
    applied = {"manager": "meshctl", "operation": "Apply"}
    assert ownership.is_ours({"metadata": {"managedFields": [applied]}})
    # The control plane's caBundle patch of a foreign webhook configuration with our name.
    patched = {"manager": "meshctl", "operation": "Update"}
    assert not ownership.is_ours({"metadata": {"managedFields": [patched]}})
    foreign = {"metadata": {"managedFields": [{"manager": "kubectl-client-side-apply"}]}}
    assert not ownership.is_ours(foreign)
    assert "kubectl-client-side-apply" in ownership.foreign_reason(foreign)


def test_drift_is_named_by_field_path():
    desired = {"spec": {"replicas": 2, "template": {"spec": {"containers": [
        {"name": "discovery", "image": "m:1"}]}}}}  # fmt: skip
    live = {"spec": {"replicas": 0, "template": {"spec": {"containers": [
        {"name": "discovery", "image": "other:2", "env": []}]}}}}  # fmt: skip
    found = [str(d) for d in drift.differences(desired, live)]
    assert found == [
        "spec.replicas is 0, the manifest sets 2",
        "spec.template.spec.containers[discovery].image is 'other:2', the manifest sets 'm:1'",
    ]
    assert drift.differences(desired, desired) == []


def test_zero_values_the_api_server_omits_are_not_drift():
    """The API server stores ``value: ""``, ``initialDelaySeconds: 0``, ``false``, ``[]`` and
    ``{}`` of omitempty fields as absent; a set value that is absent, or a zero that is set to
    something else, still is drift."""
    env = [{"name": "APPS", "value": ""}, {"name": "X", "value": "1"}]
    container = {"name": "proxy", "env": env,
                 "readinessProbe": {"initialDelaySeconds": 0, "periodSeconds": 2},
                 "stdin": False, "args": [], "resources": {}}  # fmt: skip
    desired = {"spec": {"containers": [container]}}
    live = {"spec": {"containers": [{"name": "proxy", "env": [{"name": "APPS"}, {"name": "X"}],
                                     "readinessProbe": {"periodSeconds": 2}}]}}  # fmt: skip
    found = [str(d) for d in drift.differences(desired, live)]
    assert found == ["spec.containers[proxy].env[X].value is missing, the manifest sets '1'"]
    live["spec"]["containers"][0]["readinessProbe"]["initialDelaySeconds"] = 5
    found = [str(d) for d in drift.differences(desired, live)]
    assert (
        "spec.containers[proxy].readinessProbe.initialDelaySeconds is 5, the manifest sets 0"
        in found
    )


def test_resource_quantities_compare_as_amounts():
    """The API server stores quantities canonically: 2000m is 2, 1024Mi is 1Gi; a different
    amount is drift, and so is the same text anywhere a quantity is not expected."""
    desired = {"resources": {"limits": {"cpu": "2000m", "memory": "1024Mi"},
                             "requests": {"cpu": "100m", "memory": 1}},
               "metadata": {"annotations": {"a": "2000m"}}}  # fmt: skip
    live = {"resources": {"limits": {"cpu": "2", "memory": "1Gi"},
                          "requests": {"cpu": "200m", "memory": "1"}},
            "metadata": {"annotations": {"a": "2"}}}  # fmt: skip
    found = [str(d) for d in drift.differences(desired, live)]
    assert found == [
        "resources.requests.cpu is '200m', the manifest sets '100m'",
        "metadata.annotations.a is '2', the manifest sets '2000m'",
    ]


def test_the_report_and_exit_code_come_from_the_results():
    def check(description: str) -> Check:
        return Check(category="meshctl-x", description=description, run=lambda _ctx: Result.ok())

    ran = [
        Ran(check=check("fine"), result=Result.ok("2/2")),
        Ran(check=check("warned"), result=Result.warn("odd", hint="look")),
    ]
    assert exit_code(ran) == 0
    assert "✔ fine (2/2)" in report_text(ran)
    assert "⚠ warned: odd" in report_text(ran)
    broken = [*ran, Ran(check=check("broken"), result=Result.fail("gone", hint="reinstall"))]
    assert exit_code(broken) == 3
    text = report_text(broken)
    assert "✘ broken: gone\n    Hint: reinstall" in text
    assert "(1 failed)" in text
    as_json = report_json(broken)
    assert as_json["success"] is False
    assert [c["result"] for c in as_json["categories"][0]["checks"]] == [
        Outcome.OK.value, Outcome.WARN.value, Outcome.FAIL.value,
    ]  # fmt: skip
    # A failure without a hint still gets one (every ✘ has a hint).
    bare = [Ran(check=check("bare"), result=Result(outcome=Outcome.FAIL, message="x"))]
    assert "Hint:" in report_text(bare)
