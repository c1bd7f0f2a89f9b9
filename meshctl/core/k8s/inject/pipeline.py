"""The pod mutation pipeline: validate -> strip any earlier injection -> render -> merge.

One function injects a pod (or a workload's pod template), one removes the injection; the CLI
and the admission webhook both call them. Invariants, for any pod ``x`` they accept:
- ``inject(inject(x)) == inject(x)``: an earlier injection (ours or Istio's, found by the
  ``sidecar.istio.io/status`` annotation) is stripped before injecting again;
- ``uninject(inject(x)) == x`` for a pod not injected before: labels and annotations meshctl
  set are restored from the ``inject.meshctl.io/undo`` record (their prior values, and which
  fields did not exist), probes from the proxy's ``ISTIO_KUBE_APP_PROBERS``; everything else
  injected is removed by the names the status annotation lists;
- inputs are never changed: every result is a fresh copy.
"""

from __future__ import annotations

import copy
import dataclasses
import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from meshctl.core.k8s import proxyconfig
from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject import multus, overrides, probes, prometheus, render
from meshctl.core.k8s.inject.errors import InvalidAnnotationError, ManifestError
from meshctl.core.k8s.inject.interception import STATUS_PORT, cni_annotations
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.structured import InputError, load_json

# Istio's list: system namespaces are never injected, whatever their pods say.
IGNORED_NAMESPACES = frozenset(
    {"kube-system", "kube-public", "kube-node-lease", "local-path-storage"}
)

_NOT_LABEL_CHARS = re.compile(r"[^A-Za-z0-9._-]")
_LABEL_VALUE_MAX = 63


@dataclass(frozen=True, slots=True)
class Injected:
    """A pod after injection; ``skipped`` says why it was left as it was (None = injected)."""

    pod: dict[str, Any]
    skipped: str | None = None
    warnings: tuple[str, ...] = ()  # what the user should know: annotations without effect


def inject_pod(
    pod: Mapping[str, Any],
    settings: InjectSettings,
    *,
    workload_name: str,
    namespace: str | None = None,
    extra_env: tuple[tuple[str, str], ...] = (),
) -> Injected:
    """``pod`` (a Pod or a pod template: ``metadata`` and ``spec``) with the sidecar injected.

    Raises ``ManifestError`` when the pod spec is unusable and ``InvalidAnnotationError`` when an
    annotation the injector reads holds a bad value.
    """
    validate(pod)
    reason = skip_reason(pod, namespace)
    if reason is not None:
        return Injected(_copy(dict(pod)), reason)
    result = _copy(dict(pod))
    _strip(result)
    _check_reserved_names(result)
    warnings = ann.unsupported(_mapping(_mapping(result.get("metadata")).get("annotations")))
    warnings += _config_warnings(_mapping(_mapping(result.get("metadata")).get("annotations")))
    _merge(result, settings, workload_name=workload_name, extra_env=extra_env)
    return Injected(result, warnings=tuple(warnings))


def uninject_pod(pod: Mapping[str, Any]) -> dict[str, Any]:
    """``pod`` without any earlier injection; an uninjected pod comes back as an equal copy."""
    validate(pod)
    result: dict[str, Any] = _copy(dict(pod))
    _strip(result)
    return result


def _copy(value: Any) -> Any:
    """A deep copy of JSON-shaped data (what manifests and AdmissionReviews hold), several
    times faster than ``copy.deepcopy``, which it falls back to for anything else."""
    kind = value.__class__
    if kind is dict:
        return {k: _copy(v) for k, v in value.items()}
    if kind is list:
        return [_copy(v) for v in value]
    if kind in _IMMUTABLE or value is None:
        return value
    return copy.deepcopy(value)


_IMMUTABLE = frozenset({str, int, float, bool})


