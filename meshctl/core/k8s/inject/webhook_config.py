"""The MutatingWebhookConfiguration that sends new pods to the injection webhook.

Owns the selector matrix: which namespaces and pods go to which webhook. Invariants: for any
namespace labels and pod labels at most one of the webhooks matches (so a pod is injected once
per admission pass); system namespaces never match; ``failurePolicy: Fail`` (a pod that should
be meshed is never silently created without its proxy) and ``sideEffects: None``.

Selection, for the default revision:
- namespace ``meshctl-injection=enabled`` (or Istio's ``istio-injection=enabled``), unless the
  pod has the label ``sidecar.istio.io/inject=false``;
- any other unlabelled namespace: pods labelled ``sidecar.istio.io/inject=true``;
and for revision R (``default`` included): namespaces labelled ``istio.io/rev=R``, or pods
labelled ``istio.io/rev=R`` in namespaces with none of those labels.
"""

from __future__ import annotations

import base64
from dataclasses import dataclass
from typing import TYPE_CHECKING

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.admission import INJECT_PATH
from meshctl.core.k8s.inject.pipeline import IGNORED_NAMESPACES
from meshctl.core.k8s.layout import MESH_NAMESPACE
from meshctl.errors import ConfigError

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import (
        LabelSelectorRequirement,
        MutatingWebhook,
        WebhookClientConfig,
    )

NAMESPACE_LABEL = "meshctl-injection"
ISTIO_NAMESPACE_LABEL = "istio-injection"
NAMESPACE_NAME_LABEL = "kubernetes.io/metadata.name"  # set on every namespace by the API server
WEBHOOK_DOMAIN = "sidecar-injector.meshctl.io"
REINVOCATION_POLICIES = ("Never", "IfNeeded")


@dataclass(frozen=True, slots=True, kw_only=True)
class WebhookTarget:
    """Where the API server sends AdmissionReviews: a URL, or a Service in the cluster."""

    url: str | None = None
    service: str | None = None
    namespace: str = MESH_NAMESPACE
    port: int = 443
    path: str = INJECT_PATH

    def client_config(self, ca_bundle: bytes | None) -> WebhookClientConfig:
        """The webhook's ``clientConfig`` (without ``caBundle`` when ``ca_bundle`` is None)."""
        config: WebhookClientConfig
        if self.url is not None:
            if not self.url.startswith("https://"):
                raise ConfigError(
                    f"webhook URL {self.url!r} is not https://",
                    hint="the API server calls webhooks over TLS only",
                )
            config = {"url": self.url}
        elif self.service:
            if not 0 < self.port < 65536:
                raise ConfigError(f"service port {self.port} is out of range", hint="use 1-65535")
            config = {
                "service": {
                    "name": self.service,
                    "namespace": self.namespace,
                    "path": self.path,
                    "port": self.port,
                }
            }
        else:
            raise ConfigError("no webhook target", hint="give --url or --service")
        if ca_bundle is not None:
            config["caBundle"] = base64.b64encode(ca_bundle).decode()
        return config


def configuration_name(revision: str) -> str:
    """``meshctl-sidecar-injector`` (default revision) or ``meshctl-sidecar-injector-<rev>``."""
    return "meshctl-sidecar-injector" + ("" if revision == "default" else f"-{revision}")


def webhook_configuration(
    *,
    ca_bundle: bytes | None,
    target: WebhookTarget,
    revision: str = "default",
    reinvocation_policy: str = "Never",
    timeout_seconds: int = 10,
) -> dict[str, object]:
    """The MutatingWebhookConfiguration object for ``revision``, ready to apply.

    ``ca_bundle`` None leaves ``caBundle`` out: the control plane's leader patches it in.
    """
    if ca_bundle is not None and b"-----BEGIN CERTIFICATE-----" not in ca_bundle:
        raise ConfigError(
            "the CA bundle holds no PEM certificate",
            hint="pass the CA certificate (PEM) that signed the webhook's serving certificate",
        )
    if reinvocation_policy not in REINVOCATION_POLICIES:
        raise ConfigError(
            f"invalid reinvocation policy {reinvocation_policy!r}",
            hint="use " + " or ".join(REINVOCATION_POLICIES),
        )
    if not 1 <= timeout_seconds <= 30:
        raise ConfigError(
            f"webhook timeout {timeout_seconds}s is out of range",
            hint="the API server accepts 1 to 30 seconds",
        )
    client_config = target.client_config(ca_bundle)

    def webhook(
        name: str, namespace: list[LabelSelectorRequirement], pod: list[LabelSelectorRequirement]
    ) -> MutatingWebhook:
        return {
            "name": f"{name}.{WEBHOOK_DOMAIN}",
            "admissionReviewVersions": ["v1", "v1beta1"],
            "clientConfig": client_config,
            "failurePolicy": "Fail",
            "matchPolicy": "Equivalent",
            "namespaceSelector": {"matchExpressions": [*namespace, not_system]},
            "objectSelector": {"matchExpressions": pod},
            "reinvocationPolicy": reinvocation_policy,
            "rules": [
                {
                    "apiGroups": [""],
                    "apiVersions": ["v1"],
                    "operations": ["CREATE"],
                    "resources": ["pods"],
                    "scope": "*",
                }
            ],
            "sideEffects": "None",
            "timeoutSeconds": timeout_seconds,
        }

    not_system = _expr(NAMESPACE_NAME_LABEL, "NotIn", sorted(IGNORED_NAMESPACES))
    no_meshctl_label = _expr(NAMESPACE_LABEL, "DoesNotExist")
    no_istio_label = _expr(ISTIO_NAMESPACE_LABEL, "DoesNotExist")
    no_rev_label = _expr(ann.REVISION_LABEL, "DoesNotExist")
    not_opted_out = _expr(ann.INJECT, "NotIn", ["false"])
    webhooks = []
    if revision == "default":
        webhooks += [
            webhook("namespace", [_expr(NAMESPACE_LABEL, "In", ["enabled"])], [not_opted_out]),
            webhook(
                "istio-namespace",
                [_expr(ISTIO_NAMESPACE_LABEL, "In", ["enabled"]), no_meshctl_label],
                [not_opted_out],
            ),
            webhook(
                "object",
                [no_meshctl_label, no_istio_label, no_rev_label],
                [_expr(ann.INJECT, "In", ["true"]), no_rev_label],
            ),
        ]
    webhooks += [
        webhook(
            f"{'' if revision == 'default' else revision + '.'}rev.namespace",
            [_expr(ann.REVISION_LABEL, "In", [revision]), no_meshctl_label, no_istio_label],
            [not_opted_out],
        ),
        webhook(
            f"{'' if revision == 'default' else revision + '.'}rev.object",
            [no_rev_label, no_meshctl_label, no_istio_label],
            [not_opted_out, _expr(ann.REVISION_LABEL, "In", [revision])],
        ),
    ]
    return {
        "apiVersion": "admissionregistration.k8s.io/v1",
        "kind": "MutatingWebhookConfiguration",
        "metadata": {
            "name": configuration_name(revision),
            "labels": {"app.kubernetes.io/name": "meshctl", ann.REVISION_LABEL: revision},
        },
        "webhooks": webhooks,
    }


def _expr(key: str, operator: str, values: list[str] | None = None) -> LabelSelectorRequirement:
    expression: LabelSelectorRequirement = {"key": key, "operator": operator}
    if values is not None:
        expression["values"] = values
    return expression
