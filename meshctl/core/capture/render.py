"""The rule model -> ``iptables-restore`` text: the full set, the change set, the cleanup set.

Invariants:
- ``render(x)`` is a faithful serialisation: ``parse(render(x)) == x`` (policies of built-in chains
  are written only when the model has them, i.e. when it was read from a kernel).
- ``transition(installed, desired)`` is the one change-set generator. Applied with
  ``--noflush`` it turns ``installed`` (meshctl's part of a kernel) into ``desired`` and touches
  nothing else: it deletes our jumps from built-in chains, (re)declares our chains (which flushes
  them), appends the desired rules and deletes chains no longer wanted. Its empty result means
  "already applied". ``cleanup(x)`` is ``transition(x, nothing)`` and ``render_apply`` is
  ``transition(nothing, x)``: the cleanup and the apply are derived from the same rule set.
- ``diff`` is a unified diff of the two renderings, so a drift report reads like the rules.
"""

from __future__ import annotations

import difflib
import re

from meshctl.core.capture.rules import Chain, Family, Rule, RuleSet, Table, is_builtin

_SAFE_WORD = re.compile(r"[A-Za-z0-9_.,:/@%+=^!*-]+")


def quote(word: str) -> str:
    """A word as iptables-save writes it: bare when safe, else in double quotes."""
    if _SAFE_WORD.fullmatch(word):
        return word
    return '"' + word.replace("\\", "\\\\").replace('"', '\\"') + '"'


def rule_text(rule: Rule) -> str:
    return " ".join(quote(w) for w in rule.words())


def render(ruleset: RuleSet) -> str:
    """Every table as a restore block: chain declarations, then ``-A`` lines per chain."""
    out: list[str] = []
    for table in ruleset.tables:
        out.append(f"*{table.name}")
        for chain in table.chains:
            if not is_builtin(table.name, chain.name):
                out.append(f":{chain.name} - [0:0]")
            elif chain.policy is not None:
                out.append(f":{chain.name} {chain.policy} [0:0]")
        out.extend(_appends(table.chains))
        out.append("COMMIT")
    return "".join(line + "\n" for line in out)


def _appends(chains: tuple[Chain, ...] | list[Chain]) -> list[str]:
    return [f"-A {c.name} {rule_text(r)}".rstrip() for c in chains for r in c.rules]


def transition(installed: RuleSet, desired: RuleSet) -> str:
    """The ``iptables-restore --noflush`` input that turns ``installed`` into ``desired``.

    Both sides are meshctl's part only (``RuleSet.ours()``). Empty when they are equal.
    """
    installed, desired = installed.ours(), desired.ours()
    if installed == desired:
        return ""
    out: list[str] = []
    names = sorted({t.name for t in installed.tables} | {t.name for t in desired.tables})
    for name in names:
        old = installed.table(name) or Table(name)
        new = desired.table(name) or Table(name)
        if old == new:
            continue
        wanted = {c.name for c in new.user_chains()}
        obsolete = [c.name for c in old.user_chains() if c.name not in wanted]
        out.append(f"*{name}")
        # Our jumps first: a chain cannot be flushed-and-refilled or deleted while a stale jump
        # still points at it, and re-adding them below keeps their order.
        out.extend(
            f"-D {c.name} {rule_text(r)}"
            for c in old.chains
            if is_builtin(name, c.name)
            for r in c.rules
        )
        out.extend(f":{c} - [0:0]" for c in sorted(wanted))  # creates, or flushes (--noflush)
        out.extend(f"-F {c}" for c in obsolete)
        out.extend(_appends([c for c in new.chains if is_builtin(name, c.name)]))
        out.extend(_appends(new.user_chains()))
        out.extend(f"-X {c}" for c in obsolete)
        out.append("COMMIT")
    return "".join(line + "\n" for line in out)


def render_apply(desired: RuleSet) -> str:
    """What applying ``desired`` to a namespace without meshctl rules feeds to iptables-restore."""
    return transition(RuleSet(desired.family), desired)


def cleanup(installed: RuleSet) -> str:
    """What removes ``installed`` (our jumps and chains) and nothing else."""
    return transition(installed, RuleSet(installed.family))


def diff(installed: RuleSet, desired: RuleSet) -> str:
    """A unified diff from installed to desired (meshctl's part only); empty when in sync."""
    label = desired.family.label
    lines = difflib.unified_diff(
        render(installed.ours()).splitlines(),
        render(desired.ours()).splitlines(),
        fromfile=f"installed ({label})",
        tofile=f"desired ({label})",
        lineterm="",
    )
    return "".join(line + "\n" for line in lines)


def command_prefix(family: Family) -> str:
    return "iptables" if family is Family.IPV4 else "ip6tables"