def _a(value: Any) -> str:
    """What a value is, for messages: ``a string``, ``a mapping``, ``a number``."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, int | float):
        return "a number"
    if isinstance(value, str):
        return f"a string ({value[:30]!r})"
    return "null" if value is None else f"a {type(value).__name__}"


def is_injected(pod: Mapping[str, Any]) -> bool:
    """Whether the pod carries the status annotation of an injection."""
    return ann.STATUS in _mapping(_mapping(pod.get("metadata")).get("annotations"))


# --- validate -----------------------------------------------------------------------------------


def validate(pod: Mapping[str, Any]) -> None:
    """Checks the structure the pipeline relies on; raises ``ManifestError`` naming the problem."""
    _validate_metadata(pod.get("metadata"))
    spec = pod.get("spec")
    if not isinstance(spec, dict):
        raise ManifestError("the pod template has no spec", hint="add spec.containers")
    containers = spec.get("containers")
    if containers is not None and not isinstance(containers, list):
        raise ManifestError(
            f"spec.containers must be a list of containers, not {_a(containers)}",
            hint="write each container as a '- name: ...' item under containers:",
        )
    if not containers:
        raise ManifestError(
            "the pod spec has no containers", hint="a pod needs at least one container to mesh"
        )
    names: set[str] = set()
    for field in ("initContainers", "containers"):
        for name in _names(spec, field, what="container"):
            if name in names:
                raise ManifestError(
                    f"container name {name!r} is used twice", hint="container names must be unique"
                )
            names.add(name)
    for field in ("volumes", "imagePullSecrets"):
        items = spec.get(field)
        if items is not None and (
            not isinstance(items, list) or not all(isinstance(i, dict) for i in items)
        ):
            raise ManifestError(f"spec.{field} is not a list of mappings", hint="fix its YAML")


def _validate_metadata(metadata: Any) -> None:
    if metadata is None:
        return
    if not isinstance(metadata, dict):
        raise ManifestError(
            "metadata is not a mapping", hint="write metadata as 'key: value' lines"
        )
    for section in ("labels", "annotations"):
        values = metadata.get(section)
        if values is None:
            continue
        if not isinstance(values, dict):
            raise ManifestError(
                f"metadata.{section} is not a mapping", hint="write it as 'key: value' lines"
            )
        for key, value in values.items():
            if not isinstance(key, str):
                raise ManifestError(
                    f"metadata.{section} has a key that is not a string: {key!r}",
                    hint="quote the key",
                )
            if not isinstance(value, str):
                raise ManifestError(
                    f"{section[:-1]} {key!r} has a {type(value).__name__} value, not a string",
                    hint=f'quote the value, e.g. {key}: "{_yaml_scalar(value)}"',
                )


def _names(spec: dict[str, Any], field: str, *, what: str) -> list[str]:
    """The names of the entries of ``spec[field]`` (a list of named mappings, or absent)."""
    items = spec.get(field)
    if items is None:
        return []
    if not isinstance(items, list):
        raise ManifestError(f"spec.{field} is not a list", hint="write it as a YAML list")
    names = []
    for item in items:
        name = item.get("name") if isinstance(item, dict) else None
        if not isinstance(name, str) or not name:
            raise ManifestError(
                f"an entry of spec.{field} has no name", hint=f"every {what} needs a name"
            )
        names.append(name)
    return names


def skip_reason(pod: Mapping[str, Any], namespace: str | None) -> str | None:
    """Why the pod must not be injected (hostNetwork, opted out, system namespace), or None."""
    if _mapping(pod.get("spec")).get("hostNetwork") is True:
        return "it uses hostNetwork"
    metadata = _mapping(pod.get("metadata"))
    # The label wins over the annotation of the same name (the webhook selects on the label).
    for section in ("labels", "annotations"):
        value = _mapping(metadata.get(section)).get(ann.INJECT)
        if value is not None:
            if not ann.parse_bool(ann.INJECT, value):
                return f"{section[:-1]} {ann.INJECT} is {value!r}"
            break
    if namespace in IGNORED_NAMESPACES:
        return f"namespace {namespace} is never injected"
    return None


def _config_warnings(annotations: dict[str, Any]) -> list[str]:
    """The fields of proxy.istio.io/config that have no effect (a bad value fails later)."""
    try:
        config = proxyconfig.parse(str(annotations.get(proxyconfig.ANNOTATION, "")))
    except ValueError:
        return []
    fields = [*config.unsupported, *(["statusPort"] if config.status_port is not None else [])]
    return [
        f"field {f!r} of annotation {proxyconfig.ANNOTATION!r} is not supported by meshctl and "
        "has no effect" + (" (use status.sidecar.istio.io/port)" if f == "statusPort" else "")
        for f in fields
    ]


def _check_reserved_names(pod: dict[str, Any]) -> None:
    # A container named as an injected one is not refused: it overrides fields (overrides.py).
    spec = pod["spec"]
    for item in spec.get("volumes") or ():
        if item.get("name") in render.VOLUMES:
            raise ManifestError(
                f"volume name {item['name']!r} is reserved for the injected sidecar",
                hint="rename the volume (meshctl adds its own)",
            )
    if ann.UNDO in _mapping(_mapping(pod.get("metadata")).get("annotations")):
        raise ManifestError(
            f"annotation {ann.UNDO} without {ann.STATUS}",
            hint=f"remove the {ann.UNDO} annotation; meshctl writes it when it injects",
        )


# --- strip --------------------------------------------------------------------------------------


def _strip(pod: dict[str, Any]) -> None:
    """Removes an earlier injection from ``pod`` (our own copy) in place."""
    metadata = _mapping(pod.get("metadata"))
    annotations = _mapping(metadata.get("annotations"))
    if ann.STATUS not in annotations:
        return
    status = _status(annotations[ann.STATUS])
    undo = _undo_record(annotations[ann.UNDO]) if ann.UNDO in annotations else None
    spec = pod["spec"]
    _check_status_matches(spec, status)
    # The probers live in the proxy's env: read them before the proxy goes. Our undo record
    # has the probes as the user wrote them (named ports too); Istio's pods only the probers.
    proxy: dict[str, Any] = next(
        (
            item
            for field in ("initContainers", "containers")
            for item in spec.get(field) or ()
            if item.get("name") == render.PROXY_CONTAINER
        ),
        {},
    )
    originals: dict[str, Any] = _probers(proxy)
    scraped = _env_value(proxy, prometheus.ENV)
    if undo is not None and isinstance(undo.get("probes"), dict):
        originals = {**originals, **undo["probes"]}
    for field, names in (
        ("initContainers", status["initContainers"]),
        ("containers", status["containers"]),
        ("volumes", status["volumes"]),
        ("imagePullSecrets", status["imagePullSecrets"]),
    ):
        if names and isinstance(spec.get(field), list):
            spec[field] = [i for i in spec[field] if i.get("name") not in names]
    probes.restore([*(spec.get("initContainers") or ()), *spec["containers"]], originals)
    # The user's own istio-proxy / istio-init go back where they were (Istio's: at the end).
    if undo is not None:
        overrides.put_back(spec, undo.get("overrides") or [])
    elif overrides.ANNOTATION in annotations:
        overrides.put_back(spec, overrides.from_annotation(annotations.pop(overrides.ANNOTATION)))
    if not spec["containers"]:  # (our own copy: the caller's pod is unchanged)
        raise ManifestError(
            f"annotation {ann.STATUS!r} lists every container of the pod",
            hint=f"the pod does not look injected as {ann.STATUS} says; remove that annotation "
            "(and any injected parts by hand) to inject afresh",
        )
    annotations.pop(ann.UNDO, None)
    del annotations[ann.STATUS]
    if undo is not None:
        _apply_undo(pod, undo)
    elif annotations.get(prometheus.PATH) == prometheus.METRICS_PATH:
        # Istio's merge: its env holds what the annotations said before.
        for key in prometheus.keys(annotations):
            del annotations[key]
        annotations.update(prometheus.restored(scraped or ""))


# Every container Istio's templates or ours add; anything else a status lists is the user's.
INJECTED_CONTAINERS = frozenset({*render.CONTAINERS, "enable-core-dump"})


def _check_status_matches(spec: dict[str, Any], status: dict[str, list[str]]) -> None:
    """Refuses to strip what the status annotation names unless the pod bears it out: each
    listed container is one injection adds and is there, each listed volume is there and no
    container that stays mounts it, and a container is left. Anything else would remove the
    user's own parts (the annotation was copied, edited, or written by someone else)."""
    hint = (
        f"the pod does not look injected as {ann.STATUS} says; remove that annotation "
        "(and any injected parts by hand) to inject afresh"
    )
    for field in ("initContainers", "containers"):
        present = {c.get("name") for c in spec.get(field) or ()}
        for name in status[field]:
            if name not in INJECTED_CONTAINERS:
                raise ManifestError(
                    f"annotation {ann.STATUS!r} lists container {name!r}, which injection "
                    "never adds",
                    hint=hint,
                )
            if name not in present:
                raise ManifestError(
                    f"annotation {ann.STATUS!r} lists {field[:-1]} {name!r}, which the pod lacks",
                    hint=hint,
                )
    staying = [
        c
        for field in ("initContainers", "containers")
        for c in spec.get(field) or ()
        if c.get("name") not in status[field]
    ]
    volumes = {v.get("name") for v in spec.get("volumes") or ()}
    for name in status["volumes"]:
        if name not in volumes:
            raise ManifestError(
                f"annotation {ann.STATUS!r} lists volume {name!r}, which the pod lacks", hint=hint
            )
        users = [
            c["name"]
            for c in staying
            if any(
                m.get("name") == name for m in c.get("volumeMounts") or () if isinstance(m, dict)
            )
        ]
        if users:
            raise ManifestError(
                f"annotation {ann.STATUS!r} lists volume {name!r}, which container "
                f"{users[0]!r} mounts",
                hint=hint,
            )


