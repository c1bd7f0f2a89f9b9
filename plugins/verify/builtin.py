"""Verify's own checks, about the cluster and the install as a whole (components add theirs).

``kubernetes-api``: the API answers and its version is supported. ``meshctl-install``: the
identity in use may do what install does (SelfSubjectAccessReview per kind and verb the
manifest needs), an install record exists, every object of the manifest is in the cluster as
rendered (drift named field by field) and ready, no foreign webhook injects the pods ours do,
and (``--pre``) no object with our name belongs to someone else; a ``localhost/`` image the nodes
do not hold is a warning.
"""

from __future__ import annotations

import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from meshctl.core.k8s.install import ownership
from meshctl.core.k8s.install.checks import Check, Result
from meshctl.core.k8s.install.context import CheckContext
from meshctl.core.k8s.install.drift import differences
from meshctl.core.k8s.install.manifest import key_of
from meshctl.core.k8s.install.readiness import readiness, waits

API = "kubernetes-api"
INSTALL = "meshctl-install"
# Native sidecars (the injected proxy is a restartable init container) are on by default from
# Kubernetes 1.29; older API servers would run the proxy as a plain init container that never
# ends, and the pod would never start.
MIN_VERSION = (1, 29)
VERBS = ("get", "list", "create", "patch", "delete")


def _api(ctx: CheckContext) -> Result:
    from meshctl.kube.version import server_version

    ctx.memo["version"] = server_version(ctx.kube)
    return Result.ok(f"{ctx.kube.source}")


def _version(ctx: CheckContext) -> Result:
    info = ctx.memo.get("version") or {}
    git = str(info.get("gitVersion", "?"))
    found = re.match(r"^v?(\d+)\.(\d+)", git)
    if not found:
        return Result.warn(f"cannot read the version {git!r}", hint="expect at least 1.29")
    version = (int(found.group(1)), int(found.group(2)))
    if version < MIN_VERSION:
        return Result.fail(
            f"Kubernetes {git} is older than {MIN_VERSION[0]}.{MIN_VERSION[1]}",
            hint="upgrade the cluster: injected proxies are native sidecars (KEP-753)",
        )
    return Result.ok(git)


def _needed(ctx: CheckContext) -> list[Any]:
    from meshctl.kube.access import Access

    needed: dict[tuple[str, str, str, str], Access] = {}
    for item in ctx.rendered:
        if not ctx.cluster.mapper.served(item.api_version, item.kind):
            continue
        resource = ctx.cluster.mapper.resource(item.api_version, item.kind)
        namespace = item.key.namespace if resource.namespaced else ""
        for verb in VERBS:
            access = Access(verb, resource.group, resource.plural, namespace)
            needed[(verb, resource.group, resource.plural, namespace)] = access
    return list(needed.values())


def _permissions(ctx: CheckContext) -> Result:
    from meshctl.kube.access import review

    needed = _needed(ctx)
    with ThreadPoolExecutor(max_workers=8) as pool:
        answers = list(pool.map(lambda a: (a, review(ctx.kube, a)), needed))
    denied = [f"{access}" for access, (allowed, _) in answers if not allowed]
    if denied:
        return Result.fail(
            f"{len(denied)} of {len(needed)} permissions install needs are missing",
            hint="run as a cluster admin, or grant them (check one with 'kubectl auth can-i')",
            details=denied[:12]
            + ([f"... and {len(denied) - 12} more"] if len(denied) > 12 else []),
        )
    return Result.ok(f"{len(needed)} checked")


def _record(ctx: CheckContext) -> Result:
    record = ctx.memo.get("record")
    where = f"revision {ctx.values.revision!r} in namespace {ctx.values.namespace}"
    if record is None:
        return Result.fail(
            f"meshctl is not installed ({where}: no install record)",
            hint="run 'meshctl install', or name the install with --revision / --namespace",
        )
    data = record.get("data") or {}
    return Result.ok(
        f"{data.get('profile', '?')} profile, {where}, meshctl {data.get('version', '?')}"
    )


def _drift(ctx: CheckContext) -> Result:
    lines: list[str] = []
    drifted = 0
    for item in ctx.rendered:
        live = ctx.live(item) if ctx.cluster.mapper.served(item.api_version, item.kind) else None
        if live is None:
            lines.append(f"{item.key} is missing")
            drifted += 1
            continue
        found = differences(item.object, live)
        if found:
            drifted += 1
            lines += [f"{item.key}: {d}" for d in found[:5]]
    if drifted:
        return Result.fail(
            f"{drifted} of {len(ctx.rendered)} objects differ from the installed manifest",
            hint="'meshctl install' with the same profile and values puts them back "
            "(the install record holds them)",
            details=lines[:20],
        )
    return Result.ok(f"{len(ctx.rendered)} objects")


