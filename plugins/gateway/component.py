"""The ingress gateway's part of install (the demo profile): its Service and Deployment shape.

Istio's demo gateway, with meshctl's names: Service ``meshctl-ingressgateway`` (LoadBalancer;
80 -> 8080 ``http2``, 443 -> 8443 ``https``, 31400 ``tcp``, 15443 ``tls``, and the status port
15021) in front of a Deployment whose ``istio-proxy`` container is the proxy the injector renders
(``meshctl ztunnel run``: an identity from the control plane of its revision, discovery, readiness
on 15021), as a regular container without capture. The gateway's own routing of those ports is a
later issue: today the pods come up Ready with their identity and the Service's shape is fixed,
but nothing listens on 8080/8443/31400/15443 yet (connections there are refused).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject import render
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.core.k8s.install.components import Component, Object, Values
from meshctl.core.k8s.install.values import value
from meshctl.structured import Json

NAME = "meshctl-ingressgateway"
MAX_GATEWAY_REPLICAS = 100
# (name, service port, target port): the seed's demo gateway ports.
PORTS = (
    ("http2", 80, 8080),
    ("https", 443, 8443),
    ("tcp", 31400, 31400),
    ("tls", 15443, 15443),
)
STATUS_PORT = 15021


@dataclass(frozen=True, slots=True, kw_only=True)
class GatewayValues:
    """The ingress gateway's values (``components.gateway.*``)."""

    replicas: int = value(1, minimum=1, maximum=MAX_GATEWAY_REPLICAS, help="gateway replicas")
    service_type: str = value(
        "LoadBalancer",
        choices=("ClusterIP", "NodePort", "LoadBalancer"),
        help="the gateway Service's type",
    )


def _render(values: Values, own: GatewayValues) -> list[Object]:
    name = values.revisioned(NAME)
    labels = {"app": NAME, "istio": "ingressgateway", "app.kubernetes.io/name": NAME}
    settings = InjectSettings(
        image=values.image,
        image_pull_policy=values.image_pull_policy,
        revision=values.revision,
        trust_domain=values.trust_domain,
        ca_address=values.control_plane_address,
    )
    options = render.pod_options({ann.NATIVE_SIDECAR: "false"}, settings)
    proxy = render.proxy_container(
        options, settings, workload_name=name, app_containers=[], probers={}
    )
    proxy["ports"] = [
        *(render.container_port(n, t) for n, _, t in PORTS),
        *proxy["ports"],
    ]
    selector = {"app": NAME, "istio.io/rev": values.revision}
    meta: dict[str, Json] = {"name": name, "namespace": values.namespace, "labels": dict(labels)}
    deployment: Object = {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": meta,
        "spec": {
            "replicas": own.replicas,
            "selector": {"matchLabels": dict(selector)},
            "template": {
                "metadata": {
                    # Not injected: the gateway's proxy is its main container.
                    "labels": {**labels, **selector, "sidecar.istio.io/inject": "false"},
                },
                "spec": {
                    "serviceAccountName": name,
                    "containers": [proxy],
                    "volumes": render.volumes(settings, options),
                },
            },
        },
    }
    service: Object = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": dict(meta, labels=dict(labels)),
        "spec": {
            "type": own.service_type,
            "selector": dict(selector),
            "ports": [
                {
                    "name": "status-port",
                    "port": STATUS_PORT,
                    "targetPort": STATUS_PORT,
                    "protocol": "TCP",
                },
                *({"name": n, "port": p, "targetPort": t, "protocol": "TCP"} for n, p, t in PORTS),
            ],
        },
    }
    account: Object = {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": dict(meta, labels=dict(labels)),
    }
    return [account, service, deployment]


gateway = Component(
    name="gateway",
    title="Ingress gateway",
    phase=30,
    revisioned=True,
    values_type=GatewayValues,
    profiles={"demo": GatewayValues()},
    render=_render,
)