def _status(text: Any) -> dict[str, list[str]]:
    """The status annotation's lists (Istio's shape); a value we cannot read is an error."""
    lists = _status_lists(text)
    if lists is None:
        raise InvalidAnnotationError(
            ann.STATUS,
            str(text),
            expected="the JSON meshctl or Istio wrote; remove it to inject afresh",
        )
    return lists


def _status_lists(text: Any) -> dict[str, list[str]] | None:
    data = _json_object(text)
    if data is None:
        return None
    lists = {}
    for key in ("initContainers", "containers", "volumes", "imagePullSecrets"):
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return None
        lists[key] = value
    return lists


def _json_object(text: Any) -> dict[str, Any] | None:
    """``text`` parsed as a JSON object, or None."""
    try:
        data = load_json(text, "annotation")
    except (InputError, TypeError):
        return None
    return data if isinstance(data, dict) else None


def _probers(container: Mapping[str, Any]) -> dict[str, Any]:
    return _json_object(_env_value(container, probes.PROBERS_ENV) or "{}") or {}


def _env_value(container: Mapping[str, Any], name: str) -> str | None:
    for entry in container.get("env") or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get("value")
            return value if isinstance(value, str) else None
    return None


def _undo_record(text: Any) -> dict[str, Any]:
    record = _json_object(text)
    if record is None:
        raise InvalidAnnotationError(
            ann.UNDO, str(text), expected="the JSON meshctl wrote; remove it to inject afresh"
        )
    return record


