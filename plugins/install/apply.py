"""Putting a rendered install into the cluster: preflight, take-over, apply, prune.

Order of a run: read every object the manifest names and every mutating webhook configuration;
refuse (unless ``--force``) when an object with our name is someone else's or a foreign webhook
would inject the pods ours does; then server-side apply (field manager ``meshctl``, forced over
fields other managers took from ours) in manifest order, CRDs established before anything
else; then prune this revision's objects the manifest no longer has, and shared ones no revision
still enables. Invariants: an object that is not ours is never changed without ``--force``, and
never without a copy saved first; CRDs and namespaces are never pruned (they hold users' data);
a CRD of a newer bundle than ours (``core.k8s.install.bundles``) is kept, not downgraded;
applying an unchanged manifest writes nothing the server keeps (no resourceVersion moves).
"""

from __future__ import annotations

import datetime
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from meshctl import config
from meshctl.core.k8s.install import bundles, ownership
from meshctl.core.k8s.install import manifest as mf
from meshctl.core.k8s.install.components import Registry, Values
from meshctl.core.k8s.install.readiness import crd as crd_readiness
from meshctl.errors import MeshctlError
from meshctl.kube import objects
from meshctl.kube.inventory import Inventory
from meshctl.kube.resources import MUTATING_WEBHOOK_CONFIGURATIONS, SERVICES

log = logging.getLogger(__name__)

NEVER_PRUNED = frozenset({"CustomResourceDefinition", "Namespace"})
CRD_ESTABLISH_TIMEOUT = 60.0


@dataclass(frozen=True, slots=True)
class Problem:
    """Something that stops an install until the user (or ``--force``) decides."""

    key: mf.Key
    text: str  # one line: what it is and why it is in the way
    live: Mapping[str, object]
    action: str  # "replace": take over an object with our name; "delete": a foreign webhook


@dataclass(frozen=True, slots=True)
class Applied:
    key: mf.Key
    outcome: str  # "created", "configured" or "unchanged"


def all_kinds(registry: Registry, values: Values) -> list[tuple[str, str]]:
    """(apiVersion, kind) of everything any component renders with every component enabled:
    what prune and uninstall list (a kind no current component renders may still be live)."""
    full = values.with_enabled(c.name for c in registry.components)
    kinds = [(r.api_version, r.kind) for r in mf.render(registry, full)]
    return list(dict.fromkeys(kinds))


