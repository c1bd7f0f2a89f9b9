"""Putting what ``render`` builds into a pod: containers, volumes, labels and annotations.

Owns where each injected part goes (a native sidecar first among init containers, with the
capture's before it; a classic proxy last among containers, or first to hold the app; the
capture's init container last among the app's), the user's ``istio-*`` containers merged over
ours, the mesh's labels and annotations Istio's way (a value the user set stays), and the status
and undo annotations that let removal take it all out again. Every annotation is read and checked
before the pod changes; the pod is the caller's own copy, changed in place.
"""

from __future__ import annotations

import dataclasses
import json
import re
from typing import TYPE_CHECKING

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject import multus, overrides, probes, prometheus, render
from meshctl.core.k8s.inject.errors import InvalidAnnotationError
from meshctl.core.k8s.inject.interception import STATUS_PORT, cni_annotations
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.core.k8s.inject.undo import Recorder

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import (
        Container,
        LocalObjectReference,
        ObjectMeta,
        PodSecurityContext,
        PodSpec,
        PodTemplate,
        SecurityContext,
        Sysctl,
        Volume,
    )

_NOT_LABEL_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_LABEL_VALUE_MAX = 63


def merge(
    pod: PodTemplate,
    settings: InjectSettings,
    *,
    workload_name: str,
    extra_env: tuple[tuple[str, str], ...],
) -> None:
    """Injects into ``pod`` (validated, any earlier injection stripped) in place."""
    undo = Recorder()
    fresh: ObjectMeta = {}
    metadata = undo.field(pod, "metadata", "metadata", fresh)
    annotations: dict[str, str] = undo.field(metadata, "annotations", "metadata.annotations", {})
    # Read and validate every annotation before changing anything.
    options = render.pod_options(annotations, settings)
    spec = pod["spec"]
    if options.gateway:  # the gateway template: the proxy is the pod's main container
        options = dataclasses.replace(options, native_sidecar=False)
    capture = options.interception.mode != "NONE" and not options.gateway
    init_name = render.VALIDATION_CONTAINER if settings.cni else render.INIT_CONTAINER
    injected_names = {render.PROXY_CONTAINER, *([init_name] if capture else [])}
    taken = overrides.take(spec)
    # A user container named as one we do not inject this time stays the user's.
    overrides.put_back(spec, [t for t in taken if t[2]["name"] not in injected_names])
    taken = [t for t in taken if t[2]["name"] in injected_names]
    user = {item["name"]: item for _, _, item in taken}
    containers = spec["containers"]
    app_names = [c["name"] for c in containers]
    scrape = prometheus.plan(annotations, options.status_port or STATUS_PORT)
    rewritten = probes.Rewritten()
    if options.rewrite_probes and options.status_port:  # port 0: nothing would answer them
        pod_containers = [*(spec.get("initContainers") or ()), *containers]
        rewritten = probes.rewrite(pod_containers, options.status_port)

    # The capture's init container: the privileged rule installer, or in CNI mode (the plugin
    # installs the rules) the unprivileged check that they are there; none without capture.
    # A pod whose only container is the user's istio-proxy keeps it a regular container: as a
    # native sidecar it would leave the pod without containers, which the API server refuses.
    if options.native_sidecar and not containers:
        options = dataclasses.replace(options, native_sidecar=False)
    init = None
    if capture:
        make = render.validation_container if settings.cni else render.init_container
        init = make(options, settings)
    labels = metadata.get("labels") or {}
    # Istio's label naming the workload, for pods whose controller name says nothing useful.
    named = labels.get(ann.WORKLOAD_NAME_LABEL) if isinstance(labels, dict) else None
    proxy = render.proxy_container(
        options,
        settings,
        workload_name=named if isinstance(named, str) and named else workload_name,
        app_containers=app_names,
        probers=rewritten.probers,
        extra_env=extra_env,
        prometheus_env=scrape.env if scrape else None,
    )
    if options.proxy_config.hold_application and not options.native_sidecar:
        render.hold_application(options, proxy)
    if user:
        proxy, init = _apply_overrides(proxy, init, user, options)
        undo.overrides = taken
        undo.set(
            annotations,
            undo.annotations,
            overrides.ANNOTATION,
            overrides.annotation(taken, injected_names),
        )
    hold = bool(options.proxy_config.hold_application)
    injected_init, injected_containers = _place(
        spec, init, proxy, undo, native=options.native_sidecar, first=hold
    )
    new_volumes = _add_volumes(spec, render.volumes(settings, options), undo, annotations)
    new_secrets = _add_pull_secrets(spec, settings.image_pull_secrets, undo)

    _annotate(
        pod, undo, options, settings, scrape=scrape, app_names=app_names, workload=workload_name
    )
    status: dict[str, object] = {
        "initContainers": injected_init or None,
        "containers": injected_containers or None,
        "volumes": [v["name"] for v in new_volumes],
        "imagePullSecrets": new_secrets or None,
        "revision": settings.revision,
    }
    annotations[ann.STATUS] = json.dumps(status, separators=(",", ":"))
    undo.probes = rewritten.not_in_probers()
    annotations[ann.UNDO] = undo.to_json()