def _apply_undo(pod: dict[str, Any], record: Mapping[str, Any]) -> None:
    metadata = _mapping(pod.get("metadata"))
    for section in ("labels", "annotations"):
        target = metadata.get(section)
        if not isinstance(target, dict):
            continue
        for key, previous in _mapping(record.get(section)).items():
            if previous is None:
                target.pop(key, None)
            else:
                target[key] = previous
    order = record.get("annotationOrder")
    annotations = metadata.get("annotations")
    if isinstance(order, list) and isinstance(annotations, dict):
        # Keys injection removed come back where they were; keys added since go last.
        rank = {key: i for i, key in enumerate(order)}
        items = sorted(annotations.items(), key=lambda kv: rank.get(kv[0], len(rank)))
        annotations.clear()
        annotations.update(items)
    if record.get("sysctl"):
        context = _mapping(_mapping(pod.get("spec")).get("securityContext"))
        if isinstance(context.get("sysctls"), list):
            context["sysctls"] = [s for s in context["sysctls"] if s != render.GATEWAY_SYSCTL]
    # Deepest first, so "metadata" goes only after "metadata.labels" has.
    for path in sorted(record.get("absent") or (), key=lambda p: -str(p).count(".")):
        _restore_field(pod, str(path), absent=True)
    for path in record.get("null") or ():
        _restore_field(pod, str(path), absent=False)


