"""Verify's checks as data, and the one place their output and exit code are decided.

A ``Check`` is a category, a description and a function returning a ``Result`` (ok, warning,
failure with a hint, skipped); components contribute them, ``meshctl verify`` runs them. The
report (text in the spirit of ``linkerd check``, or JSON in its shape) and the exit code come
from ``report_text``/``report_json``/``exit_code`` over the results and nothing else.
Invariants: every failure carries a hint (a failure without one is reported as a bug of the
check, never printed bare); any failure means exit 3, warnings alone mean 0.
"""

from __future__ import annotations

import enum
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Literal, NotRequired, TypedDict

from meshctl.errors import EXIT_CHECK_FAILED

Stage = Literal["pre", "installed", "both"]


class Outcome(enum.Enum):
    OK = "success"
    WARN = "warning"
    FAIL = "error"
    SKIP = "skipped"


SYMBOL = {Outcome.OK: "✔", Outcome.WARN: "⚠", Outcome.FAIL: "✘", Outcome.SKIP: "-"}


@dataclass(frozen=True, slots=True, kw_only=True)
class Result:
    outcome: Outcome
    message: str = ""  # what was found (shown for every outcome when not empty)
    hint: str = ""  # what to do (required for a failure, optional for a warning)
    details: tuple[str, ...] = ()  # one line each: the objects or fields concerned

    @staticmethod
    def ok(message: str = "") -> Result:
        return Result(outcome=Outcome.OK, message=message)

    @staticmethod
    def warn(message: str, hint: str = "", details: Sequence[str] = ()) -> Result:
        return Result(outcome=Outcome.WARN, message=message, hint=hint, details=tuple(details))

    @staticmethod
    def fail(message: str, hint: str, details: Sequence[str] = ()) -> Result:
        return Result(outcome=Outcome.FAIL, message=message, hint=hint, details=tuple(details))

    @staticmethod
    def skip(message: str) -> Result:
        return Result(outcome=Outcome.SKIP, message=message)


@dataclass(frozen=True, slots=True, kw_only=True)
class Check:
    category: str  # the heading it is listed under ("meshctl-controlplane")
    description: str  # what holds when it passes ("control plane pods are ready")
    run: Callable[[Any], Result]  # takes the verify run's context (components.CheckContext)
    stage: Stage = "installed"  # "pre": only with --pre; "both": with and without it
    # A fatal failure ends the run: nothing after it can give a meaningful answer.
    fatal: bool = False
    workload: bool = False  # only with --workload


class ReportedCheck(TypedDict):
    """One check in the JSON report (``linkerd check -o json``'s fields)."""

    description: str
    result: str  # an Outcome's value
    message: NotRequired[str]
    error: NotRequired[str]  # failures and warnings: what was found
    hint: NotRequired[str]
    details: NotRequired[list[str]]


class ReportedCategory(TypedDict):
    categoryName: str
    checks: list[ReportedCheck]


class Report(TypedDict):
    success: bool
    categories: list[ReportedCategory]


@dataclass(frozen=True, slots=True, kw_only=True)
class Ran:
    check: Check
    result: Result


def selected(checks: Sequence[Check], *, pre: bool, workload: bool) -> list[Check]:
    """The checks one run executes, in their given order."""
    stages = ("pre", "both") if pre else ("installed", "both")
    return [c for c in checks if c.stage in stages and (workload or not c.workload)]


def _sane(result: Result) -> Result:
    if result.outcome is Outcome.FAIL and not result.hint:
        return Result.fail(
            result.message or "failed",
            hint="this check gave no hint: please report it to the meshctl maintainers",
            details=result.details,
        )
    return result


def exit_code(ran: Sequence[Ran]) -> int:
    return EXIT_CHECK_FAILED if any(r.result.outcome is Outcome.FAIL for r in ran) else 0


def report_text(ran: Sequence[Ran]) -> str:
    """Categories with a ruled heading, one line per check, details and hint indented."""
    lines: list[str] = []
    category = None
    for item in ran:
        if item.check.category != category:
            category = item.check.category
            if lines:
                lines.append("")
            lines += [category, "-" * len(category)]
        result = _sane(item.result)
        line = f"{SYMBOL[result.outcome]} {item.check.description}"
        if result.message:
            ok = result.outcome is Outcome.OK
            line += f" ({result.message})" if ok else f": {result.message}"
        lines.append(line)
        lines += [f"    {d}" for d in result.details]
        if result.hint and result.outcome in (Outcome.FAIL, Outcome.WARN):
            lines.append(f"    Hint: {result.hint}")
    failed = sum(r.result.outcome is Outcome.FAIL for r in ran)
    warned = sum(r.result.outcome is Outcome.WARN for r in ran)
    lines.append("")
    if failed:
        lines.append(f"Status check results are {SYMBOL[Outcome.FAIL]} ({failed} failed)")
    else:
        suffix = f" ({warned} warning{'s' * (warned != 1)})" if warned else ""
        lines.append(f"Status check results are {SYMBOL[Outcome.OK]}{suffix}")
    return "\n".join(lines) + "\n"


def report_json(ran: Sequence[Ran]) -> Report:
    """``linkerd check -o json``'s shape: success, then categories of checks with results."""
    categories: list[ReportedCategory] = []
    for item in ran:
        if not categories or categories[-1]["categoryName"] != item.check.category:
            categories.append({"categoryName": item.check.category, "checks": []})
        result = _sane(item.result)
        entry: ReportedCheck = {
            "description": item.check.description,
            "result": result.outcome.value,
        }
        if result.message:
            entry["message"] = result.message
        if result.outcome in (Outcome.FAIL, Outcome.WARN):
            entry["error"] = result.message
            if result.hint:
                entry["hint"] = result.hint
        if result.details:
            entry["details"] = list(result.details)
        categories[-1]["checks"].append(entry)
    return {"success": exit_code(ran) == 0, "categories": categories}
