"""A run's record of every subject: :class:`SubjectResult`, and the run report's one reader.

A worker returns one :class:`SubjectResult` per subject and never raises (a broken scan
is ``status="failed"`` with the stage and the reason). The driver indexes it, shows it as
progress and writes the run report (``mriprep.run.reports``) into the cache's
``reports/`` folder, where :meth:`SubjectResult.to_json` is one row of ``latest.json``.

Everything that reads a report back (the check against a manifest, the QC report, cache
repair, the demo's verdict) goes through :func:`read_run_report`, so a hand-edited or
damaged report is refused or set aside the same way everywhere. The report belongs to
the cache because the cache owns its folder: a reader of reports needs no part of the
runner.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

from mriprep.cache.entry import IndexEntry
from mriprep.cache.store import REPORTS_DIR
from mriprep.core.errors import CacheError
from mriprep.core.volume import jsonable

# "cached": computed and written now; "skipped": a verified entry already existed.
STATUSES = ("cached", "skipped", "failed")
# The columns of a report row, in order, before metrics, warnings and the worker.
REPORT_COLUMNS = (
    "subject_id", "session_id", "split", "status", "stage", "reason", "key", "seconds",
)
REPORT_FORMAT = "mriprep-run-report"
REPORT_VERSION = 1
# The last run's report; every run also keeps a timestamped copy (run-<time>-<pid>.json).
LATEST_REPORT = "latest.json"

Identity = tuple[str, str]  # (subject_id, session_id)


@dataclass(frozen=True)
class SubjectResult:
    """One subject's outcome: failed until proven otherwise.

    ``metrics`` maps each stage that ran to its metrics and seconds (a stage used twice
    appears as ``sanitize``, ``sanitize_2``); ``entry`` is the subject's index entry when
    it is cached or skipped; ``traceback`` is set for unexpected errors only.
    """

    subject_id: str
    session_id: str = ""
    split: str = ""
    row: int = 0
    status: str = "failed"
    stage: str = ""
    reason: str = ""
    key: str = ""
    seconds: float = 0.0
    metrics: Mapping[str, Any] = field(default_factory=dict)
    warnings: tuple[str, ...] = ()
    peak_rss_mb: float | None = None
    worker: str = ""
    entry: IndexEntry | None = None
    traceback: str | None = None

    @classmethod
    def of(cls, row: Any, **fields: Any) -> "SubjectResult":
        """A result for a manifest row (:class:`~mriprep.inputs.manifest.ManifestRow`:
        ids, split and line number taken from it)."""
        return cls(subject_id=row.subject_id, session_id=row.session_id, split=row.split,
                   row=row.row, **fields)

    def replace(self, **changes: Any) -> "SubjectResult":
        return dataclasses.replace(self, **changes)

    @property
    def failed(self) -> bool:
        return self.status == "failed"

    @property
    def identity(self) -> Identity:
        return (self.subject_id, self.session_id)

    @property
    def name(self) -> str:
        """The subject as people read it: its id, and its session when it has one."""
        return f"{self.subject_id} (session {self.session_id})" if self.session_id \
            else self.subject_id

    def to_json(self) -> dict[str, Any]:
        """The report row: the report columns, metrics, warnings, memory, worker (and the
        traceback of an unexpected error). The index entry is not part of it."""
        doc = {name: getattr(self, name) for name in REPORT_COLUMNS}
        doc.update(metrics=jsonable(dict(self.metrics)), warnings=list(self.warnings),
                   peak_rss_mb=self.peak_rss_mb, worker=self.worker)
        if self.traceback:
            doc["traceback"] = self.traceback
        return doc

    @classmethod
    def from_json(cls, doc: Any) -> "SubjectResult":
        """A report row read back (without its index entry).

        Raises ValueError when the row is not a subject record; a field of the wrong type
        (a hand-edited report) is read as its type's empty value rather than passed on.
        """
        if not isinstance(doc, Mapping) or not doc.get("subject_id"):
            raise ValueError(f"not a subject record: {str(doc)[:80]!r}")
        text = {name: str(doc.get(name) or "") for name in
                ("subject_id", "session_id", "split", "status", "stage", "reason", "key",
                 "worker")}
        metrics = doc.get("metrics")
        warnings = doc.get("warnings")
        traceback = doc.get("traceback")
        return cls(**text,
                   row=_number(doc.get("row"), int, 0),
                   seconds=_number(doc.get("seconds"), float, 0.0),
                   metrics=dict(metrics) if isinstance(metrics, Mapping) else {},
                   warnings=tuple(str(w) for w in warnings)
                   if isinstance(warnings, list) else (),
                   peak_rss_mb=_number(doc.get("peak_rss_mb"), float, None),
                   traceback=str(traceback) if traceback else None)


def _number(value: Any, kind: type, default: Any) -> Any:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return default
    return kind(value)


@dataclass(frozen=True)
class RunReport:
    """A run report read back: its header (pipeline, scheduler, counts, ...), its rows,
    and how many rows were not subject records (set aside, counted)."""

    path: Path
    header: Mapping[str, Any]
    results: tuple[SubjectResult, ...]
    unreadable_rows: int = 0

    def by_identity(self) -> dict[Identity, SubjectResult]:
        """Each subject/session's row (the last one, should a report list one twice)."""
        return {result.identity: result for result in self.results}


def latest_report_path(cache_root: str | os.PathLike) -> Path:
    """Where the last run's report of a cache is (it may not exist)."""
    return Path(cache_root) / REPORTS_DIR / LATEST_REPORT


def read_run_report(path: str | os.PathLike) -> RunReport:
    """One run report (``latest.json`` or a timestamped copy).

    Raises
    ------
    CacheError
        The file cannot be read, is not JSON, or is not a report object with a
        ``subjects`` list.
    """
    path = Path(path)
    try:
        doc = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise CacheError(f"cannot read the run report {path}: {exc}; rerun `mriprep run` "
                         "to write a new one (the cache itself is not affected)") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("subjects"), list):
        raise CacheError(f"the run report {path} is not a report object with a 'subjects' "
                         "list; rerun `mriprep run` to write a new one")
    results, unreadable = [], 0
    for row in doc["subjects"]:
        try:
            results.append(SubjectResult.from_json(row))
        except ValueError:
            unreadable += 1
    header = {k: v for k, v in doc.items() if k != "subjects"}
    return RunReport(path, header, tuple(results), unreadable)


def read_latest_run_report(cache_root: str | os.PathLike) -> RunReport | None:
    """The last run's report of a cache; None when no run wrote one. Raises CacheError
    as :func:`read_run_report` when it exists but cannot be read."""
    path = latest_report_path(cache_root)
    return read_run_report(path) if path.is_file() else None
