"""Objects of any shape (a file given with -f holds whatever its author wrote) never stop a
family of checks: no MSH0001, no exception, whatever value sits where a field is expected."""

from __future__ import annotations

from typing import Any

from hypothesis import given, settings
from hypothesis import strategies as st

from meshctl.core.analyze.snapshot import Item, Snapshot

from .objects import healthy, run

KINDS = (
    "Namespace", "Pod", "Service", "Deployment", "DaemonSet", "StatefulSet", "CronJob",
    "MutatingWebhookConfiguration", "AuthorizationPolicy",
)  # fmt: skip
SCALARS = st.none() | st.booleans() | st.integers(-2, 70000) | st.text(max_size=8)
KEYS = (
    "name", "port", "ports", "targetPort", "containerPort", "matchLabels", "matchExpressions",
    "key", "operator", "values", "rules", "to", "operation", "selector", "containers",
    "template", "spec", "metadata", "labels", "webhooks", "namespaceSelector", "objectSelector",
    "apiGroups", "operations", "resources", "appProtocol", "protocol", "hostNetwork", "kind",
    "ownerReferences", "phase",
)  # fmt: skip
JSON = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.sampled_from(KEYS), inner, max_size=4)
    ),
    max_leaves=12,
)
LABEL_KEYS = (
    "app", "istio-injection", "istio.io/rev", "istio.io/dataplane-mode", "istio.io/tag",
    "app.kubernetes.io/name", "sidecar.istio.io/inject", "meshctl-injection",
)  # fmt: skip
LABEL_VALUES = ("enabled", "ambient", "web", "meshctl", "meshctl-controlplane")
LABELS = st.dictionaries(
    st.sampled_from(LABEL_KEYS), SCALARS | st.sampled_from(LABEL_VALUES), max_size=4
)
# The fields the checks read, each present or not and holding anything.
SPEC_KEYS = (
    "containers", "initContainers", "hostNetwork", "ports", "selector", "rules", "template",
    "jobTemplate", "targetRef", "type",
)  # fmt: skip
SPEC = st.fixed_dictionaries({}, optional=dict.fromkeys(SPEC_KEYS, JSON))


@st.composite
def hostile(draw: st.DrawFn) -> dict[str, Any]:
    kind = draw(st.sampled_from(KINDS))
    group = "security.istio.io/v1" if kind == "AuthorizationPolicy" else "v1"
    metadata: Any = {
        "name": "x",
        "namespace": "shop",
        "labels": draw(LABELS | JSON),
        "annotations": draw(LABELS | JSON),
        "ownerReferences": draw(JSON),
    }
    return {
        "apiVersion": group,
        "kind": kind,
        "metadata": metadata,
        "spec": draw(SPEC | JSON),
        "webhooks": draw(JSON),
        "status": draw(JSON),
    }


@settings(max_examples=300, deadline=None)
@given(st.lists(hostile(), min_size=1, max_size=4))
def test_no_object_shape_stops_a_family(objects):
    snapshot_objects = [*healthy(), *objects]
    found = run(snapshot_objects)
    assert [f for f in found if f.code.id == "MSH0001"] == []
    Snapshot(tuple(Item(o) for o in snapshot_objects)).workloads()
