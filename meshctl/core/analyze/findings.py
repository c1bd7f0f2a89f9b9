"""What a check reports: a finding (code, level, the object it is about, message, fix).

Invariants: a finding's level is its code's (a code never changes level or meaning); the object
is named as ``Kind namespace/name`` (``Kind name`` when cluster-scoped) and, when it came from a
file given with ``-f``, ``file:line``; findings order by level (errors first), then code, then
object, so the same snapshot prints the same report.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass


class Level(enum.IntEnum):
    """How bad a finding is; ``--failure-threshold`` compares against it."""

    INFO = 0
    WARNING = 1
    ERROR = 2

    @property
    def label(self) -> str:
        return self.name.capitalize()

    @classmethod
    def parse(cls, text: str) -> Level:
        """``Info``, ``Warning`` (or ``Warn``) or ``Error``, in any case."""
        word = text.strip().upper()
        word = "WARNING" if word == "WARN" else word
        try:
            return cls[word]
        except KeyError:
            raise ValueError(f"{text!r} is not one of Info, Warning, Error") from None


@dataclass(frozen=True, slots=True)
class Code:
    """A registered code: ``MSH0204`` ``PodMissingSidecar`` (Error) and what it means."""

    id: str
    name: str
    level: Level
    summary: str


@dataclass(frozen=True, slots=True)
class Origin:
    """Where an object given with ``-f`` was read: the file and the 1-based line it starts on."""

    source: str
    line: int

    def __str__(self) -> str:
        return f"{self.source}:{self.line}"


@dataclass(frozen=True, slots=True)
class Subject:
    """The object a finding is about."""

    kind: str
    namespace: str  # "" when cluster-scoped
    name: str
    origin: Origin | None = None

    @property
    def ref(self) -> str:
        where = f"{self.namespace}/{self.name}" if self.namespace else self.name
        return f"{self.kind} {where}"

    def __str__(self) -> str:
        return self.ref + (f" {self.origin}" if self.origin else "")


@dataclass(frozen=True, slots=True)
class Finding:
    """One problem found. ``namespaces``: the namespaces it concerns (a finding is shown when
    one of them is analyzed); empty means cluster-wide (always shown)."""

    code: Code
    subject: Subject
    message: str
    fix: str
    namespaces: tuple[str, ...] = ()

    @property
    def level(self) -> Level:
        return self.code.level

    def sort_key(self) -> tuple[int, str, str, str, str]:
        return (-self.level, self.code.id, self.subject.ref, str(self.subject.origin), self.message)

    def line(self) -> str:
        """istioctl's line: ``Error [MSH0204] (Pod shop/web-1) message``."""
        return f"{self.level.label} [{self.code.id}] ({self.subject}) {self.message}"

    def record(self) -> dict[str, object]:
        """The finding as JSON-compatible data (``-o json|yaml``)."""
        origin = self.subject.origin
        return {
            "code": self.code.id,
            "name": self.code.name,
            "level": self.level.label,
            "object": {
                "kind": self.subject.kind,
                "namespace": self.subject.namespace,
                "name": self.subject.name,
                **({"source": origin.source, "line": origin.line} if origin else {}),
            },
            "message": self.message,
            "fix": self.fix,
        }
