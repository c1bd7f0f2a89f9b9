"""``meshctl verify --workload NS/POD`` for an ambient pod: what its node holds for it.

An ambient pod has no proxy of its own: the node agent captured it (the pod's
``ambient.istio.io/redirection`` annotation) and the node proxy on its node serves it from
inside its netns. So the checks read that node proxy as ``istioctl ztunnel-config`` does: its
``/config_dump`` (``workloadState``: the pod by uid, with the certificate of its identity)
through port forwarding, and its metrics (connections by the pod's identity) through the API
server's pod proxy; a pod that should be enrolled but is not gets the agent's own error.
Invariant: read-only; every failure names the pod, the node and the fix.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from meshctl.core.k8s import ambient
from meshctl.core.k8s.install.checks import Result
from meshctl.errors import KubeError

from .manifest import NAME as NODE_PROXY

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Pod

ADMIN_PORT = 15000
METRICS_PORT = 15020


def pod_identity(ctx: Any, pod: Pod) -> str:
    """The SPIFFE id the pod's certificate must name: its namespace and service account in the
    mesh's trust domain."""
    account = (pod.get("spec") or {}).get("serviceAccountName") or "default"
    namespace = pod["metadata"]["namespace"]
    return f"spiffe://{ctx.values.trust_domain}/ns/{namespace}/sa/{account}"


def enrolled_state(pod: Pod) -> str | None:
    """The agent's annotation on ``pod`` (enabled, pending) or None."""
    value = ((pod.get("metadata") or {}).get("annotations") or {}).get(ambient.REDIRECTION)
    return str(value) if value else None


def wants_ambient(ctx: Any, pod: Pod) -> ambient.Enrollment:
    from meshctl.kube import objects
    from meshctl.kube.resources import NAMESPACES

    namespace = objects.get(ctx.kube, NAMESPACES, str(pod["metadata"]["namespace"]))
    return ambient.enrollment(pod, namespace)


def node_proxy(ctx: Any, pod: Pod) -> Pod | None:
    """The running node proxy pod on ``pod``'s node (memoised per run)."""
    from meshctl.kube import objects
    from meshctl.kube.resources import PODS

    node = (pod.get("spec") or {}).get("nodeName")
    key = ("node-proxy", node)
    if key not in ctx.memo:
        items, _ = objects.list_objects(
            ctx.kube,
            PODS,
            ctx.values.namespace,
            label_selector=f"app.kubernetes.io/name={NODE_PROXY}",
            field_selector=f"spec.nodeName={node}",
        )
        ctx.memo[key] = ambient.serving_node_proxy(items)  # the new one, during a handover
    found: Pod | None = ctx.memo[key]
    return found


def not_enrolled(ctx: Any, pod: Pod, workload: str) -> Result:
    """The pod has no sidecar and no enrollment: why, with the fix for either mode."""
    namespace, name = pod["metadata"]["namespace"], pod["metadata"]["name"]
    decision = wants_ambient(ctx, pod)
    if not decision.enrolled:
        return Result.fail(
            f"pod {workload} is not meshed: no istio-proxy container, and not in ambient mode "
            f"({decision.reason})",
            hint="ambient: label its namespace istio.io/dataplane-mode=ambient (no restart); "
            "sidecar: label it for injection (meshctl-injection=enabled or istio.io/rev) and "
            "restart it",
        )
    return Result.fail(
        f"pod {workload} should be in ambient mode ({decision.reason}) but the node agent has "
        "not enrolled it",
        hint=f"see its events ('kubectl -n {namespace} describe pod {name}': "
        "AmbientEnrollmentFailed says why) and 'meshctl verify' "
        "(ambient pods can be enrolled on every node); a pod started before the agent needs a "
        "restart",
    )


