"""Findings: the one record of a problem that a check reports.

``mriprep check`` (on a cache) and ``mriprep splits`` (on a manifest) report every problem
as a :class:`Finding`: a :class:`Severity`, a stable code, a message a person can act on,
and the keys and subjects it concerns. A report holding a ``findings`` list gets
``errors``, ``warnings`` and ``ok`` from :class:`FindingsMixin`. The JSON form of a finding
(:meth:`Finding.to_json`) is part of both commands' ``--json`` output: its severity is the
plain string ``"error"`` or ``"warning"``.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Sequence

_MAX_NAMED = 8  # items named in one message; the finding's keys list them all


class Severity(str, enum.Enum):
    """How bad a finding is: an error fails the gate, a warning is reported only.

    A member equals its string (``Severity.ERROR == "error"``), so callers may pass either.
    """

    ERROR = "error"
    WARNING = "warning"

    def __str__(self) -> str:
        # as 3.11's StrEnum (3.10 has none): f-strings show "error", not "Severity.ERROR"
        return self.value


@dataclass(frozen=True)
class Finding:
    """One problem: its severity, a stable code, a message a person can act on, and what it
    concerns: ``keys`` (cache keys for ``check``, manifest lines such as ``"line 12"`` for
    ``splits``) and ``subjects`` (subject ids)."""

    severity: Severity
    code: str
    message: str
    keys: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        # a finding always holds a member, whether given "error" or Severity.ERROR
        object.__setattr__(self, "severity", Severity(self.severity))

    def to_json(self) -> dict[str, Any]:
        return {
            "severity": self.severity.value,
            "code": self.code,
            "message": self.message,
            "keys": list(self.keys),
            "subjects": list(self.subjects),
        }


class FindingsMixin:
    """``errors``, ``warnings`` and ``ok`` of a report holding a ``findings`` list."""

    findings: list[Finding]

    @property
    def errors(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.ERROR]

    @property
    def warnings(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.WARNING]

    @property
    def ok(self) -> bool:
        return not self.errors


def named(names: Sequence[str]) -> str:
    """A list of names for a message, cut after a few."""
    shown = ", ".join(names[:_MAX_NAMED])
    more = len(names) - _MAX_NAMED
    return f"{shown} and {more} more" if more > 0 else shown
