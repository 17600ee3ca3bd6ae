"""The outcome of one subject in a run: :class:`SubjectResult`, frozen, and its JSON form.

A worker returns one per subject and never raises (a broken scan is ``status="failed"``
with the stage and the reason). The driver indexes it, shows it as progress and writes
it to the run report, where :meth:`SubjectResult.to_json` is one row of
``reports/latest.json``; :meth:`SubjectResult.from_json` reads such a row back.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from mriprep.cache import IndexEntry
from mriprep.core.volume import jsonable
from mriprep.inputs.manifest import ManifestRow

# "cached": computed and written now; "skipped": a verified entry already existed.
STATUSES = ("cached", "skipped", "failed")
# The columns of a report row, in order, before metrics, warnings and the worker.
REPORT_COLUMNS = (
    "subject_id", "session_id", "split", "status", "stage", "reason", "key", "seconds",
)


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
    def of(cls, row: ManifestRow, **fields: Any) -> "SubjectResult":
        """A result for a manifest row (ids, split and line number taken from it)."""
        return cls(subject_id=row.subject_id, session_id=row.session_id, split=row.split,
                   row=row.row, **fields)

    def replace(self, **changes: Any) -> "SubjectResult":
        return dataclasses.replace(self, **changes)

    @property
    def failed(self) -> bool:
        return self.status == "failed"

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
    def from_json(cls, doc: Mapping[str, Any]) -> "SubjectResult":
        """A report row read back (without its index entry)."""
        names = {f.name for f in dataclasses.fields(cls)} - {"entry"}
        fields = {k: v for k, v in doc.items() if k in names}
        fields["warnings"] = tuple(fields.get("warnings") or ())
        fields["metrics"] = dict(fields.get("metrics") or {})
        return cls(**fields)
