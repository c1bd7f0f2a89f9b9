"""What a verify check is given: the cluster handles, the installed values and their manifest.

Invariant: built once per ``meshctl verify`` run; ``memo`` lets checks share what one of them
read (a Deployment, the root certificate) so each object is fetched once per run.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from meshctl.core.k8s.install.checks import Result
from meshctl.core.k8s.install.components import Registry, Values
from meshctl.core.k8s.install.manifest import Rendered
from meshctl.core.k8s.install.readiness import readiness


@dataclass(slots=True, kw_only=True)
class CheckContext:
    kube: Any  # meshctl.kube.client.Kube (the core does not import adapters)
    cluster: Any  # meshctl.kube.inventory.Inventory over ``kube``
    registry: Registry
    values: Values  # the installed values (with --pre: those install would use)
    rendered: Sequence[Rendered]  # their manifest
    pre: bool = False
    workload: str | None = None  # NAMESPACE/POD for the data-plane checks
    memo: dict[Any, Any] = field(default_factory=dict)

    def of(self, component: str, kind: str | None = None) -> list[Rendered]:
        """The rendered objects of ``component`` (of one ``kind`` if given)."""
        return [
            r
            for r in self.rendered
            if r.component == component and (kind is None or r.kind == kind)
        ]

    def live(self, item: Rendered) -> Mapping[str, object] | None:
        """The live object behind ``item``, read once per run."""
        key = ("live", item.key)
        if key not in self.memo:
            self.memo[key] = self.cluster.get(item.object)
        value: Mapping[str, object] | None = self.memo[key]
        return value


def rollout(ctx: CheckContext, component: str, kind: str, *, absent: str, missing: str) -> Result:
    """The check that ``component``'s ``kind`` (a DaemonSet, a Deployment) is rolled out and
    ready: skipped when this install has none (``absent`` says why), failed when it is gone
    (``missing``: what that breaks) or not ready (its reason and its pods' problems)."""
    items = ctx.of(component, kind)
    if not items:
        return Result.skip(absent)
    item = items[0]
    live = ctx.live(item)
    if live is None:
        return Result.fail(
            f"{item.key} not found: {missing}",
            hint="run 'meshctl install' again with the same profile and revision",
        )
    state = readiness(live)
    if not state.ready:
        return Result.fail(
            f"{item.key}: {state.reason}",
            hint=f"see 'kubectl -n {item.key.namespace} describe {kind.lower()} "
            f"{item.key.name}' and the pods' logs",
            details=ctx.cluster.pod_problems(live)[:5],
        )
    return Result.ok(state.reason)
