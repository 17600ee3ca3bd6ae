"""Findings: the one record of a problem that a check reports.

``mriprep check`` (on a cache) and ``mriprep splits`` (on a manifest) report every problem
as a :class:`Finding`: a stable code, a message a person can act on, and the keys and
subjects it concerns. Its :class:`Severity` is the code's, from the registry
:data:`~mriprep.core.finding_codes.CODES`, where every code is explained (``mriprep
check --explain CODE``); a code that is not registered is refused. A report holding a
``findings`` list gets ``errors``, ``warnings`` and ``ok`` from :class:`FindingsMixin`.
The JSON form of a finding (:meth:`Finding.to_json`) is part of both commands' ``--json``
output: its severity is the plain string ``"error"`` or ``"warning"``.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

from mriprep.core.finding_codes import CODES, FindingCode, Severity

__all__ = ["CODES", "Finding", "FindingCode", "FindingsMixin", "Severity",
           "UnknownFindingCode", "close_codes", "named", "registered"]

_MAX_NAMED = 8  # items named in one message; the finding's keys list them all


class UnknownFindingCode(ValueError):
    """A code that is not in the registry: a bug of the check that used it."""


def close_codes(code: str, n: int = 5) -> list[str]:
    """Registered codes spelled like ``code``, closest first."""
    return difflib.get_close_matches(code, list(CODES), n=n, cutoff=0.6)


def registered(code: str) -> FindingCode:
    """The registry's record of ``code``; :class:`UnknownFindingCode` when there is none."""
    try:
        return CODES[code]
    except KeyError:
        close = close_codes(code)
        hint = f" (close: {', '.join(close)})" if close else ""
        raise UnknownFindingCode(
            f"finding code {code!r} is not registered{hint}; add it, with its severity, "
            "meaning and fix, to mriprep/core/finding_codes.py before a check emits it"
        ) from None


@dataclass(frozen=True)
class Finding:
    """One problem: a registered code, a message a person can act on, and what it
    concerns: ``keys`` (cache keys for ``check``, manifest lines such as ``"line 12"`` for
    ``splits``) and ``subjects`` (subject ids). ``severity`` is the code's.

    Raises
    ------
    UnknownFindingCode
        When ``code`` is not in :data:`~mriprep.core.finding_codes.CODES`.
    """

    code: str
    message: str
    keys: tuple[str, ...] = ()
    subjects: tuple[str, ...] = ()
    severity: Severity = field(init=False)
    # What a finding that sums up several (an identity group's matched pairs) keeps of
    # each, for --json: plain JSON values. Not part of a finding's identity.
    details: Mapping[str, Any] | None = field(default=None, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "severity", registered(self.code).severity)

    def to_json(self) -> dict[str, Any]:
        doc = {
            "severity": self.severity.value,
            "code": self.code,
            "message": self.message,
            "keys": list(self.keys),
            "subjects": list(self.subjects),
        }
        if self.details is not None:
            doc["details"] = dict(self.details)
        return doc


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