def _restore_field(pod: dict[str, Any], path: str, *, absent: bool) -> None:
    """Deletes (or nulls) a field injection created, unless something is in it now."""
    *parents, last = path.split(".")
    holder: Any = pod
    for part in parents:
        holder = holder.get(part) if isinstance(holder, dict) else None
    if isinstance(holder, dict) and last in holder and not holder[last]:
        if absent:
            del holder[last]
        else:
            holder[last] = None


# --- render and merge ---------------------------------------------------------------------------


class _Undo:
    """Collects what merging changes, to write into the undo annotation."""

    def __init__(self) -> None:
        self.labels: dict[str, str | None] = {}
        self.annotations: dict[str, str | None] = {}
        self.absent: list[str] = []
        self.null: list[str] = []
        # Probes as written where the probers differ (a named port), by the path they now use.
        self.probes: dict[str, Any] = {}
        self.order: list[str] = []  # the annotations' order, when injection removed one
        self.overrides: list[Any] = []  # the user's istio-* containers: [field, index, container]
        self.sysctl = False  # the gateway's unprivileged-ports sysctl was added

    def field(self, holder: dict[str, Any], key: str, path: str, empty: Any) -> Any:
        """``holder[key]``, created as ``empty`` (and remembered) when absent or null."""
        if key not in holder:
            self.absent.append(path)
            holder[key] = empty
        elif holder[key] is None:
            self.null.append(path)
            holder[key] = empty
        return holder[key]

    def set(
        self, target: dict[str, str], record: dict[str, str | None], key: str, value: str
    ) -> None:
        if key not in record:
            record[key] = target.get(key)
        target[key] = value

    def remove(self, target: dict[str, str], record: dict[str, str | None], key: str) -> None:
        """Drops ``target[key]``, remembering its value and (once) the order of ``target``."""
        if not self.order:
            self.order = list(target)
        if key not in record:
            record[key] = target.get(key)
        target.pop(key, None)

    def to_json(self) -> str:
        data: dict[str, Any] = {}
        for name in ("labels", "annotations", "absent", "null", "probes", "overrides"):
            value = getattr(self, name)
            if value:
                data[name] = value
        if self.order:
            data["annotationOrder"] = self.order
        if self.sysctl:
            data["sysctl"] = render.GATEWAY_SYSCTL["name"]
        return json.dumps(data, separators=(",", ":"))


def _merge(
    pod: dict[str, Any],
    settings: InjectSettings,
    *,
    workload_name: str,
    extra_env: tuple[tuple[str, str], ...],
) -> None:
    undo = _Undo()
    metadata = undo.field(pod, "metadata", "metadata", {})
    annotations = undo.field(metadata, "annotations", "metadata.annotations", {})
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
    containers: list[dict[str, Any]] = spec["containers"]
    app_names = [c["name"] for c in containers]
    merge = prometheus.plan(annotations, options.status_port or STATUS_PORT)
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
    proxy = render.proxy_container(
        options,
        settings,
        workload_name=workload_name,
        app_containers=app_names,
        probers=rewritten.probers,
        extra_env=extra_env,
        prometheus_env=merge.env if merge else None,
    )
    if options.proxy_config.hold_application and not options.native_sidecar:
        render.hold_application(options, proxy)
    if user:
        proxy, init = _apply_overrides(proxy, init, user, options)
        undo.overrides = [list(t) for t in taken]
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

    _annotate(
        pod, undo, options, settings, merge=merge, app_names=app_names, workload=workload_name
    )
    status = {
        "initContainers": injected_init or None,
        "containers": injected_containers or None,
        "volumes": [v["name"] for v in new_volumes],
        "imagePullSecrets": None,
        "revision": settings.revision,
    }
    annotations[ann.STATUS] = json.dumps(status, separators=(",", ":"))
    undo.probes = rewritten.not_in_probers()
    annotations[ann.UNDO] = undo.to_json()


