"""The node proxy's part of install (the ambient profile): its DaemonSet and verify check.

The objects are ``manifest.objects`` (also ``meshctl ztunnel manifest``), with the control plane of
the installed revision as CA and discovery and the install's image pull policy.
"""

from __future__ import annotations

from typing import Any

from meshctl.core.k8s.install.checks import Check, Result
from meshctl.core.k8s.install.components import Component, Values
from meshctl.core.k8s.install.context import CheckContext, rollout
from meshctl.core.k8s.install.values import Field

from . import manifest as node_manifest
from .settings import MAX_WORKERS


def _render_node_proxy(values: Values) -> list[dict[str, Any]]:
    own = values.component("ztunnel")
    plane = f"{values.revisioned('meshctl-controlplane')}.{values.namespace}.svc:15012"
    items = node_manifest.objects(
        namespace=values.namespace,
        image=values.image,
        ca_address=plane,
        xds_address=plane,
        workers=own["workers"],
    )
    for item in items:
        if item["kind"] == "DaemonSet":
            for container in item["spec"]["template"]["spec"]["containers"]:
                container["imagePullPolicy"] = values.image_pull_policy
    return items


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
    schema={
        "workers": Field(
            kind="int",
            default=1,
            minimum=1,
            maximum=MAX_WORKERS,
            help="data-plane workers per node",
        ),
    },
    profiles={"ambient": {"enabled": True}},
    render=_render_node_proxy,
    checks=(
        Check(
            category="meshctl-ztunnel",
            description="node proxy is ready on every node",
            run=_node_proxy_ready,
        ),
    ),
)