class Installer:
    def __init__(
        self,
        inventory: Inventory,
        registry: Registry,
        values: Values,
        rendered: Sequence[mf.Rendered],
        *,
        say: Callable[[str], None],
    ) -> None:
        self.inventory = inventory
        self.kube = inventory.kube
        self.registry = registry
        self.values = values
        self.rendered = list(rendered)
        self.say = say
        self.live: dict[mf.Key, Mapping[str, object] | None] = {}

    # -- preflight -------------------------------------------------------------------------

    def preflight(self) -> list[Problem]:
        """Objects with our names that are not ours, and foreign webhooks overlapping ours;
        an object for a namespace that neither exists nor comes with the install stops it."""
        self._namespaces_exist()
        problems: list[Problem] = []
        for item in list(self.rendered):
            if not self.inventory.mapper.served(item.api_version, item.kind):
                self.live[item.key] = None  # its CRD is not installed yet: nothing to clash
                continue
            live = self.inventory.get(item.object)
            self.live[item.key] = live
            if live is None:
                continue
            kept = bundles.keep_live(item.object, live)
            if kept is not None:
                self.say(f"{item.key}: {kept}")
                self.rendered.remove(item)
                continue
            if (live.get("metadata") or {}).get("deletionTimestamp"):
                raise MeshctlError(
                    f"{item.key} is being deleted",
                    hint="wait until it is gone (meshctl uninstall waits for it), then install",
                )
            if not ownership.is_ours(live):
                text = f"{item.key}: {ownership.foreign_reason(live)}"
                if item.kind == "MutatingWebhookConfiguration":
                    text += self._targets(live)
                problems.append(Problem(item.key, text, live, "replace"))
        ours = [r.object for r in self.rendered if r.kind == "MutatingWebhookConfiguration"]
        if ours:
            configurations, _ = objects.list_objects(self.kube, MUTATING_WEBHOOK_CONFIGURATIONS)
            rendered_keys = {r.key for r in self.rendered}
            for live in configurations:
                live.setdefault("apiVersion", MUTATING_WEBHOOK_CONFIGURATIONS.api_version)
                live.setdefault("kind", MUTATING_WEBHOOK_CONFIGURATIONS.kind)
                key = mf.key_of(live)
                if key in rendered_keys or ownership.is_ours(live):
                    continue
                found = ownership.overlaps(live, ours)
                if found:
                    first = found[0]
                    text = (
                        f"{key} ({ownership.foreign_reason(live)}) injects the pods ours does: its "
                        f"webhook {first.webhook} overlaps {first.ours}"
                    ) + self._targets(live)
                    problems.append(Problem(key, text, live, "delete"))
        return problems

    def _targets(self, configuration: Mapping[str, object]) -> str:
        """'; it sends pods to service ns/name (which does not exist: ...)' for a webhook config."""
        listed = configuration.get("webhooks")
        hooks = [
            h
            for h in (listed if isinstance(listed, list) else ())
            if isinstance(h, Mapping) and h.get("clientConfig")
        ]
        if not hooks:
            return "; it has no webhooks"
        hook = hooks[0]
        target, service = ownership._target(hook)
        text = f"; it sends pods to {target}"
        if service is not None and objects.get(self.kube, SERVICES, service[1], service[0]) is None:
            policy = hook.get("failurePolicy") or "Fail"
            text += ", which does not exist"
            if policy == "Fail":
                text += " (failurePolicy Fail: every pod it matches is refused)"
        return text

    def take_over(self, problems: Sequence[Problem]) -> None:
        """``--force``: save a copy of each, then replace it with ours or delete it."""
        for problem in problems:
            saved = save_copy(problem.live)
            resource = self.inventory.resource(problem.live)
            namespace = self.inventory.namespace_of(problem.live)
            if problem.action == "delete":
                objects.delete(self.kube, resource, problem.key.name, namespace)
                self.say(f"removed {problem.key} (a copy is in {saved})")
                continue
            ours = next(r.object for r in self.rendered if r.key == problem.key)
            body = json.loads(json.dumps(ours))
            body["metadata"]["resourceVersion"] = mf.lookup(
                problem.live, "metadata", "resourceVersion"
            )
            # A replace drops every field the other owner set; the apply below then owns ours.
            self.live[problem.key] = objects.replace(
                self.kube, resource, body, namespace, field_manager=mf.FIELD_MANAGER
            )
            self.say(f"took over {problem.key} (a copy of the old one is in {saved})")

    # -- apply -----------------------------------------------------------------------------

    def apply(self) -> list[Applied]:
        done: list[Applied] = []
        crds_pending: list[mf.Rendered] = []
        for item in self.rendered:
            if crds_pending and item.kind != "CustomResourceDefinition":
                self._wait_established(crds_pending)
                crds_pending = []
            before = self.live.get(item.key)
            answer = self._server_apply(item, self.inventory.namespace_of(item.object))
            if before is None:
                outcome = "created"
            elif _version(before) == _version(answer):
                outcome = "unchanged"
            else:
                outcome = "configured"
            done.append(Applied(item.key, outcome))
            log.info("%s %s", item.key, outcome)
            if item.kind == "CustomResourceDefinition":
                crds_pending.append(item)
        if crds_pending:
            self._wait_established(crds_pending)
        return done

    def _server_apply(
        self, item: mf.Rendered, namespace: str | None, *, dry_run: bool = False
    ) -> Mapping[str, Any]:
        """Server-side apply of ``item`` as this install's field manager, taking over the fields
        another manager holds (``kubectl apply --server-side --force-conflicts``)."""
        return objects.apply(
            self.kube,
            self.inventory.resource(item.object),
            dict(item.object),
            namespace,
            field_manager=mf.FIELD_MANAGER,
            force=True,
            dry_run=dry_run,
        )

    def _wait_established(self, crds: Sequence[mf.Rendered]) -> None:
        deadline = time.monotonic() + CRD_ESTABLISH_TIMEOUT
        for item in crds:
            while True:
                state = crd_readiness(self.inventory.get(item.object) or {})
                if state.ready:
                    break
                if time.monotonic() > deadline:
                    raise MeshctlError(
                        f"{item.key} not established after {CRD_ESTABLISH_TIMEOUT:.0f}s: "
                        f"{state.reason}",
                        hint="check the API server's log; another CRD may claim the same names",
                    )
                time.sleep(0.2)

    def dry_run(self) -> tuple[list[Mapping[str, object]], list[str]]:
        """``--dry-run=server``: every object as the API server would persist it (defaulted,
        admitted; nothing persisted), in manifest order; an object the server cannot check yet
        (its namespace or its CRD comes with this install) is kept as rendered and named in the
        second list with why."""
        answers: list[Mapping[str, object]] = []
        unchecked: list[str] = []
        namespaces: dict[str, bool] = {}
        for item in self.rendered:
            if not self.inventory.mapper.served(item.api_version, item.kind):
                unchecked.append(f"{item.key} (its CRD is installed with it)")
                answers.append(item.object)
                continue
            namespace = self.inventory.namespace_of(item.object)
            if namespace and not namespaces.setdefault(namespace, self._exists(namespace)):
                unchecked.append(f"{item.key} (namespace {namespace} is created with it)")
                answers.append(item.object)
                continue
            answer = self._server_apply(item, namespace, dry_run=True)
            # As kubectl shows objects: without managedFields (its --show-managed-fields).
            answer.get("metadata", {}).pop("managedFields", None)
            answers.append(answer)
        return answers, unchecked

    def _namespaces_exist(self) -> None:
        """Objects outside the mesh's namespace (the istiod alias in istio-system) need their
        namespace first: install makes only its own, never one another tool may own."""
        made = {r.key.name for r in self.rendered if r.kind == "Namespace"}
        checked: dict[str, bool] = {}
        for item in self.rendered:
            namespace = item.key.namespace  # rendered objects name one only when namespaced
            if not namespace or namespace in made:
                continue
            if not checked.setdefault(namespace, self._exists(namespace)):
                raise MeshctlError(
                    f"{item.key} goes into namespace {namespace}, which does not exist "
                    "(install creates only its own namespace)",
                    hint=f"create it first: kubectl create namespace {namespace}",
                )

    def _exists(self, namespace: str) -> bool:
        found = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}}
        return self.inventory.get(found) is not None

    # -- prune -----------------------------------------------------------------------------

    def prune(self) -> list[mf.Key]:
        """Delete this install's objects the manifest no longer has (never CRDs or namespaces)."""
        wanted = {r.key for r in self.rendered}
        kinds = [k for k in all_kinds(self.registry, self.values) if k[1] not in NEVER_PRUNED]
        stale = self.inventory.list_labelled(kinds, mf.selector(self.values.revision))
        enabled_elsewhere = self.enabled_by_other_revisions()
        for live in self.inventory.list_labelled(kinds, mf.selector(None)):
            if mf.component_of(live) not in enabled_elsewhere:
                stale.append(live)
        removed = []
        for live in stale:
            key = mf.key_of(live)
            if key in wanted:
                continue
            resource = self.inventory.resource(live)
            objects.delete(
                self.kube,
                resource,
                key.name,
                self.inventory.namespace_of(live),
                propagation="Background",
            )
            removed.append(key)
            self.say(f"pruned {key} (no longer in the manifest)")
        return removed

    def enabled_by_other_revisions(self) -> set[str]:
        """Components the install records of other revisions enable (their shared objects stay)."""
        return enabled_by_records(
            self.inventory, self.values.namespace, exclude=self.values.revision
        )


def enabled_by_records(inventory: Inventory, namespace: str, exclude: str | None) -> set[str]:
    records = inventory.list_labelled(
        [("v1", "ConfigMap")], f"{mf.COMPONENT_LABEL}={mf.INSTALL}", namespace
    )
    enabled: set[str] = set()
    for record in records:
        if mf.lookup(record, "data", "revision") == exclude:
            continue
        listed = mf.lookup(record, "data", "components") or ""
        enabled.update(filter(None, str(listed).split(",")))
    return enabled


def _version(obj: Mapping[str, object]) -> str:
    return str(mf.lookup(obj, "metadata", "resourceVersion") or "")


def save_copy(live: Mapping[str, object]) -> Path:
    """A YAML copy of an object install is about to replace or delete, under the state dir."""
    import yaml

    directory = config.state_dir() / "backups"
    directory.mkdir(parents=True, exist_ok=True)
    key = mf.key_of(live)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    name = f"{stamp}-{key.kind}-{key.namespace + '-' if key.namespace else ''}{key.name}.yaml"
    path = directory / name
    clean = json.loads(json.dumps(live))
    clean.get("metadata", {}).pop("managedFields", None)
    path.write_text(yaml.safe_dump(clean, sort_keys=False), encoding="utf-8")
    return path