def _annotate(
    pod: dict[str, Any],
    undo: _Undo,
    options: render.PodOptions,
    settings: InjectSettings,
    *,
    merge: prometheus.Merge | None,
    app_names: list[str],
    workload: str,
) -> None:
    """The labels and annotations injection sets (each recorded for uninject), and a gateway's
    pod sysctl."""
    metadata, spec = pod["metadata"], pod["spec"]
    annotations = metadata["annotations"]
    labels = undo.field(metadata, "labels", "metadata.labels", {})
    _merge_labels(labels, undo, workload, tls_mode=not options.gateway)
    if options.gateway:
        context = undo.field(spec, "securityContext", "spec.securityContext", {})
        sysctls = undo.field(context, "sysctls", "spec.securityContext.sysctls", [])
        if not any(s.get("name") == render.GATEWAY_SYSCTL["name"] for s in sysctls):
            sysctls.append(dict(render.GATEWAY_SYSCTL))
            undo.sysctl = True
    if merge is not None:  # Prometheus now scrapes the proxy, which merges the app's metrics
        for key in merge.remove:
            undo.remove(annotations, undo.annotations, key)
        for key, value in merge.set:
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
    spec: dict[str, Any], new: list[dict[str, Any]], undo: _Undo, annotations: dict[str, str]
) -> list[dict[str, Any]]:
    """Adds ``new`` to the pod's volumes; a userVolume named as one of the pod's is an error."""
    present = {v.get("name") for v in spec.get("volumes") or ()}
    for volume in new:
        if volume["name"] in present:
            raise InvalidAnnotationError(
                ann.USER_VOLUME,
                annotations.get(ann.USER_VOLUME, ""),
                expected=f"volume names the pod does not use already ({volume['name']!r} is)",
            )
    undo.field(spec, "volumes", "spec.volumes", []).extend(new)
    return new


def _place(
    spec: dict[str, Any],
    init: dict[str, Any] | None,
    proxy: dict[str, Any],
    undo: _Undo,
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
        undo.field(spec, "initContainers", "spec.initContainers", [])[:0] = front
        return [c["name"] for c in front], []
    injected_init = []
    if init is not None:
        # Last among init containers: the app's own init containers run before capture, when
        # the classic proxy (a regular container) is not running yet.
        undo.field(spec, "initContainers", "spec.initContainers", []).append(init)
        injected_init = [init["name"]]
    # holdApplicationUntilProxyStarts: first, so the kubelet starts it (and waits for its
    # postStart hook) before the app; else last, so kubectl defaults to the app.
    if first:
        spec["containers"].insert(0, proxy)
    else:
        spec["containers"].append(proxy)
    return injected_init, [proxy["name"]]


def _apply_overrides(
    proxy: dict[str, Any],
    init: dict[str, Any] | None,
    user: dict[str, dict[str, Any]],
    options: render.PodOptions,
) -> tuple[dict[str, Any], dict[str, Any] | None]:
    """The user's fields over ours, and (as Istio does) the capture following a proxy uid/gid
    the user chose: ``-u``/``-g`` of the init container, the validation container's ids; in
    TPROXY mode the proxy stays root."""
    if render.PROXY_CONTAINER in user:
        proxy = overrides.merge(proxy, user[render.PROXY_CONTAINER])
    if init is not None and init["name"] in user:
        init = overrides.merge(init, user[init["name"]])
    chosen = _mapping(user.get(render.PROXY_CONTAINER, {}).get("securityContext"))
    uid, gid = chosen.get("runAsUser"), chosen.get("runAsGroup")
    if uid is None and gid is None:
        return proxy, init
    tproxy = options.interception.mode == "TPROXY"
    if tproxy and uid is not None:
        proxy["securityContext"]["runAsUser"] = 0
    if init is None:
        return proxy, init
    if not tproxy and init["name"] == render.VALIDATION_CONTAINER:
        context = init.setdefault("securityContext", {})
        if uid is not None:
            context["runAsUser"] = uid
        if gid is not None:
            context["runAsGroup"] = gid
    args = init.get("args") or []
    for flag, value in (("-u", uid), ("-g", gid)):
        if isinstance(value, int) and value > 0 and flag in args[:-1]:
            args[args.index(flag) + 1] = str(value)
    return proxy, init


def _merge_labels(
    labels: dict[str, str], undo: _Undo, workload_name: str, *, tls_mode: bool = True
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


def _mapping(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _yaml_scalar(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)
