"""``iptables-save`` / ``iptables-restore`` text -> the rule model (for drift checks and tests).

Invariants: ``parse(render(x)) == x`` for every canonical rule set; the result is canonical (see
``rules.RuleSet.canonical``); anything the grammar below does not cover raises ``RuleParseError``
naming the line, never a bare ``ValueError`` or a half-parsed model.

Grammar (one command per line, as both save variants print it): ``*table``, ``:CHAIN POLICY
[p:b]``, ``-N CHAIN``, ``-A CHAIN <rule words>``, ``COMMIT``; blank lines and ``#`` comments are
skipped. Rule words: built-in criteria (``[!] -s|-d|-i|-o|-p VALUE``, ``[!] -f``), ``-m MODULE``
followed by its ``[!] --option [args...]``, and ``-j|-g TARGET`` followed by its options.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence

from meshctl.core.capture.rules import (
    BUILTIN_CHAINS,
    Chain,
    Criterion,
    Family,
    Match,
    Option,
    Rule,
    RuleSet,
    Table,
    Target,
    is_builtin,
)
from meshctl.errors import MeshctlError

# iptables-save prints the short spellings only; accepting the long ones (``--source``) would
# make them ambiguous with match options of the same name.
_CRITERIA = {
    "-s": "source",
    "-d": "destination",
    "-i": "in_interface",
    "-o": "out_interface",
    "-p": "protocol",
}
# iptables limits chain names to 28 characters; they may not look like an option.
_CHAIN_NAME = re.compile(r"[A-Za-z0-9_.+@:-]{1,28}")
_NUMBER = re.compile(r"-\d+(?:[.:]\d+)?")


class RuleParseError(MeshctlError):
    """Text that is not iptables-save/restore syntax meshctl understands."""

    def __init__(self, message: str, *, line_no: int | None = None, line: str = "") -> None:
        where = f"line {line_no}: " if line_no is not None else ""
        shown = f" (in {line.strip()[:120]!r})" if line.strip() else ""
        super().__init__(
            f"{where}{message}{shown}",
            hint="expected iptables-save output: *table, :CHAIN POLICY, -A CHAIN ..., COMMIT",
        )
        self.line_no = line_no


def parse(text: str, family: Family = Family.IPV4) -> RuleSet:
    """Parse a whole save/restore document into a canonical ``RuleSet``."""
    tables: dict[str, dict[str, tuple[list[Rule], str | None]]] = {}
    current: str | None = None
    for line_no, raw in enumerate(text.splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        try:
            current = _line(line, current, tables)
        except RuleParseError as exc:
            raise RuleParseError(str(exc.message), line_no=line_no, line=raw) from None
    if current is not None:
        raise RuleParseError(f"table {current!r} is missing its COMMIT line")
    return RuleSet(
        family,
        tuple(
            Table(
                name, tuple(Chain(c, tuple(rules), policy) for c, (rules, policy) in chains.items())
            )
            for name, chains in tables.items()
        ),
    ).canonical()


def _line(  # noqa: PLR0912 (one branch per line kind of the grammar)
    line: str, current: str | None, tables: dict[str, dict[str, tuple[list[Rule], str | None]]]
) -> str | None:
    """Apply one line; return the table now open (``None`` after COMMIT)."""
    if line.startswith("*"):
        if current is not None:
            raise RuleParseError(f"table {line[1:]!r} starts before {current!r} was committed")
        name = line[1:].strip()
        if name not in BUILTIN_CHAINS:
            raise RuleParseError(f"unknown table {name!r}")
        if name in tables:
            raise RuleParseError(f"table {name!r} appears twice")
        tables[name] = {}
        return name
    if line == "COMMIT":
        if current is None:
            raise RuleParseError("COMMIT outside a table")
        return None
    if current is None:
        raise RuleParseError("a rule or chain outside a table (no '*table' line before it)")
    chains = tables[current]
    if line.startswith(":"):
        parts = line[1:].split()
        if len(parts) not in (2, 3) or not _CHAIN_NAME.fullmatch(parts[0]):
            raise RuleParseError("malformed chain declaration")
        name, policy = parts[0], parts[1]
        if name in chains:
            raise RuleParseError(f"chain {name!r} declared twice")
        builtin = is_builtin(current, name)
        if builtin and policy not in ("ACCEPT", "DROP"):
            raise RuleParseError(f"built-in chain {name!r} needs ACCEPT or DROP, not {policy!r}")
        if not builtin and policy != "-":
            raise RuleParseError(f"user chain {name!r} cannot have policy {policy!r}")
        chains[name] = ([], policy if builtin else None)
        return current
    words = _split(line)
    if words[0] == "-N" and len(words) == 2 and _CHAIN_NAME.fullmatch(words[1]):
        if words[1] in chains or is_builtin(current, words[1]):
            raise RuleParseError(f"chain {words[1]!r} declared twice")
        chains[words[1]] = ([], None)
        return current
    if words[0] == "-A" and len(words) >= 2:
        chain = words[1]
        if chain not in chains:
            if not is_builtin(current, chain):
                raise RuleParseError(f"rule for undeclared chain {chain!r}")
            chains[chain] = ([], None)
        chains[chain][0].append(parse_rule(words[2:]))
        return current
    raise RuleParseError(f"unsupported command {words[0]!r}")


def _split(line: str) -> list[str]:
    try:
        words = shlex.split(line)
    except ValueError as exc:  # unbalanced quotes
        raise RuleParseError(f"cannot split into words: {exc}") from None
    if not words:
        raise RuleParseError("empty command")
    return words


def parse_rule(words: Sequence[str] | str) -> Rule:  # noqa: PLR0912, PLR0915 (the rule grammar)
    """The words after ``-A CHAIN`` -> a ``Rule`` (a string is split like a shell would)."""
    if isinstance(words, str):
        try:
            words = shlex.split(words)
        except ValueError as exc:  # unbalanced quotes
            raise RuleParseError(f"cannot split into words: {exc}") from None
    criteria: dict[str, Criterion] = {}
    matches: list[tuple[str, list[Option]]] = []
    target: tuple[str, bool] | None = None
    target_options: list[Option] = []
    options: list[Option] | None = None  # where ``--option`` words go (last -m or -j)
    negate = False
    i = 0
    while i < len(words):
        word = words[i]
        if word == "!":
            if negate:
                raise RuleParseError("'!' given twice in a row")
            negate = True
            i += 1
            continue
        if word in _CRITERIA:
            attr = _CRITERIA[word]
            if attr in criteria:
                raise RuleParseError(f"{word} given twice")
            criteria[attr] = Criterion(_value(words, i), negate)
            i += 2
        elif word == "-f":
            if "fragment" in criteria:
                raise RuleParseError("-f given twice")
            criteria["fragment"] = Criterion("", negate)
            i += 1
        elif word == "-m":
            _no_negation(negate, word)
            matches.append((_value(words, i), []))
            options = matches[-1][1]
            i += 2
        elif word in ("-j", "-g"):
            _no_negation(negate, word)
            if target is not None:
                raise RuleParseError("a rule has at most one target")
            name = _value(words, i)
            if not _CHAIN_NAME.fullmatch(name):
                raise RuleParseError(f"invalid target name {name!r}")
            target = (name, word == "-g")
            options = target_options
            i += 2
        elif word.startswith("--") and len(word) > 2:
            if options is None:
                raise RuleParseError(f"option {word} before any -m or -j")
            j = i + 1
            while j < len(words) and not _starts_new_word(words[j]):
                j += 1
            options.append(Option(word[2:], tuple(words[i + 1 : j]), negate))
            i = j
        else:
            raise RuleParseError(f"unexpected word {word!r}")
        negate = False
    if negate:
        raise RuleParseError("'!' at the end of a rule negates nothing")
    return Rule(
        source=criteria.get("source"),
        destination=criteria.get("destination"),
        in_interface=criteria.get("in_interface"),
        out_interface=criteria.get("out_interface"),
        protocol=criteria.get("protocol"),
        fragment=criteria.get("fragment"),
        matches=tuple(Match(module, tuple(opts)) for module, opts in matches),
        target=Target(target[0], tuple(target_options), target[1]) if target else None,
    )


def _value(words: Sequence[str], i: int) -> str:
    if i + 1 >= len(words) or _starts_new_word(words[i + 1]):
        raise RuleParseError(f"{words[i]} needs a value")
    return words[i + 1]


def _starts_new_word(word: str) -> bool:
    """True for ``!`` and option-like words; negative numbers are values, not options."""
    return word == "!" or (word.startswith("-") and len(word) > 1 and not _NUMBER.fullmatch(word))


def _no_negation(negate: bool, word: str) -> None:
    if negate:
        raise RuleParseError(f"'!' cannot negate {word}")


def rule(text: str, note: str = "") -> Rule:
    """A rule from its iptables-save spelling, with a note saying why it exists.

    The builders write rules this way so they read like the iptables rules they are, and a typo
    fails loudly here instead of in the kernel.
    """
    return parse_rule(text).with_note(note)
