"""Removing an earlier injection (ours or Istio's) from a pod, before injecting again or on
uninject.

Owns reading the ``sidecar.istio.io/status`` annotation (Istio's JSON shape), refusing to strip
what it names unless the pod bears it out, and taking out what it lists: containers, volumes,
pull secrets; probes come back from the proxy's ``ISTIO_KUBE_APP_PROBERS`` (and our undo record's
originals), the user's ``istio-*`` containers go back where they were, then the undo record (or,
for Istio's pods, the Prometheus annotations Istio's merge kept in the proxy's env) restores the
labels and annotations. Works on the caller's own copy, in place.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from meshctl.core.k8s.inject import annotations as ann
from meshctl.core.k8s.inject import overrides, probes, prometheus, render, undo
from meshctl.core.k8s.inject.errors import InvalidAnnotationError, ManifestError
from meshctl.core.k8s.inject.overrides import CONTAINER_LISTS
from meshctl.core.k8s.inject.validation import annotations_of

if TYPE_CHECKING:
    from meshctl.core.k8s.schema import Container, PodSpec, PodTemplate

# Every container Istio's templates or ours add; anything else a status lists is the user's.
INJECTED_CONTAINERS = frozenset({*render.CONTAINERS, "enable-core-dump"})
_STATUS_LISTS = ("initContainers", "containers", "volumes", "imagePullSecrets")


def strip(pod: PodTemplate) -> None:
    """Removes an earlier injection from ``pod`` (our own copy) in place."""
    annotations = annotations_of(pod)
    if ann.STATUS not in annotations:
        return
    status = _status(annotations[ann.STATUS])
    record = undo.read(annotations[ann.UNDO]) if ann.UNDO in annotations else None
    spec = pod["spec"]
    _check_status_matches(spec, status)
    # The probers live in the proxy's env: read them before the proxy goes. Our undo record
    # has the probes as the user wrote them (named ports too); Istio's pods only the probers.
    proxy = next(
        (
            item
            for field in CONTAINER_LISTS
            for item in spec.get(field) or ()
            if item.get("name") == render.PROXY_CONTAINER
        ),
        None,
    )
    originals = _probers(proxy) if proxy is not None else {}
    scraped = _env_value(proxy, prometheus.ENV) if proxy is not None else None
    recorded = record.get("probes") if record is not None else None
    if isinstance(recorded, dict):
        originals = {**originals, **recorded}
    for field in CONTAINER_LISTS:
        containers = spec.get(field)
        if status[field] and containers is not None:
            spec[field] = [c for c in containers if c.get("name") not in status[field]]
    volumes = spec.get("volumes")
    if status["volumes"] and volumes is not None:
        spec["volumes"] = [v for v in volumes if v.get("name") not in status["volumes"]]
    secrets = spec.get("imagePullSecrets")
    if status["imagePullSecrets"] and secrets is not None:
        names = status["imagePullSecrets"]
        spec["imagePullSecrets"] = [s for s in secrets if s.get("name") not in names]
    probes.restore([*(spec.get("initContainers") or ()), *spec["containers"]], originals)
    # The user's own istio-proxy / istio-init go back where they were (Istio's: at the end).
    if record is not None:
        overrides.put_back(spec, overrides.taken_from_record(record.get("overrides")))
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
    if record is not None:
        undo.restore(pod, record)
    elif annotations.get(prometheus.PATH) == prometheus.METRICS_PATH:
        # Istio's merge: its env holds what the annotations said before.
        for key in prometheus.keys(annotations):
            del annotations[key]
        annotations.update(prometheus.restored(scraped or ""))


def _check_status_matches(spec: PodSpec, status: dict[str, list[str]]) -> None:
    """Refuses to strip what the status annotation names unless the pod bears it out: each
    listed container is one injection adds and is there, each listed volume is there and no
    container that stays mounts it, and a container is left. Anything else would remove the
    user's own parts (the annotation was copied, edited, or written by someone else)."""
    hint = (
        f"the pod does not look injected as {ann.STATUS} says; remove that annotation "
        "(and any injected parts by hand) to inject afresh"
    )
    for field in CONTAINER_LISTS:
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
        for field in CONTAINER_LISTS
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


def _status(text: str) -> dict[str, list[str]]:
    """The status annotation's lists (Istio's shape); a value we cannot read is an error."""
    lists = _status_lists(text)
    if lists is None:
        raise InvalidAnnotationError(
            ann.STATUS,
            text,
            expected="the JSON meshctl or Istio wrote; remove it to inject afresh",
        )
    return lists


def _status_lists(text: str) -> dict[str, list[str]] | None:
    data = ann.json_object(text)
    if data is None:
        return None
    lists = {}
    for key in _STATUS_LISTS:
        value = data.get(key) or []
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            return None
        lists[key] = value
    return lists


def _probers(container: Container) -> dict[str, object]:
    return ann.json_object(_env_value(container, probes.PROBERS_ENV) or "{}") or {}


def _env_value(container: Container, name: str) -> str | None:
    for entry in container.get("env") or ():
        if isinstance(entry, dict) and entry.get("name") == name:
            value = entry.get("value")
            return value if isinstance(value, str) else None
    return None
