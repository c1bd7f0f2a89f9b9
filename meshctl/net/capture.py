"""Apply, check and clean a capture plan in a network namespace: the kernel side of the engine.

Invariants:
- Both address families are always reconciled: a family the plan does not enable is driven to
  "no meshctl rules", so turning IPv6 off (or changing any knob) removes what is no longer wanted.
- Applying what is already installed changes nothing (no restore run, no netlink write).
- All-or-nothing: every change is validated before the first commit; if a later step fails
  (the other family, or policy routing), the steps already done are rolled back to the state
  read at the start, and the error says so.
- ``dry_run`` reads the kernel but never writes: it returns exactly the changes it would make.
- meshctl's policy routing exists only together with its MESH_ chains (``check`` still reads it
  every time, so a stray route is reported even then).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field

from meshctl.core.capture import hostprobe, render
from meshctl.core.capture.plan import CapturePlan
from meshctl.core.capture.routing import Routing
from meshctl.core.capture.rules import Family, RuleSet
from meshctl.errors import MeshctlError, NetError
from meshctl.net import iptables, netns, routing

log = logging.getLogger(__name__)

FAMILIES = (Family.IPV4, Family.IPV6)


@dataclass(frozen=True, slots=True)
class Outcome:
    """What an apply or clean did (or, with dry-run, would do)."""

    backend: str
    changes: dict[Family, str] = field(default_factory=dict)  # restore input per family
    routing: tuple[str, ...] = ()

    @property
    def changed(self) -> bool:
        return any(self.changes.values()) or bool(self.routing)


@dataclass(frozen=True, slots=True)
class Drift:
    """Installed versus desired: per-family unified diffs and routing differences."""

    backend: str
    diffs: dict[Family, str] = field(default_factory=dict)
    routing: tuple[str, ...] = ()

    @property
    def in_sync(self) -> bool:
        return not any(self.diffs.values()) and not self.routing


def apply(
    plan: CapturePlan, *, target: netns.NetnsRef | None, backend: str, dry_run: bool = False
) -> Outcome:
    with netns.entered(target):
        choice = iptables.select(backend, FAMILIES)
        chosen = choice.backend
        before = {f: _installed(choice, f) for f in FAMILIES}
        # meshctl's policy routing only ever exists beside its MESH_ chains (apply adds both,
        # clean and rollback remove both), so without any chain of ours there is nothing of it
        # to read: a fresh namespace skips two netlink dumps (the iptc fast path, and most of an
        # ambient pod's enrollment). Should a stray route be there after all, adding the same
        # one again is no error (``routing.reconcile``).
        nothing_yet = all(r.is_empty() for r in before.values())
        routes_before = Routing() if nothing_yet else routing.read()
        texts = {f: render.transition(before[f], plan.ruleset(f)) for f in FAMILIES}
        if dry_run:
            return Outcome(chosen.name, texts, tuple(routing.changes(routes_before, plan.routing)))
        done: list[Family] = []
        try:
            for family in FAMILIES:
                if texts[family]:
                    chosen.write(family, before[family], plan.ruleset(family))
                    done.append(family)
            route_changes = routing.reconcile(routes_before, plan.routing)
        except MeshctlError as exc:
            _roll_back(chosen, done, before, plan, routes_before)
            if done:
                raise NetError(
                    f"{exc.message} (the {', '.join(f.label for f in done)} rules applied before "
                    "this failure were rolled back)",
                    hint=exc.hint,
                ) from exc
            raise
        return Outcome(chosen.name, texts, tuple(route_changes))


def _roll_back(
    chosen: iptables.Backend,
    done: list[Family],
    before: dict[Family, RuleSet],
    plan: CapturePlan,
    routes_before: Routing,
) -> None:
    """Best effort back to the state read at the start; failures here are logged, not raised,
    so the error the user sees is the one that started it."""
    try:
        routing.reconcile(routing.read(), routes_before)
    except MeshctlError as exc:
        log.warning("rolling back policy routing failed: %s", exc.message)
    for family in reversed(done):
        try:
            chosen.write(family, plan.ruleset(family), before[family])
        except MeshctlError as exc:
            log.warning("rolling back %s rules failed: %s", family.label, exc.message)


def check(plan: CapturePlan, *, target: netns.NetnsRef | None, backend: str) -> Drift:
    with netns.entered(target):
        choice = iptables.select(backend, FAMILIES)
        diffs = {f: render.diff(_installed(choice, f), plan.ruleset(f)) for f in FAMILIES}
        route_changes = routing.changes(routing.read(), plan.routing)
    return Drift(choice.backend.name, diffs, tuple(route_changes))


def _installed(choice: iptables.Choice, family: Family) -> RuleSet:
    """meshctl's part of the tables; a family without any MESH_ chain needs no read (a jump to
    a chain cannot exist without the chain)."""
    if family not in choice.ours:
        return RuleSet(family)
    return choice.backend.read(family).ours()


def clean(
    *,
    target: netns.NetnsRef | None,
    backend: str,
    dry_run: bool = False,
    in_process: bool = False,
) -> list[Outcome]:
    """Remove every MESH_ chain and jump (and meshctl's policy routing), nothing else.

    With ``auto`` every backend kind holding meshctl chains is cleaned (a mixed namespace can be
    repaired this way); an explicit backend cleans only its own tables. ``in_process``: legacy
    tables through libiptc (no xtables lock file needed: for namespaces only meshctl writes).
    """
    with netns.entered(target):
        if backend == "auto":
            holders = iptables.holders(FAMILIES, in_process=in_process)
        else:
            holders = [iptables.select(backend, FAMILIES).backend]
        outcomes = []
        for chosen in holders:
            texts: dict[Family, str] = {}
            for family in FAMILIES:
                installed = chosen.read(family).ours()
                texts[family] = render.cleanup(installed)
                if texts[family] and not dry_run:
                    chosen.write(family, installed, RuleSet(family))
            outcomes.append(Outcome(chosen.name, texts))
        installed_routes = routing.read()
        kept = Routing(addresses=installed_routes.addresses)  # ::6 stays, as Istio leaves it
        route_changes = routing.changes(installed_routes, kept)
        if route_changes and not dry_run:
            routing.reconcile(installed_routes, kept)
        if route_changes or not outcomes:
            outcomes.append(Outcome("routing", {}, tuple(route_changes)))
    return outcomes


def apply_host_probe(
    pod_ips: Iterable[str], *, target: netns.NetnsRef | None, backend: str = "auto"
) -> Outcome:
    """The node's probe SNAT rules (``hostprobe``) for exactly ``pod_ips``; only ``MESH_POSTRT``
    and its jump are read and written, whatever else the node's tables hold (kube-proxy's...).

    ``auto``: in the kind of tables the node's kubelet and kube-proxy use (``host_kind``); ours
    found in the other kind (an older agent's choice) are moved, so one host never mixes both.
    """
    ips = list(pod_ips)
    with netns.entered(target):
        if backend == "auto":
            kind = iptables.host_kind(FAMILIES)
            writer = iptables.host_backend(kind)
            other = "nft" if kind == "legacy" else "legacy"
            stale = _host_holder(other)
            ours = _host_ours(writer)
        else:
            choice = iptables.select(backend, FAMILIES)
            writer, stale = choice.backend, None
            ours = {f: _installed(choice, f) for f in FAMILIES}
        texts: dict[Family, str] = {}
        for family in FAMILIES:
            installed = hostprobe.scoped(ours[family])
            desired = hostprobe.build(ips, family)
            texts[family] = render.transition(installed, desired)
            if texts[family]:
                writer.write(family, installed, desired)
        if stale is not None:
            for family in FAMILIES:
                left = hostprobe.scoped(stale.read(family).ours())
                if not left.is_empty():
                    log.info("moving the node's probe rules out of the %s tables", stale.variant)
                    stale.write(family, left, RuleSet(family))
    return Outcome(writer.name, texts)


def _host_holder(kind: str) -> iptables.Backend | None:
    """The writer of ``kind`` when those tables hold meshctl chains on this host, else None."""
    presence = iptables.legacy_presence if kind == "legacy" else iptables.nft_presence
    if not presence(FAMILIES).has_ours:
        return None
    return iptables.host_backend(kind)


def _host_ours(writer: iptables.Backend) -> dict[Family, RuleSet]:
    return {f: writer.read(f).ours() for f in FAMILIES}
