"""The rule model: iptables tables, chains and rules as frozen values, for IPv4 and IPv6.

Invariants:
- A rule is spelled the way ``iptables-save`` prints it (``-p tcp -m tcp --dport 15008``,
  ``-d 127.0.0.1/32``, marks in hex), so a rule read back from the kernel equals the rule we built
  and "installed == desired" is plain equality.
- A ``RuleSet`` in canonical form has its tables sorted by name, built-in chains first in kernel
  order, then user chains sorted by name (the order both iptables-save variants print).
- meshctl's rules live in chains named ``MESH_*``; a built-in chain only ever holds jumps into
  them. ``RuleSet.ours()`` is therefore exactly what meshctl installed, whatever else is there.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator
from dataclasses import dataclass, field, replace

MESH_PREFIX = "MESH_"

# Built-in chains per table, in the order the kernel (and iptables-save) lists them.
BUILTIN_CHAINS: dict[str, tuple[str, ...]] = {
    "filter": ("INPUT", "FORWARD", "OUTPUT"),
    "mangle": ("PREROUTING", "INPUT", "FORWARD", "OUTPUT", "POSTROUTING"),
    "nat": ("PREROUTING", "INPUT", "OUTPUT", "POSTROUTING"),
    "raw": ("PREROUTING", "OUTPUT"),
    "security": ("INPUT", "FORWARD", "OUTPUT"),
}
TABLES = tuple(sorted(BUILTIN_CHAINS))

# Verdicts every table understands; anything else is an extension target or a user chain.
STANDARD_TARGETS = frozenset({"ACCEPT", "DROP", "RETURN", "QUEUE"})


class Family(enum.StrEnum):
    """The address family a rule set is for: ``iptables`` or ``ip6tables``."""

    IPV4 = "ipv4"
    IPV6 = "ipv6"

    @property
    def label(self) -> str:
        return "IPv4" if self is Family.IPV4 else "IPv6"


def is_builtin(table: str, chain: str) -> bool:
    return chain in BUILTIN_CHAINS.get(table, ())


def is_ours(chain: str) -> bool:
    return chain.startswith(MESH_PREFIX)


@dataclass(frozen=True, slots=True)
class Option:
    """One ``[!] --name [args...]`` of a match or a target (``name`` without the dashes)."""

    name: str
    args: tuple[str, ...] = ()
    negated: bool = False

    def words(self) -> list[str]:
        return [*(["!"] if self.negated else []), f"--{self.name}", *self.args]

    def arg(self) -> str:
        """The single argument (``--dport 53`` -> ``"53"``); empty for a flag."""
        return " ".join(self.args)


@dataclass(frozen=True, slots=True)
class Match:
    """``-m module`` and its options."""

    module: str
    options: tuple[Option, ...] = ()

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)


@dataclass(frozen=True, slots=True)
class Criterion:
    """A built-in criterion value (``-s``, ``-d``, ``-i``, ``-o``, ``-p``), maybe negated."""

    value: str
    negated: bool = False


@dataclass(frozen=True, slots=True)
class Target:
    """``-j NAME`` (or ``-g NAME``) and the target's options."""

    name: str
    options: tuple[Option, ...] = ()
    goto: bool = False

    def option(self, name: str) -> Option | None:
        return next((o for o in self.options if o.name == name), None)


# (flag, attribute) of the built-in criteria, in the order iptables-save prints them.
CRITERIA = (
    ("-s", "source"),
    ("-d", "destination"),
    ("-i", "in_interface"),
    ("-o", "out_interface"),
    ("-p", "protocol"),
)


@dataclass(frozen=True, slots=True)
class Rule:
    """One rule: built-in criteria, then matches in order, then the target.

    ``note`` says why the rule exists (shown by ``meshctl iptables trace``); it is not part of the
    rule's identity, so a rule parsed back from the kernel still equals the one we built.
    """

    source: Criterion | None = None
    destination: Criterion | None = None
    in_interface: Criterion | None = None
    out_interface: Criterion | None = None
    protocol: Criterion | None = None
    fragment: Criterion | None = None
    matches: tuple[Match, ...] = ()
    target: Target | None = None
    note: str = field(default="", compare=False)

    def words(self) -> list[str]:
        """The rule's arguments as iptables-save prints them (after ``-A CHAIN``)."""
        out: list[str] = []
        for flag, attr in CRITERIA:
            crit: Criterion | None = getattr(self, attr)
            if crit is not None:
                out += [*(["!"] if crit.negated else []), flag, crit.value]
        if self.fragment is not None:
            out += [*(["!"] if self.fragment.negated else []), "-f"]
        for match in self.matches:
            out += ["-m", match.module]
            for option in match.options:
                out += option.words()
        if self.target is not None:
            out += ["-g" if self.target.goto else "-j", self.target.name]
            for option in self.target.options:
                out += option.words()
        return out

    @property
    def jump(self) -> str | None:
        """The ``MESH_*`` chain this rule jumps to, if any.

        Whether a foreign target such as ``KUBE-SERVICES`` is a chain or an extension cannot be
        told from its spelling; meshctl only ever needs to recognise jumps into its own chains.
        """
        if self.target is not None and is_ours(self.target.name):
            return self.target.name
        return None

    def with_note(self, note: str) -> Rule:
        return replace(self, note=note)


