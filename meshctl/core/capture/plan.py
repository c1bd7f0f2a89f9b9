"""Settings -> everything capture installs: one rule set per address family, plus policy routing.

Invariant: the plan is a pure function of the settings; apply, check, clean, render and trace
all start from it, so they can never disagree about what "the capture rules" are.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshctl.core.capture import ambient, routing, sidecar
from meshctl.core.capture.rules import Family, RuleSet
from meshctl.core.capture.settings import CaptureSettings


@dataclass(frozen=True, slots=True)
class CapturePlan:
    settings: CaptureSettings
    rulesets: tuple[RuleSet, ...]
    routing: routing.Routing

    @property
    def families(self) -> tuple[Family, ...]:
        return tuple(r.family for r in self.rulesets)

    def ruleset(self, family: Family) -> RuleSet:
        """The rule set for ``family``; empty when that family is not enabled."""
        return next((r for r in self.rulesets if r.family is family), RuleSet(family))


def families(s: CaptureSettings) -> tuple[Family, ...]:
    return (Family.IPV4, Family.IPV6) if s.dual_stack else (Family.IPV4,)


def plan(s: CaptureSettings) -> CapturePlan:
    build = ambient.build if s.mode == "ambient" else sidecar.build
    fams = families(s)
    return CapturePlan(
        settings=s,
        rulesets=tuple(build(s, f) for f in fams),
        routing=routing.plan(s, fams),
    )
