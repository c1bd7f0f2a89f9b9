"""The pod mutation pipeline: validate -> strip any earlier injection -> render -> merge.

One function injects a pod (or a workload's pod template), one removes the injection; the CLI
and the admission webhook both call them. The steps live beside it: ``validation`` (what a pod
must be), ``removal`` (strip), ``render`` and ``merge`` (inject), ``undo`` (the record between
them). Invariants, for any pod ``x`` they accept:
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
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, cast

from meshctl.core.k8s import proxyconfig
from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject.merge import merge
from meshctl.core.k8s.inject.removal import strip
from meshctl.core.k8s.inject.settings import InjectSettings
from meshctl.core.k8s.inject.validation import annotations_of, check_reserved_names, validate

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import PodTemplate

# Istio's list: system namespaces are never injected, whatever their pods say.
IGNORED_NAMESPACES = frozenset(
    {"kube-system", "kube-public", "kube-node-lease", "local-path-storage"}
)


@dataclass(frozen=True, slots=True)
class Injected:
    """A pod after injection; ``skipped`` says why it was left as it was (None = injected)."""

    pod: PodTemplate
    skipped: str | None = None
    warnings: tuple[str, ...] = ()  # what the user should know: annotations without effect


def inject_pod(
    pod: Mapping[str, object],
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
    template = validate(pod)
    reason = skip_reason(template, namespace)
    if reason is not None:
        return Injected(_copy(template), reason)
    result = _copy(template)
    strip(result)
    check_reserved_names(result)
    warnings = ann.unsupported(annotations_of(result))
    warnings += _config_warnings(annotations_of(result))
    merge(result, settings, workload_name=workload_name, extra_env=extra_env)
    return Injected(result, warnings=tuple(warnings))


def uninject_pod(pod: Mapping[str, object]) -> PodTemplate:
    """``pod`` without any earlier injection; an uninjected pod comes back as an equal copy."""
    result = _copy(validate(pod))
    strip(result)
    return result


def _copy(pod: PodTemplate) -> PodTemplate:
    """A fresh copy of ``pod`` (a dict, whatever mapping the caller held)."""
    return cast("PodTemplate", _copy_json(dict(pod)))


def _copy_json(value: Any) -> Any:
    """A deep copy of JSON-shaped data (what manifests and AdmissionReviews hold), several
    times faster than ``copy.deepcopy``, which it falls back to for anything else."""
    kind = value.__class__
    if kind is dict:
        return {k: _copy_json(v) for k, v in value.items()}
    if kind is list:
        return [_copy_json(v) for v in value]
    if kind in _IMMUTABLE or value is None:
        return value
    return copy.deepcopy(value)


_IMMUTABLE = frozenset({str, int, float, bool})


def is_injected(pod: Mapping[str, object]) -> bool:
    """Whether the pod carries the status annotation of an injection."""
    metadata = pod.get("metadata")
    annotations = metadata.get("annotations") if isinstance(metadata, dict) else None
    return isinstance(annotations, dict) and ann.STATUS in annotations


def skip_reason(pod: PodTemplate, namespace: str | None) -> str | None:
    """Why the pod must not be injected (hostNetwork, opted out, system namespace), or None."""
    if pod["spec"].get("hostNetwork") is True:
        return "it uses hostNetwork"
    metadata = pod.get("metadata")
    # The label wins over the annotation of the same name (the webhook selects on the label).
    for section in ("labels", "annotations"):
        values = metadata.get(section) if isinstance(metadata, dict) else None
        value = values.get(ann.INJECT) if isinstance(values, dict) else None
        if value is not None:
            if not ann.parse_bool(ann.INJECT, value):
                return f"{section[:-1]} {ann.INJECT} is {value!r}"
            break
    if namespace in IGNORED_NAMESPACES:
        return f"namespace {namespace} is never injected"
    return None


def _config_warnings(annotations: dict[str, str]) -> list[str]:
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