def _annotate(
    pod: PodTemplate,
    undo: Recorder,
    options: render.PodOptions,
    settings: InjectSettings,
    *,
    scrape: prometheus.Merge | None,
    app_names: list[str],
    workload: str,
) -> None:
    """The labels and annotations injection sets (each recorded for uninject), and a gateway's
    pod sysctl."""
    metadata, spec = pod["metadata"], pod["spec"]
    annotations = metadata["annotations"]
    labels: dict[str, str] = undo.field(metadata, "labels", "metadata.labels", {})
    _merge_labels(labels, undo, workload, tls_mode=not options.gateway)
    if settings.network and ann.NETWORK_LABEL not in labels:  # a value the user set stays
        undo.set(labels, undo.labels, ann.NETWORK_LABEL, settings.network)
    if options.gateway:
        empty: PodSecurityContext = {}
        context = undo.field(spec, "securityContext", "spec.securityContext", empty)
        sysctls: list[Sysctl] = undo.field(context, "sysctls", "spec.securityContext.sysctls", [])
        if not any(s.get("name") == render.GATEWAY_SYSCTL["name"] for s in sysctls):
            sysctls.append(render.GATEWAY_SYSCTL.copy())
            undo.sysctl = True
    if scrape is not None:  # Prometheus now scrapes the proxy, which merges the app's metrics
        for key in scrape.remove:
            undo.remove(annotations, undo.annotations, key)
        for key, value in scrape.set:
            undo.set(annotations, undo.annotations, key, value)
    # Which control-plane revision injected the pod, as Istio records it.
    undo.set(annotations, undo.annotations, ann.REVISION_LABEL, settings.revision)
    for key in (ann.DEFAULT_CONTAINER, ann.DEFAULT_LOGS_CONTAINER):
        if key not in annotations and app_names:
            undo.set(annotations, undo.annotations, key, app_names[0])
    if settings.cni and not options.gateway:
        for key, value in cni_annotations(options.interception).items():
            undo.set(annotations, undo.annotations, key, value)
        if settings.multus_network:
            existing = str(annotations.get(multus.ANNOTATION, ""))
            value = multus.append_network(existing, settings.multus_network)
            undo.set(annotations, undo.annotations, multus.ANNOTATION, value)


def _add_volumes(
    spec: PodSpec, new: list[Volume], undo: Recorder, annotations: dict[str, str]
) -> list[Volume]:
    """Adds ``new`` to the pod's volumes; a userVolume named as one of the pod's is an error."""
    present = {v.get("name") for v in spec.get("volumes") or ()}
    for volume in new:
        if volume["name"] in present:
            raise InvalidAnnotationError(
                ann.USER_VOLUME,
                annotations.get(ann.USER_VOLUME, ""),
                expected=f"volume names the pod does not use already ({volume['name']!r} is)",
            )
    volumes: list[Volume] = undo.field(spec, "volumes", "spec.volumes", [])
    volumes.extend(new)
    return new


def _add_pull_secrets(spec: PodSpec, names: tuple[str, ...], undo: Recorder) -> list[str]:
    """The mesh's image pull secrets (values.global.imagePullSecrets) ahead of the pod's own, as
    Istio's template puts them; returns the names added (the pod's own are never listed, so
    removal leaves them)."""
    present = {s.get("name") for s in spec.get("imagePullSecrets") or ()}
    added = [name for name in dict.fromkeys(names) if name not in present]
    if added:
        secrets: list[LocalObjectReference] = undo.field(
            spec, "imagePullSecrets", "spec.imagePullSecrets", []
        )
        secrets[:0] = [{"name": name} for name in added]
    return added


