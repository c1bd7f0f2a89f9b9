"""The ingress gateway's part of install (the demo profile): its Service and Deployment.

Istio's demo gateway, with meshctl's names: Service ``meshctl-ingressgateway`` (LoadBalancer;
80 -> 8080 ``http2``, 443 -> 8443 ``https``, 31400 ``tcp``, 15443 ``tls``, and the status port
15021) in front of a Deployment running ``meshctl gateway run --gateway ingress``: the proxy of
every Ingress of class ``meshctl`` and of the Gateways that select it, in the container the
controller renders for a Gateway's own proxy (``core.k8s.gatewaypod``: the proxy env pointing
CA and discovery at the control plane of its revision, the projected token and the mesh root
mounted, ready on 15021 once its config arrived and its listeners are bound). The control plane
sends it the Ingress table on 8080 (HTTP) and 8443 (HTTPS), the Service's target ports
(``core.gateway.ingress.GATEWAY_PORTS``); nothing listens on 31400/15443 (TCP and TLS routes are
not supported: connections there are refused).
"""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.core.gateway.ingress import GATEWAY_PORTS
from meshctl.core.k8s import gatewaypod
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.core.k8s.install.components import Component, Object, Values
from meshctl.core.k8s.install.values import value
from meshctl.structured import Json

NAME = "meshctl-ingressgateway"
INGRESS = "ingress"  # the config it asks the control plane for: every Ingress of our class
MAX_GATEWAY_REPLICAS = 100
# (name, service port, target port): the seed's demo gateway ports.
PORTS = (
    ("http2", 80, GATEWAY_PORTS[0]),
    ("https", 443, GATEWAY_PORTS[1]),
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
    proxy = gatewaypod.proxy_container(INGRESS, [(n, t) for n, _, t in PORTS], settings)
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
                    "volumes": gatewaypod.proxy_volumes(settings),
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
