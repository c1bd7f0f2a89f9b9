"""An in-place upgrade as data: the installed values from the install record, and what applying
this version's manifest of them changes, object by object and field by field.

Invariants: the values are the record's (its profile and what the user changed), with only what
the upgrade itself is given (``--set``/``-f``) on top, and the revision and namespace of the
record; a plan names every object the manifest has (created, changed with the fields that
change, unchanged) and every live object of the install the manifest no longer has (pruned), so
``upgrade --dry-run`` shows the whole change; values in, values out.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from meshctl.core.k8s.install import manifest as mf
from meshctl.core.k8s.install.components import Registry, Values
from meshctl.core.k8s.install.drift import differences
from meshctl.errors import MeshctlError

CREATE = "create"
CHANGE = "change"
UNCHANGED = "unchanged"
PRUNE = "prune"


@dataclass(frozen=True, slots=True, kw_only=True)
class Step:
    """What the upgrade does to one object."""

    key: mf.Key
    component: str
    action: str  # CREATE, CHANGE, UNCHANGED or PRUNE
    fields: tuple[str, ...] = ()  # for CHANGE: each difference, "path is X, the manifest sets Y"

    def row(self) -> dict[str, object]:
        return {
            "object": str(self.key),
            "component": self.component,
            "action": self.action,
            "fields": list(self.fields),
        }


def recorded_values(
    registry: Registry,
    record: Mapping[str, Any],
    *,
    files: Sequence[tuple[str, object]] = (),
    assignments: Sequence[str] = (),
) -> Values:
    """The values the install record holds (profile, what the user changed, revision and
    namespace), with ``files`` and ``assignments`` (the upgrade's own ``-f``/``--set``) on top."""
    name = mf.key_of(record).name
    raw = record.get("data")
    data: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}
    try:
        changed = json.loads(str(data.get("values.json") or "{}"))
    except ValueError as exc:
        raise MeshctlError(
            f"install record {name}: values.json is not JSON",
            hint="run 'meshctl install' again with the values you installed with",
        ) from exc
    namespace = mf.key_of(record).namespace or None
    return registry.resolve(
        profile=str(data.get("profile") or "default"),
        files=[(f"install record {name}", changed), *files],
        assignments=list(assignments),
        revision=str(data.get("revision") or "default"),
        namespace=namespace,
    )


def recorded_version(record: Mapping[str, Any]) -> str:
    data = record.get("data")
    return str(data.get("version") or "?") if isinstance(data, Mapping) else "?"


def plan(
    rendered: Sequence[mf.Rendered],
    live: Mapping[mf.Key, Mapping[str, Any] | None],
    installed: Sequence[Mapping[str, Any]] = (),
) -> list[Step]:
    """What applying ``rendered`` over the cluster's ``live`` objects (None: absent) does, and
    which of the install's ``installed`` objects the manifest no longer has (pruned)."""
    steps = []
    for item in rendered:
        found = live.get(item.key)
        if found is None:
            steps.append(Step(key=item.key, component=item.component, action=CREATE))
            continue
        changed = tuple(str(d) for d in differences(item.object, found))
        action = CHANGE if changed else UNCHANGED
        steps.append(Step(key=item.key, component=item.component, action=action, fields=changed))
    wanted = {item.key for item in rendered}
    for obj in installed:
        key = mf.key_of(obj)
        if key not in wanted and obj.get("kind") not in ("CustomResourceDefinition", "Namespace"):
            component = mf.component_of(obj) or "?"
            steps.append(Step(key=key, component=component, action=PRUNE))
    return steps


def summary(steps: Sequence[Step]) -> str:
    """``2 to create, 3 to change, 20 unchanged, 1 to prune``."""
    counts = {a: sum(s.action == a for s in steps) for a in (CREATE, CHANGE, UNCHANGED, PRUNE)}
    words = {CREATE: "to create", CHANGE: "to change", UNCHANGED: "unchanged", PRUNE: "to prune"}
    return ", ".join(f"{n} {words[a]}" for a, n in counts.items())


def table(steps: Sequence[Step]) -> list[dict[str, str]]:
    """The plan for people: one row an object that changes (with its first changed field)."""
    rows = []
    for step in steps:
        if step.action == UNCHANGED:
            continue
        detail = step.fields[0] if step.fields else ""
        if len(step.fields) > 1:
            detail += f" (and {len(step.fields) - 1} more)"
        rows.append({"action": step.action, "object": str(step.key), "change": detail or "-"})
    return rows
