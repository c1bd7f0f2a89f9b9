"""The node proxy's part of install (the ambient profile): its DaemonSet and verify check.

The objects are ``manifest.objects`` (also ``meshctl ztunnel manifest``), with the control plane of
the installed revision as CA and discovery and the install's image pull policy.
"""

from __future__ import annotations

from meshctl.core.k8s.install.checks import Check, Result
from meshctl.core.k8s.install.components import Component, Object, Values
from meshctl.core.k8s.install.context import CheckContext, rollout

from .manifest import NodeProxyValues, objects

# The ambient-istiod profile: the node proxy of an istiod, with the defaults of Istio's ztunnel
# chart (its address, its root ConfigMap, its token audience). istiod must trust the proxy's
# account as a node proxy: its chart's trustedZtunnelNamespace/trustedZtunnelName.
ISTIOD_ADDRESS = "istiod.istio-system.svc:15012"
BESIDE_ISTIOD = NodeProxyValues(
    ca_address=ISTIOD_ADDRESS,
    xds_address=ISTIOD_ADDRESS,
    trust_bundle_name="istio-ca-root-cert",
    token_audience="istio-ca",  # noqa: S106 -- an audience name, not a secret
)


def _render_node_proxy(values: Values, own: NodeProxyValues) -> list[Object]:
    # The control plane of the installed revision is CA and discovery.
    plane = values.control_plane_address
    return objects(values.install, own, ca_address=plane, xds_address=plane)


def _node_proxy_ready(ctx: CheckContext) -> Result:
    return rollout(
        ctx,
        "ztunnel",
        "DaemonSet",
        absent="the node proxy is not part of this install (ambient profile)",
        missing="ambient pods have no node proxy",
    )


node_proxy = Component(
    name="ztunnel",
    title="Node proxy",
    phase=20,
    revisioned=False,
    values_type=NodeProxyValues,
    profiles={"ambient": NodeProxyValues(), "ambient-istiod": BESIDE_ISTIOD},
    render=_render_node_proxy,
    checks=(
        Check(
            category="meshctl-ztunnel",
            description="node proxy is ready on every node",
            run=_node_proxy_ready,
        ),
    ),
)
