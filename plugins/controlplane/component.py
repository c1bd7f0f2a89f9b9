"""The control plane's part of install and verify: its CRDs, its objects, and its checks.

Two components (``meshctl.components`` entry points): ``crds`` (shared by every revision, CRDs
never pruned: AuthorizationPolicy, the Gateway API's standard channel, and the ``meshctl``
GatewayClass and IngressClass) and ``controlplane`` (one per revision: Deployment, Service,
RBAC, PDB and the injection webhook configuration of that revision). Checks: the Deployment
serves (replicas available), the CA root is valid and not near its end, every namespace holds
the root ConfigMap, and the webhook really injects (a server-side dry-run Pod comes back with
the sidecar).
"""

from __future__ import annotations

import datetime

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.webhook_config import (
    ISTIO_NAMESPACE_LABEL,
    NAMESPACE_LABEL,
    configuration_name,
)
from meshctl.core.k8s.inject.webhook_env import webhook_env
from meshctl.core.k8s.install.checks import Check, Result
from meshctl.core.k8s.install.components import Component, Made, NoValues, Object, Values
from meshctl.core.k8s.install.context import CheckContext
from meshctl.core.k8s.install.manifest import count
from meshctl.core.k8s.install.readiness import readiness
from meshctl.errors import KubeError

from . import crds, gateway_api
from .manifest import ControlPlaneValues, objects, root_config_map_aliases
from .roots import LABELS, ROOT_CONFIGMAP, ROOT_KEY

CATEGORY = "meshctl-controlplane"
ALL_PROFILES = ("default", "ambient", "minimal", "demo")
# Istio's self-signed root rotates when 20% of its life is left; say so before that.
ROOT_GRACE = 0.2


def _crds(values: Values, own: NoValues) -> list[Object]:
    return [*crds.objects(), *gateway_api.objects(), *gateway_api.classes()]


def _controlplane(values: Values, own: ControlPlaneValues) -> list[Object]:
    env = [
        # The webhook's injector follows the install: the image, and CNI mode when the CNI
        # node agent captures traffic (no privileged init container in application pods).
        ("MESHCTL_INJECT_IMAGE", values.image),
        ("MESHCTL_INJECT_IMAGE_PULL_POLICY", values.image_pull_policy),
        ("MESHCTL_INJECT_CNI", "true" if values.enabled("cni") else "false"),
        *webhook_env(own.inject, "components.controlplane.inject"),
    ]
    return objects(values.install, own, extra_env=env)


def _made(values: Values, own: ControlPlaneValues) -> list[Made]:
    """The root ConfigMaps published under an alias name (Istio's istio-ca-root-cert) go with
    the revision that publishes them: left behind, a later istiod's proxies would trust our root
    until istiod rewrote them. Ours (meshctl-ca-root-cert) stays, as Istio's does."""
    labels = ",".join(f"{k}={v}" for k, v in sorted(LABELS.items()))
    return [
        Made(
            api_version="v1",
            kind="ConfigMap",
            label_selector=labels,
            field_selector=f"metadata.name={name}",
        )
        for name in root_config_map_aliases(own)
    ]


# -- checks ------------------------------------------------------------------------------------


def _deployment(ctx: CheckContext) -> Result:
    items = ctx.of("controlplane", "Deployment")
    if not items:
        return Result.skip("the control plane is not part of this install")
    item = items[0]
    live = ctx.live(item)
    if live is None:
        return Result.fail(
            f"{item.key} not found",
            hint="run 'meshctl install' again with the same profile and revision",
        )
    wanted = ctx.values.own("controlplane", ControlPlaneValues).replicas
    spec_replicas = count(live, "spec", "replicas", default=1)
    available = count(live, "status", "availableReplicas")
    if spec_replicas == 0:
        return Result.fail(
            f"{item.key} is scaled to 0: nothing issues certificates, serves discovery or injects",
            hint=f"'meshctl install' restores {wanted} replicas "
            f"(or kubectl -n {item.key.namespace} scale deployment {item.key.name} "
            f"--replicas={wanted})",
        )
    state = readiness(live)
    if available < 1 or not state.ready:
        detail = [state.reason]
        for pod in ctx.cluster.pods(live):
            from meshctl.kube.inventory import pod_problem

            problem = pod_problem(pod)
            if problem:
                detail.append(problem)
                break
        return Result.fail(
            f"{item.key}: {available} of {spec_replicas} replicas available",
            hint=f"see 'kubectl -n {item.key.namespace} describe deployment {item.key.name}' "
            "and the pods' logs; 'meshctl install' again converges once the cause is fixed",
            details=detail,
        )
    return Result.ok(f"{available}/{spec_replicas} replicas available")