def _place(
    spec: PodSpec,
    init: Container | None,
    proxy: Container,
    undo: Recorder,
    *,
    native: bool,
    first: bool = False,
) -> tuple[list[str], list[str]]:
    """Puts the capture's init container and the proxy in the pod; returns the names added to
    initContainers and containers."""
    if native:
        # Capture first, then the proxy, then the app's own init containers: those then start
        # with the mesh already working (their traffic is captured, the proxy is up).
        front = ([init] if init else []) + [proxy]
        inits: list[Container] = undo.field(spec, "initContainers", "spec.initContainers", [])
        inits[:0] = front
        return [c["name"] for c in front], []
    injected_init = []
    if init is not None:
        # Last among init containers: the app's own init containers run before capture, when
        # the classic proxy (a regular container) is not running yet.
        inits = undo.field(spec, "initContainers", "spec.initContainers", [])
        inits.append(init)
        injected_init = [init["name"]]
    # holdApplicationUntilProxyStarts: first, so the kubelet starts it (and waits for its
    # postStart hook) before the app; else last, so kubectl defaults to the app.
    if first:
        spec["containers"].insert(0, proxy)
    else:
        spec["containers"].append(proxy)
    return injected_init, [proxy["name"]]


def _apply_overrides(
    proxy: Container,
    init: Container | None,
    user: dict[str, Container],
    options: render.PodOptions,
) -> tuple[Container, Container | None]:
    """The user's fields over ours, and (as Istio does) the capture following a proxy uid/gid
    the user chose: ``-u``/``-g`` of the init container, the validation container's ids; in
    TPROXY mode the proxy stays root."""
    if render.PROXY_CONTAINER in user:
        proxy = overrides.merge(proxy, user[render.PROXY_CONTAINER])
    if init is not None and init["name"] in user:
        init = overrides.merge(init, user[init["name"]])
    context = user.get(render.PROXY_CONTAINER, {}).get("securityContext")
    chosen: SecurityContext = context if isinstance(context, dict) else {}
    uid, gid = chosen.get("runAsUser"), chosen.get("runAsGroup")
    if uid is None and gid is None:
        return proxy, init
    tproxy = options.interception.mode == "TPROXY"
    if tproxy and uid is not None:
        proxy["securityContext"]["runAsUser"] = 0
    if init is None:
        return proxy, init
    if not tproxy and init["name"] == render.VALIDATION_CONTAINER:
        ids = init.setdefault("securityContext", {})
        if uid is not None:
            ids["runAsUser"] = uid
        if gid is not None:
            ids["runAsGroup"] = gid
    args = init.get("args") or []
    for flag, value in (("-u", uid), ("-g", gid)):
        if isinstance(value, int) and value > 0 and flag in args[:-1]:
            args[args.index(flag) + 1] = str(value)
    return proxy, init


def _merge_labels(
    labels: dict[str, str], undo: Recorder, workload_name: str, *, tls_mode: bool = True
) -> None:
    """The mesh's labels, Istio's way: a value the user set stays (a gateway has no tlsMode)."""
    if tls_mode and not labels.get(ann.TLS_MODE_LABEL):
        undo.set(labels, undo.labels, ann.TLS_MODE_LABEL, "istio")
    if ann.CANONICAL_NAME_LABEL not in labels:
        name = labels.get("app.kubernetes.io/name") or labels.get("app") or workload_name
        undo.set(labels, undo.labels, ann.CANONICAL_NAME_LABEL, _label_value(name))
    if ann.CANONICAL_REVISION_LABEL not in labels:
        revision = labels.get("app.kubernetes.io/version") or labels.get("version") or "latest"
        undo.set(labels, undo.labels, ann.CANONICAL_REVISION_LABEL, _label_value(revision))


def _label_value(text: str) -> str:
    """``text`` made a valid label value (a derived name may be longer or use other chars)."""
    value = _NOT_LABEL_CHARS.sub("-", text)[:_LABEL_VALUE_MAX]
    return value.strip("-_.")
