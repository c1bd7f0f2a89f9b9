"""The CNI node agent's part of install and verify.

One shared component (``meshctl.components`` entry point ``cni``): the DaemonSet that runs
``meshctl cni install`` on every node, with its RBAC. Checks: the DaemonSet runs ready on every
node, and every node's agent reports our entry in the runtime's CNI config (its ``/status``,
read through the API server's pod proxy), naming a node where another component keeps
rewriting the config; in ambient mode every node's agent can enroll a pod (``checks.py``), and
(also before an install) no pod is left redirected for a node proxy that is gone.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from meshctl.core.k8s.install.checks import Check, Result
from meshctl.core.k8s.install.components import Component, Object, Values
from meshctl.core.k8s.install.context import CheckContext, rollout
from meshctl.core.k8s.install.manifest import Rendered
from meshctl.errors import KubeError

from .checks import agent_status, enrollable, leftovers
from .manifest import NAME, CniValues, objects

CATEGORY = "meshctl-cni"


def _render(values: Values, own: CniValues) -> list[Object]:
    # The install renders the mesh's Namespace itself (with its install record).
    return objects(values.install, own)


def _daemonset(ctx: CheckContext) -> tuple[Rendered | None, Mapping[str, object] | None]:
    items = ctx.of("cni", "DaemonSet")
    return (items[0], ctx.live(items[0])) if items else (None, None)


def _ready(ctx: CheckContext) -> Result:
    return rollout(
        ctx,
        "cni",
        "DaemonSet",
        absent="the CNI node agent is not part of this install",
        missing="new pods get no traffic capture",
    )


def _conflist(ctx: CheckContext) -> Result:
    item, live = _daemonset(ctx)
    if item is None:
        return Result.skip("the CNI node agent is not part of this install")
    if live is None:
        return Result.skip(f"{item.key} not found")
    pods = [p for p in ctx.cluster.pods(live) if (p.get("status") or {}).get("phase") == "Running"]
    if not pods:
        return Result.fail(
            "no CNI node agent pod is running",
            hint=f"see 'kubectl -n {item.key.namespace} get pods -l app.kubernetes.io/name={NAME}'",
        )
    failed, warned, fine = [], [], []
    for pod in pods:
        node = (pod.get("spec") or {}).get("nodeName", "?")
        try:
            status = agent_status(ctx, pod)
        except (KubeError, json.JSONDecodeError) as exc:
            failed.append(f"node {node}: cannot read the agent's status: {exc}")
            continue
        repairs = int(status.get("repairs") or 0)
        window = int(status.get("repairWindowSeconds") or 60)
        if not status.get("ready"):
            failed.append(f"node {node}: {status.get('reason')}")
        elif repairs > int(status.get("conflictRepairs") or 5):
            failed.append(
                f"node {node}: our entry was removed and put back {repairs} times in {window}s: "
                "another component keeps rewriting the CNI config"
            )
        elif repairs:
            warned.append(
                f"node {node}: our entry was removed and put back {repairs} times in {window}s"
            )
        else:
            fine.append(node)
    if failed:
        return Result.fail(
            f"{len(failed)} of {len(pods)} nodes lack our entry in their CNI config",
            hint="pods started there now run without capture; stop whatever rewrites the "
            "node's CNI config (e.g. Cilium with cni.exclusive=true, a second CNI installer), "
            "then 'meshctl install' again",
            details=failed + warned,
        )
    if warned:
        return Result.warn(
            "our CNI entry was rewritten recently (the node agent put it back)",
            hint="something on the node edits the CNI config; pods started meanwhile may "
            "lack capture",
            details=warned,
        )
    return Result.ok(f"{len(fine)} node{'s' * (len(fine) != 1)}")


cni = Component(
    name="cni",
    title="CNI node agent",
    phase=10,
    revisioned=False,
    values_type=CniValues,
    profiles={
        "default": CniValues(),
        "ambient": CniValues(ambient=True),
        "ambient-istiod": CniValues(ambient=True),
        "demo": CniValues(),
    },
    render=_render,
    checks=(
        Check(category=CATEGORY, description="CNI node agent is ready on every node", run=_ready),
        Check(
            category=CATEGORY,
            description="our entry is in every node's CNI config",
            run=_conflist,
        ),
        Check(
            category=CATEGORY,
            description="ambient pods can be enrolled on every node",
            run=enrollable,
        ),
        Check(
            category=CATEGORY,
            description="no pod is redirected to a node proxy that is gone",
            run=leftovers,
            stage="both",
        ),
    ),
)