def _root_bundle(ctx: CheckContext) -> tuple[str | None, str]:
    from meshctl.kube import objects as kube_objects
    from meshctl.kube.resources import CONFIG_MAPS

    if "root" not in ctx.memo:
        live = kube_objects.get(ctx.kube, CONFIG_MAPS, ROOT_CONFIGMAP, ctx.values.namespace)
        ctx.memo["root"] = ((live or {}).get("data") or {}).get(ROOT_KEY)
    bundle: str | None = ctx.memo["root"]
    return bundle, f"ConfigMap {ctx.values.namespace}/{ROOT_CONFIGMAP}"


def _ca_root(ctx: CheckContext) -> Result:  # noqa: PLR0911 (one answer per finding)
    from meshctl.core.pki import certs

    bundle, where = _root_bundle(ctx)
    if not bundle:
        return Result.fail(
            f"{where} holds no root certificate",
            hint="the control plane's leader publishes it once its CA is loaded: check the "
            "control plane pods' logs (a cacerts Secret it cannot use is named there)",
        )
    try:
        facts = certs.describe(bundle.encode())
    except ValueError as exc:
        return Result.fail(
            f"{where} does not parse as PEM certificates: {exc}",
            hint="delete the ConfigMap: the control plane rewrites it from its CA",
        )
    if not facts:
        return Result.fail(f"{where} holds no certificate", hint="delete the ConfigMap")
    now = datetime.datetime.now(datetime.UTC)
    for fact in facts:
        if fact.not_before > now:
            return Result.fail(
                f"root {fact.subject} is not valid before {fact.not_before:%Y-%m-%d %H:%M} UTC",
                hint="check the clocks of the nodes and of the machine that made the root",
            )
        if fact.not_after <= now:
            return Result.fail(
                f"root {fact.subject} expired on {fact.not_after:%Y-%m-%d}",
                hint="plug in a new root as the cacerts Secret (docs/controlplane.md, rotation)",
            )
        left = fact.not_after - now
        life = fact.not_after - fact.not_before
        if left < life * ROOT_GRACE:
            return Result.warn(
                f"root {fact.subject} expires on {fact.not_after:%Y-%m-%d} ({left.days} days left)",
                hint="rotate it before then (docs/controlplane.md, rotation)",
            )
    first = facts[0]
    return Result.ok(f"{first.subject}, valid until {first.not_after:%Y-%m-%d}")


def _roots_everywhere(ctx: CheckContext) -> Result:
    from meshctl.kube import objects as kube_objects
    from meshctl.kube.resources import CONFIG_MAPS, NAMESPACES

    bundle, where = _root_bundle(ctx)
    if not bundle:
        return Result.skip(f"no root in {where} yet")
    namespaces, _ = kube_objects.list_objects(ctx.kube, NAMESPACES)
    active = sorted(
        str(n["metadata"]["name"])
        for n in namespaces
        if not n["metadata"].get("deletionTimestamp")
        and (n.get("status") or {}).get("phase") != "Terminating"
    )
    own = ctx.values.own("controlplane", ControlPlaneValues)
    details: list[str] = []
    lacking: set[str] = set()
    for name in (ROOT_CONFIGMAP, *root_config_map_aliases(own)):
        maps, _ = kube_objects.list_objects(
            ctx.kube, CONFIG_MAPS, field_selector=f"metadata.name={name}"
        )
        held = {str(m["metadata"]["namespace"]): (m.get("data") or {}).get(ROOT_KEY) for m in maps}
        missing = [n for n in active if n not in held]
        stale = [n for n in active if n in held and held[n] != bundle]
        lacking.update(missing + stale)
        label = "" if name == ROOT_CONFIGMAP else f"{name}: "
        if missing:
            more = " ..." if len(missing) > 8 else ""
            details.append(f"{label}missing in {', '.join(missing[:8])}{more}")
        if stale:
            details.append(f"{label}a different root in {', '.join(stale[:8])}")
    if lacking:
        return Result.fail(
            f"{len(lacking)} of {len(active)} namespaces lack the current root",
            hint="the control plane's leader writes it into every namespace: is a control plane "
            "pod ready and leading (see its log and the Lease in "
            f"{ctx.values.namespace})?",
            details=details,
        )
    return Result.ok(f"{len(active)} namespaces")