def identity(  # noqa: PLR0911 (one answer per finding)
    ctx: Any, pod: Pod, mesh_roots: Callable[[], set[str]]
) -> Result:
    """The node proxy on the pod's node serves it with its identity's certificate."""
    from meshctl.kube.portforward import http_get

    workload = f"{pod['metadata']['namespace']}/{pod['metadata']['name']}"
    state = enrolled_state(pod)
    if state is None:
        return not_enrolled(ctx, pod, workload)
    node = (pod.get("spec") or {}).get("nodeName", "?")
    if state != ambient.REDIRECTION_ENABLED:
        return Result.fail(
            f"pod {workload} is captured ({ambient.REDIRECTION}={state}) but no node proxy on "
            f"node {node} took it",
            hint=f"is the node proxy running there? 'kubectl -n {ctx.values.namespace} get pods "
            f"-l app.kubernetes.io/name={NODE_PROXY} -o wide'",
        )
    proxy = node_proxy(ctx, pod)
    if proxy is None:
        return Result.fail(
            f"no node proxy runs on node {node}: pod {workload} refuses every connection",
            hint=f"'kubectl -n {ctx.values.namespace} describe daemonset {NODE_PROXY}'",
        )
    name = proxy["metadata"]["name"]
    try:
        status, body = http_get(ctx.kube, ctx.values.namespace, name, ADMIN_PORT, "/config_dump")
        dump = json.loads(body)
    except (KubeError, ValueError) as exc:
        return Result.fail(
            f"cannot read the node proxy {name}'s /config_dump: {exc}",
            hint=f"'kubectl -n {ctx.values.namespace} logs {name}'",
        )
    if status != 200:
        return Result.fail(f"/config_dump of {name} answered {status}", hint="see its log")
    entry = (dump.get("workloadState") or {}).get(str(pod["metadata"].get("uid")))
    if not entry:
        return Result.fail(
            f"the node proxy {name} on node {node} does not serve pod {workload}",
            hint="the node agent hands pods over ZDS: see both logs; restarting the pod "
            "enrolls it again",
        )
    expected = pod_identity(ctx, pod)
    cert = entry.get("certificate") or {}
    chain = cert.get("certChain") or []
    if not chain or cert.get("state") != "Available":
        return Result.fail(
            f"the node proxy holds no usable certificate for {expected} "
            f"({cert.get('state', 'none')})",
            hint="it asks the control plane's CA for each pod's identity: see its log and the "
            "control plane's",
        )
    sans = chain[0].get("uriSans") or []
    if expected not in sans:
        return Result.fail(
            f"the pod's certificate is for {', '.join(sans) or 'no identity'}, not {expected}",
            hint="the pod's service account and the mesh's trust domain must match",
        )
    roots = {r.get("serialNumber") for r in cert.get("rootCerts") or ()}
    mesh = mesh_roots()
    if mesh and not roots & mesh:
        return Result.fail(
            "the node proxy trusts a root other than the mesh's for this pod",
            hint="restart the node proxy: its root comes from the mesh's root ConfigMap",
        )
    return Result.ok(
        f"{expected} (ambient, node proxy {name} on node {node}), valid until "
        f"{chain[0].get('expirationTime', '?')}"
    )


def metrics_text(ctx: Any, pod: Pod) -> tuple[str, str] | Result:
    """The node proxy's metrics for ``pod``'s node and the identity to look for, or a Result
    saying why there are none to read."""
    from meshctl.kube import api

    if enrolled_state(pod) != ambient.REDIRECTION_ENABLED:
        return Result.skip("not served by a node proxy")
    proxy = node_proxy(ctx, pod)
    if proxy is None:
        return Result.skip("no node proxy on its node")
    meta = proxy["metadata"]
    path = f"/api/v1/namespaces/{meta['namespace']}/pods/{meta['name']}:{METRICS_PORT}"
    try:
        text = api.request_text(ctx.kube, f"{path}/proxy/stats/prometheus")
    except KubeError as exc:
        return Result.fail(
            f"cannot read the node proxy's metrics: {exc.message}", hint="is it ready?"
        )
    return text, pod_identity(ctx, pod)
