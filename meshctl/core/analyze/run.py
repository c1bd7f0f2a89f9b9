"""One analysis: every family of checks over a snapshot, scoped to the namespaces asked for,
ordered, graded and rendered.

Invariants: the same snapshot and scope give the same report; a family that raises becomes one
MSH0001 finding naming it and the error (the others still run); the exit code is 3 when a finding
is at or above the failure threshold (Error by default), else 0.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from . import ambient, codes, injection, policies, ports, webhooks
from .findings import Finding, Level, Subject
from .snapshot import Item, Snapshot

Check = Callable[[Snapshot], Iterator[Finding]]

FAMILIES: tuple[tuple[str, Check], ...] = (
    ("policies", policies.check),
    ("injection", injection.check),
    ("ambient", ambient.check),
    ("webhooks", webhooks.check),
    ("ports", ports.check),
)
EXIT_FOUND = 3  # docs/cli.md: a check ran and found problems
DEFAULT_NAMESPACE = "default"  # without -n or -A and no context namespace (istioctl's)


@dataclass(frozen=True, slots=True)
class Scope:
    """The namespaces analyzed: ``namespaces`` None means all of them."""

    namespaces: frozenset[str] | None

    def shows(self, finding: Finding) -> bool:
        return (
            self.namespaces is None
            or not finding.namespaces
            or any(n in self.namespaces for n in finding.namespaces)
        )

    def describe(self) -> str:
        if self.namespaces is None:
            return "all namespaces"
        return "namespace: " + ", ".join(sorted(self.namespaces))


def scope_of(
    *,
    all_namespaces: bool,
    namespace: str | None,
    files: Iterable[Item],
    live: bool,
    context_namespace: str = DEFAULT_NAMESPACE,
) -> Scope:
    """What a run analyzes: ``-A`` everything; ``-n`` that namespace; otherwise the files alone
    (no cluster) everything in them, and a live cluster the kubeconfig context's namespace
    (``default`` when it names none) plus every namespace the files touch (their objects' and
    the Namespaces they hold)."""
    if all_namespaces or (not live and namespace is None):
        return Scope(None)
    if namespace is not None:
        return Scope(frozenset({namespace}))
    touched = {i.name if i.kind == "Namespace" else i.namespace for i in files}
    return Scope(frozenset({context_namespace, *(n for n in touched if n)}))


def analyze(
    snapshot: Snapshot, scope: Scope, families: Iterable[tuple[str, Check]] = FAMILIES
) -> list[Finding]:
    found: list[Finding] = []
    for name, family in families:
        try:
            found += list(family(snapshot))
        except Exception as exc:  # noqa: BLE001 -- one broken family must not hide the others
            found.append(
                Finding(
                    codes.ANALYZER_FAILED,
                    Subject("Analyzer", "", name),
                    f"The {name} checks stopped: {type(exc).__name__}: {exc}",
                    "report it with the objects involved (rerun with --debug); the other "
                    "checks ran",
                )
            )
    unique = {(f.code.id, f.subject, f.message): f for f in found if scope.shows(f)}
    return sorted(unique.values(), key=Finding.sort_key)


def exit_code(findings: Iterable[Finding], threshold: Level = Level.ERROR) -> int:
    return EXIT_FOUND if any(f.level >= threshold for f in findings) else 0


def report_text(findings: list[Finding], scope: Scope, hidden: int = 0) -> str:
    """istioctl's lines, each followed by its fix; a line saying so when nothing was found
    (``hidden``: findings below ``--report-threshold``, counted there)."""
    if not findings:
        below = f" ({hidden} below --report-threshold not shown)" if hidden else ""
        return f"\u2714 No validation issues found when analyzing {scope.describe()}{below}.\n"
    lines = []
    for finding in findings:
        lines.append(finding.line())
        lines.append(f"    Fix: {finding.fix}")
    return "\n".join(lines) + "\n"


def report_data(findings: list[Finding]) -> list[dict[str, object]]:
    return [f.record() for f in findings]
