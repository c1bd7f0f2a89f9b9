"""The MutatingWebhookConfiguration: fields the API server needs, and the selector matrix."""

from __future__ import annotations

import base64
import itertools
from typing import Any

import pytest

from meshctl.core.k8s.inject.webhook_config import WebhookTarget, webhook_configuration
from meshctl.errors import ConfigError

CA = b"-----BEGIN CERTIFICATE-----\nMIIB\n-----END CERTIFICATE-----\n"


def config(revision: str = "default", **kw: Any) -> dict[str, Any]:
    target = kw.pop("target", WebhookTarget(url="https://127.0.0.1:15017/inject"))
    return webhook_configuration(ca_bundle=CA, target=target, revision=revision, **kw)


def selects(selector: dict[str, Any], labels: dict[str, str]) -> bool:
    """Kubernetes label-selector semantics (matchLabels and matchExpressions)."""
    for key, value in (selector.get("matchLabels") or {}).items():
        if labels.get(key) != value:
            return False
    for expr in selector.get("matchExpressions") or []:
        key, op, values = expr["key"], expr["operator"], expr.get("values", [])
        ok = {
            "In": key in labels and labels[key] in values,
            "NotIn": key not in labels or labels[key] not in values,
            "Exists": key in labels,
            "DoesNotExist": key not in labels,
        }[op]
        if not ok:
            return False
    return True


def matching(cfg: dict[str, Any], ns: dict[str, str], pod: dict[str, str]) -> list[str]:
    return [
        w["name"].split(".sidecar-injector")[0]
        for w in cfg["webhooks"]
        if selects(w["namespaceSelector"], ns) and selects(w["objectSelector"], pod)
    ]


def test_fields_the_api_server_needs():
    cfg = config()
    assert cfg["apiVersion"] == "admissionregistration.k8s.io/v1"
    assert cfg["kind"] == "MutatingWebhookConfiguration"
    assert cfg["metadata"]["name"] == "meshctl-sidecar-injector"
    for hook in cfg["webhooks"]:
        assert hook["failurePolicy"] == "Fail"
        assert hook["sideEffects"] == "None"
        assert hook["reinvocationPolicy"] == "Never"
        assert hook["admissionReviewVersions"] == ["v1", "v1beta1"]
        assert hook["rules"][0]["operations"] == ["CREATE"]
        assert hook["rules"][0]["resources"] == ["pods"]
        assert hook["clientConfig"]["url"] == "https://127.0.0.1:15017/inject"
        assert base64.b64decode(hook["clientConfig"]["caBundle"]) == CA
    assert len({h["name"] for h in cfg["webhooks"]}) == len(cfg["webhooks"])


def test_service_target_and_reinvocation():
    cfg = config(
        target=WebhookTarget(service="meshctl", namespace="mesh", port=443),
        reinvocation_policy="IfNeeded",
    )
    hook = cfg["webhooks"][0]
    assert hook["clientConfig"]["service"] == {
        "name": "meshctl",
        "namespace": "mesh",
        "path": "/inject",
        "port": 443,
    }
    assert hook["reinvocationPolicy"] == "IfNeeded"


@pytest.mark.parametrize(
    ("ns", "pod", "expected"),
    [
        ({"meshctl-injection": "enabled"}, {}, ["namespace"]),
        ({"istio-injection": "enabled"}, {}, ["istio-namespace"]),
        ({"meshctl-injection": "enabled", "istio-injection": "enabled"}, {}, ["namespace"]),
        ({"meshctl-injection": "enabled"}, {"sidecar.istio.io/inject": "false"}, []),
        ({"istio-injection": "enabled"}, {"sidecar.istio.io/inject": "false"}, []),
        ({}, {}, []),
        ({}, {"sidecar.istio.io/inject": "true"}, ["object"]),
        ({"meshctl-injection": "disabled"}, {"sidecar.istio.io/inject": "true"}, []),
        ({"istio-injection": "disabled"}, {"sidecar.istio.io/inject": "true"}, []),
        ({"istio.io/rev": "default"}, {}, ["rev.namespace"]),
        ({}, {"istio.io/rev": "default"}, ["rev.object"]),
        ({}, {"istio.io/rev": "canary"}, []),
        ({"kubernetes.io/metadata.name": "kube-system", "meshctl-injection": "enabled"}, {}, []),
    ],
)
def test_selector_matrix_default_revision(ns, pod, expected):
    assert matching(config(), ns, pod) == expected


def test_selector_matrix_named_revision():
    cfg = config("canary")
    assert cfg["metadata"]["name"] == "meshctl-sidecar-injector-canary"
    assert matching(cfg, {"istio.io/rev": "canary"}, {}) == ["canary.rev.namespace"]
    assert matching(cfg, {}, {"istio.io/rev": "canary"}) == ["canary.rev.object"]
    assert matching(cfg, {"meshctl-injection": "enabled"}, {}) == []
    assert matching(cfg, {"istio.io/rev": "default"}, {}) == []


def test_at_most_one_webhook_matches_any_labels():
    ns_choices = [
        {},
        *(
            {k: v}
            for k in ("meshctl-injection", "istio-injection")
            for v in ("enabled", "disabled")
        ),
        {"istio.io/rev": "default"},
        {"istio.io/rev": "canary"},
    ]
    pod_choices = [
        {},
        {"sidecar.istio.io/inject": "true"},
        {"sidecar.istio.io/inject": "false"},
        {"istio.io/rev": "default"},
        {"istio.io/rev": "canary"},
    ]
    configs = [config(), config("canary")]
    for a, b in itertools.product(ns_choices, repeat=2):
        ns = {**a, **b}
        for p, q in itertools.product(pod_choices, repeat=2):
            pod = {**p, **q}
            hits = [name for cfg in configs for name in matching(cfg, ns, pod)]
            assert len(hits) <= 1, (ns, pod, hits)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"target": WebhookTarget(url="http://x/inject")}, "not https"),
        ({"target": WebhookTarget()}, "no webhook target"),
        ({"reinvocation_policy": "Always"}, "reinvocation"),
        ({"timeout_seconds": 31}, "timeout"),
    ],
)
def test_bad_requests_are_config_errors(kw, message):
    with pytest.raises(ConfigError, match=message):
        config(**kw)


def test_a_bundle_without_a_certificate_is_refused():
    with pytest.raises(ConfigError, match="no PEM certificate"):
        webhook_configuration(ca_bundle=b"junk", target=WebhookTarget(url="https://x/inject"))