@dataclass(frozen=True, slots=True)
class Chain:
    """A chain and its rules. ``policy`` is set for built-in chains read from the kernel only."""

    name: str
    rules: tuple[Rule, ...] = ()
    policy: str | None = None


@dataclass(frozen=True, slots=True)
class Table:
    name: str
    chains: tuple[Chain, ...] = ()

    def chain(self, name: str) -> Chain | None:
        return next((c for c in self.chains if c.name == name), None)

    def user_chains(self) -> list[Chain]:
        return [c for c in self.chains if not is_builtin(self.name, c.name)]

    def canonical(self) -> Table:
        """Built-in chains in kernel order (only those with a policy or rules), then user chains
        sorted by name."""
        order = BUILTIN_CHAINS.get(self.name, ())
        builtin = sorted(
            (c for c in self.chains if c.name in order and (c.rules or c.policy is not None)),
            key=lambda c: order.index(c.name),
        )
        user = sorted((c for c in self.chains if c.name not in order), key=lambda c: c.name)
        return Table(self.name, (*builtin, *user))


@dataclass(frozen=True, slots=True)
class RuleSet:
    """Everything for one address family: the tables with their chains and rules."""

    family: Family
    tables: tuple[Table, ...] = ()

    def table(self, name: str) -> Table | None:
        return next((t for t in self.tables if t.name == name), None)

    def canonical(self) -> RuleSet:
        return RuleSet(
            self.family, tuple(t.canonical() for t in sorted(self.tables, key=lambda t: t.name))
        )

    def ours(self) -> RuleSet:
        """Only what meshctl owns: ``MESH_*`` chains and the built-in rules that jump to them.

        Built-in chains lose their policy here (meshctl never sets one); tables left empty are
        dropped, so "nothing of ours installed" is ``RuleSet(family)``.
        """
        tables = []
        for table in self.tables:
            chains = []
            for chain in table.chains:
                if is_builtin(table.name, chain.name):
                    jumps = tuple(r for r in chain.rules if r.jump is not None and is_ours(r.jump))
                    if jumps:
                        chains.append(Chain(chain.name, jumps))
                elif is_ours(chain.name):
                    chains.append(chain)
            if chains:
                tables.append(Table(table.name, tuple(chains)))
        return RuleSet(self.family, tuple(tables)).canonical()

    def is_empty(self) -> bool:
        return not any(t.chains for t in self.tables)

    def rules(self) -> Iterator[tuple[str, str, Rule]]:
        """Every rule as ``(table, chain, rule)``."""
        for table in self.tables:
            for chain in table.chains:
                for rule in chain.rules:
                    yield table.name, chain.name, rule

    def count(self) -> int:
        return sum(1 for _ in self.rules())


class RuleSetBuilder:
    """Collects rules per table and chain in insertion order, then prunes and canonicalises.

    User chains that no built-in chain can reach are dropped on ``build``: a chain nothing jumps
    to changes no packet, and leaving it out keeps apply, check and clean minimal.
    """

    def __init__(self, family: Family) -> None:
        self.family = family
        self._chains: dict[str, dict[str, list[Rule]]] = {}

    def chain(self, table: str, chain: str) -> list[Rule]:
        """The (mutable, while building) rule list of ``table``/``chain``, created on first use."""
        return self._chains.setdefault(table, {}).setdefault(chain, [])

    def add(self, table: str, chain: str, *rules: Rule) -> None:
        self.chain(table, chain).extend(rules)

    def build(self) -> RuleSet:
        tables = []
        for table, chains in self._chains.items():
            reachable = _reachable(table, chains)
            kept = tuple(
                Chain(name, tuple(rules))
                for name, rules in chains.items()
                if (is_builtin(table, name) and rules) or name in reachable
            )
            if kept:
                tables.append(Table(table, kept))
        return RuleSet(self.family, tuple(tables)).canonical()


def _reachable(table: str, chains: dict[str, list[Rule]]) -> set[str]:
    seen: set[str] = set()
    todo = [name for name in chains if is_builtin(table, name)]
    while todo:
        for rule in chains.get(todo.pop(), ()):
            if rule.jump is not None and rule.jump not in seen:
                seen.add(rule.jump)
                todo.append(rule.jump)
    return seen