def _probe_pod(ctx: CheckContext) -> tuple[str, dict[str, str], str]:
    """Where to create the dry-run pod: a namespace labelled for this revision, else the
    mesh's namespace with the pod itself labelled istio.io/rev (the rev.object webhook)."""
    from meshctl.kube import objects as kube_objects
    from meshctl.kube.resources import NAMESPACES

    revision = ctx.values.revision
    selectors = [f"{ann.REVISION_LABEL}={revision}"]
    if revision == "default":
        selectors = [f"{NAMESPACE_LABEL}=enabled", f"{ISTIO_NAMESPACE_LABEL}=enabled", *selectors]
    labels: dict[str, str] = {"app": "meshctl-verify"}
    for selector in selectors:
        found, _ = kube_objects.list_objects(ctx.kube, NAMESPACES, label_selector=selector)
        usable = [n for n in found if not n["metadata"].get("deletionTimestamp")]
        if usable:
            return str(usable[0]["metadata"]["name"]), labels, f"namespace labelled {selector}"
    labels[ann.REVISION_LABEL] = revision
    how = f"pod labelled {ann.REVISION_LABEL}={revision}"
    return ctx.values.namespace, labels, how


def _webhook(ctx: CheckContext) -> Result:
    from meshctl.kube import objects as kube_objects
    from meshctl.kube.resources import MUTATING_WEBHOOK_CONFIGURATIONS, PODS

    if not ctx.of("controlplane"):
        return Result.skip("the control plane is not part of this install")
    name = configuration_name(ctx.values.revision)
    if kube_objects.get(ctx.kube, MUTATING_WEBHOOK_CONFIGURATIONS, name) is None:
        return Result.fail(
            f"MutatingWebhookConfiguration {name} not found: new pods are not injected",
            hint="run 'meshctl install' again (same profile and revision) to recreate it",
        )
    namespace, labels, how = _probe_pod(ctx)
    pod = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"generateName": "meshctl-verify-", "namespace": namespace, "labels": labels},
        "spec": {
            "containers": [{"name": "app", "image": ctx.values.image, "command": ["sleep", "1"]}]
        },
    }
    try:
        answer = kube_objects.create(ctx.kube, PODS, pod, namespace, dry_run=True)
    except KubeError as exc:
        return Result.fail(
            f"a dry-run pod in {namespace} ({how}) was refused: {exc.message}",
            hint="the API server could not call the webhook: is the control plane ready, and "
            "can the API server reach its Service on 443 (a firewall or NetworkPolicy "
            "blocking port 15017)?",
        )
    spec = answer.get("spec") or {}
    names = [
        c.get("name")
        for c in (*(spec.get("initContainers") or ()), *(spec.get("containers") or ()))
    ]
    status = ((answer.get("metadata") or {}).get("annotations") or {}).get(ann.STATUS)
    if "istio-proxy" not in names or not status:
        return Result.fail(
            f"a dry-run pod in {namespace} ({how}) came back without the sidecar",
            hint=f"compare MutatingWebhookConfiguration {name}'s selectors with the manifest "
            "('meshctl verify' lists drift) and run 'meshctl install' again",
        )
    return Result.ok(f"a dry-run pod in {namespace} ({how}) came back injected")


crds_component = Component(
    name="crds",
    title="CRDs",
    phase=0,
    revisioned=False,
    values_type=NoValues,
    profiles=dict.fromkeys(ALL_PROFILES, NoValues()),
    render=_crds,
)

controlplane = Component(
    name="controlplane",
    title="Control plane",
    phase=20,
    revisioned=True,
    values_type=ControlPlaneValues,
    profiles=dict.fromkeys(ALL_PROFILES, ControlPlaneValues()),
    render=_controlplane,
    made=_made,
    checks=(
        Check(category=CATEGORY, description="control plane pods are ready", run=_deployment),
        Check(category=CATEGORY, description="CA root certificate is valid", run=_ca_root),
        Check(
            category=CATEGORY,
            description="root ConfigMap is in every namespace",
            run=_roots_everywhere,
        ),
        Check(
            category=CATEGORY,
            description="injection webhook injects (server-side dry run)",
            run=_webhook,
        ),
    ),
)