def _ready(ctx: CheckContext) -> Result:
    lines = []
    waited = [r for r in ctx.rendered if waits(r.kind)]
    for item in waited:
        state = readiness(ctx.live(item))
        if not state.ready:
            lines.append(f"{item.key}: {state.reason}")
    if lines:
        return Result.fail(
            f"{len(lines)} of {len(waited)} objects are not ready",
            hint="'meshctl install' waits and names the cause; 'kubectl describe' the objects",
            details=lines,
        )
    return Result.ok(f"{len(waited)} objects")


def _overlaps(ctx: CheckContext) -> Result:
    from meshctl.kube import objects
    from meshctl.kube.resources import MUTATING_WEBHOOK_CONFIGURATIONS

    ours = [r.object for r in ctx.rendered if r.kind == "MutatingWebhookConfiguration"]
    if not ours:
        return Result.skip("no injection webhook in this install")
    configurations, _ = objects.list_objects(ctx.kube, MUTATING_WEBHOOK_CONFIGURATIONS)
    rendered = {r.key for r in ctx.rendered}
    lines = []
    for live in configurations:
        live.setdefault("kind", "MutatingWebhookConfiguration")
        live.setdefault("apiVersion", MUTATING_WEBHOOK_CONFIGURATIONS.api_version)
        if key_of(live) in rendered or ownership.is_ours(live):
            continue
        for overlap in ownership.overlaps(live, ours):
            lines.append(
                f"{overlap.configuration}: webhook {overlap.webhook} (to {overlap.target}, "
                f"failurePolicy {overlap.failure_policy}) overlaps {overlap.ours}"
            )
    if lines:
        return Result.fail(
            f"{len(lines)} foreign webhook(s) inject the pods ours does",
            hint="pods would be injected twice, or refused when the other webhook's service is "
            "gone: delete the other configuration ('meshctl install --force' removes it and "
            "keeps a copy)",
            details=lines,
        )
    return Result.ok()


def _foreign(ctx: CheckContext) -> Result:
    lines = []
    for item in ctx.rendered:
        if not ctx.cluster.mapper.served(item.api_version, item.kind):
            continue
        live = ctx.live(item)
        if live is not None and not ownership.is_ours(live):
            lines.append(f"{item.key}: {ownership.foreign_reason(live)}")
    if lines:
        return Result.fail(
            f"{len(lines)} object(s) with meshctl's names belong to someone else",
            hint="delete them, or 'meshctl install --force' takes them over (a copy is saved)",
            details=lines,
        )
    return Result.ok()


def _image(ctx: CheckContext) -> Result:
    from meshctl.errors import KubeError
    from meshctl.kube.nodeimages import pull_warning

    try:
        found = pull_warning(ctx.kube, ctx.values.image)
    except KubeError as exc:  # listing nodes may be forbidden to this identity
        return Result.skip(f"cannot list the nodes: {exc.message}")
    if found is None:
        return Result.ok(ctx.values.image)
    return Result.warn(found.message, hint=found.hint)


# First of every run; verify reports its failure alone, in every format, when no cluster answers.
REACH = Check(category=API, description="can reach the cluster", run=_api, stage="both", fatal=True)
CHECKS = (
    REACH,
    Check(category=API, description="Kubernetes version is supported", run=_version, stage="both"),
    Check(
        category=INSTALL,
        description="can create, change and delete what install manages",
        run=_permissions,
        stage="both",
    ),
    Check(category=INSTALL, description="meshctl is installed", run=_record, fatal=True),
    Check(category=INSTALL, description="every object matches the manifest", run=_drift),
    Check(category=INSTALL, description="every object is ready", run=_ready),
    Check(
        category=INSTALL,
        description="no foreign webhook injects the same pods",
        run=_overlaps,
        stage="both",
    ),
    Check(
        category=INSTALL,
        description="no object with our names belongs to someone else",
        run=_foreign,
        stage="pre",
    ),
    Check(
        category=INSTALL,
        description="the nodes can get the meshctl image",
        run=_image,
        stage="both",
    ),
)
