"""What the report shows, gathered from a cache: every subject with its record and QC.

Subjects come from two sources: the index (cached entries, whichever run made them) and
the last run's report (failed subjects, with their stage and reason, and the stage
metrics of every subject it ran). Each subject's QC is read from ``CACHE/qc/<key>``, or
made from the cache when the run made none (:func:`mriprep.qc.subject.qc_from_cache`).
A subject's time is that of the run that made its entry, kept in its ``qc.json``: a
rerun that skipped the entry took a fraction of a second, and the page says it reused it.
Nothing here raises for a damaged cache: what cannot be read becomes a problem the
report shows.
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from mriprep.cache import Cache, IndexEntry, read_entries
from mriprep.cache.run_report import RunReport, SubjectResult, read_latest_run_report
from mriprep.core.errors import CacheError
from mriprep.stages.qc_declaration import QCMetric
from mriprep.qc.measures import declared_metrics, with_stage_declarations
from mriprep.qc.outliers import Outlier, cohort_flags, cohort_scores
from mriprep.qc.store import read_qc, record_made_by_run, write_qc


@dataclass
class ReportSubject:
    """One subject of the report."""

    subject_id: str
    session_id: str
    split: str
    status: str  # "cached" or "failed"
    key: str = ""
    stage: str = ""
    reason: str = ""
    stage_metrics: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)
    # The time of the run that made the entry (not of a rerun that skipped it).
    seconds: float | None = None
    # The last run found the entry cached and skipped it: an earlier run made it.
    reused: bool = False
    qc: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)
    outliers: list[Outlier] = field(default_factory=list)
    # metric -> (cohort median, this subject's robust z), over the cached subjects.
    cohort: dict[str, tuple[float, float]] = field(default_factory=dict)

    @property
    def name(self) -> str:
        if not self.session_id:
            return self.subject_id
        session = self.session_id if self.session_id.startswith("ses-") \
            else f"ses-{self.session_id}"
        return f"{self.subject_id} {session}"

    @property
    def page(self) -> str:
        """The subject's page file name (ids made safe for a file name)."""
        raw = f"{self.subject_id}_{self.session_id}" if self.session_id else self.subject_id
        return re.sub(r"[^A-Za-z0-9._-]", "_", raw) + f"-{self.key[:8] or self.status}.html"

    @property
    def flagged(self) -> dict[str, str]:
        """Metric -> why it is flagged, for this subject's outlier flags."""
        return {o.metric: o.describe() for o in self.outliers}

    @property
    def metrics(self) -> dict[str, float]:
        return dict((self.qc or {}).get("metrics", {}))

    @property
    def header_conflict(self) -> str:
        """Why the subject's geometry is uncertain (its input's qform and sform place the
        field of view further apart than the limit, and no ``header:`` chose), or ``""``.
        ``mriprep check`` reports the same as a ``header-conflict`` warning."""
        from mriprep.inputs.headers import FORM_CONFLICT_LIMIT_MM, header_conflict

        # The reader's record: the one that measured the two forms' distance.
        load = next((m for m in self.stage_metrics.values()
                     if isinstance(m, dict) and "form_conflict_mm" in m), None)
        distance = header_conflict(load)
        if distance is None:
            return ""
        source = load.get("affine_source", "qform")
        return (f"header conflict: qform and sform {distance:.1f} mm apart (limit "
                f"{FORM_CONFLICT_LIMIT_MM:g} mm), the {source} used; set `header:` in the "
                "pipeline or the manifest to choose")


@dataclass
class ReportData:
    """The report's content: subjects, problems of the cache as a whole, the last run's
    header, and the pipelines of the indexed entries (name (hash) -> entries)."""

    cache: Path
    subjects: list[ReportSubject]
    problems: list[str] = field(default_factory=list)
    run: dict[str, Any] = field(default_factory=dict)
    pipelines: Counter = field(default_factory=Counter)
    # Every measure shown: the QC's own and those the stages declared (name -> QCMetric).
    declared: dict[str, QCMetric] = field(default_factory=dict)


def gather(cache_root: str | Path, make_missing: bool = True,
           progress: Callable[[int, int], None] | None = None) -> ReportData:
    """Every subject of the cache and of its last run, with QC and outlier flags.

    ``make_missing`` makes the QC of cached entries that have none, from the cache
    (``mriprep report``); without it they are listed as having none (the end of a run,
    which must not turn into a second, slower pass).
    """
    cache = Cache(cache_root)
    data = ReportData(cache=cache.root, subjects=[])
    run = _read_run_report(cache.root, data.problems)
    data.run = dict(run.header) if run is not None else {}
    rows = run.by_identity() if run is not None else {}
    seen = set()
    for entry in _entries(cache, data.problems):
        seen.add(entry.identity)
        data.pipelines[f"{entry.pipeline_name} ({entry.pipeline_hash[:12]})"] += 1
        row = rows.get(entry.identity)
        subject = ReportSubject(entry.subject_id, entry.session_id, entry.split or "",
                                "cached", key=entry.key, problems=_damage(cache, entry))
        if row is not None and row.key == entry.key and row.status != "skipped":
            _take_row(subject, row)
        else:
            # A skipped row's time is the skip's and it carries no warnings: the
            # entry's own record says what the run that made it did.
            _take_meta(subject, cache)
            subject.reused = (row is not None and row.key == entry.key
                              and row.status == "skipped")
        data.subjects.append(subject)
    for ident, row in rows.items():
        if ident in seen or not row.failed:
            continue
        subject = ReportSubject(row.subject_id, row.session_id, row.split, "failed",
                                key=row.key, stage=row.stage, reason=row.reason)
        _take_row(subject, row)
        data.subjects.append(subject)
    data.subjects.sort(key=lambda s: (s.status != "failed", s.subject_id, s.session_id))
    for done, subject in enumerate(data.subjects, 1):
        try:
            _attach_qc(cache, subject, make_missing)
            _made_by_run(cache, subject, data.run, keep=not make_missing)
        except Exception as exc:  # noqa: BLE001 - one damaged subject is shown, not fatal
            subject.problems.append(f"its QC could not be read: {type(exc).__name__}: {exc}")
        if progress is not None:
            progress(done, len(data.subjects))
    data.declared = with_stage_declarations(
        declared_metrics(s.qc for s in data.subjects),
        {m for s in data.subjects for m in s.metrics})
    _flag_outliers(data.subjects, data.declared)
    return data


def _entries(cache: Cache, problems: list[str]) -> list[IndexEntry]:
    """The index's well-formed entries; each malformed one, or an unreadable index, is a
    problem of the report (``mriprep check`` names them all)."""
    try:
        raw = cache.read_index()
    except CacheError as exc:
        problems.append(f"the index cannot be read, so cached subjects are not listed: {exc}")
        return []
    reading = read_entries(raw)
    problems += [f"{refused.error} (not shown)" for refused in reading.refused]
    return list(reading.entries.values())


def _read_run_report(root: Path, problems: list[str]) -> RunReport | None:
    try:
        run = read_latest_run_report(root)
    except CacheError as exc:
        problems.append(f"the run report cannot be read ({exc}): failed subjects of the "
                        "last run are not listed")
        return None
    if run is not None and run.unreadable_rows:
        problems.append(f"{run.unreadable_rows} row(s) of the run report {run.path} are not "
                        "subject records and are not shown")
    return run


def _take_row(subject: ReportSubject, row: SubjectResult) -> None:
    subject.stage_metrics = dict(row.metrics)
    subject.warnings = list(row.warnings)
    subject.seconds = row.seconds


def _take_meta(subject: ReportSubject, cache: Cache) -> None:
    """Stage metrics from the entry's sidecar (a subject the last run did not touch)."""
    from mriprep.cache.sidecar import read_sidecar
    from mriprep.pipelines.execute import stage_metrics_json, stage_warnings_json

    try:
        records = read_sidecar(cache, subject.key).records
        subject.stage_metrics = stage_metrics_json(records)
        subject.warnings = stage_warnings_json(records)
    except (CacheError, AttributeError, TypeError, ValueError) as exc:
        subject.problems.append(f"the entry's sidecar cannot be read: {exc}")


def _attach_qc(cache: Cache, subject: ReportSubject, make_missing: bool) -> None:
    if not subject.key:
        subject.problems.append(f"no pictures: it failed at {subject.stage or 'its start'} "
                                "before its input was read")
        return
    subject.qc = read_qc(cache.root, subject.key)
    if subject.qc is not None and subject.status == "cached" \
            and subject.qc.get("status") == "failed":
        subject.qc = None  # made when this key failed earlier: not this entry's
    if subject.qc is not None:
        return
    if subject.status != "cached":
        subject.problems.append("no picture of the input: it could not be read, or the "
                                "run made no QC (--no-report)")
        return
    if not make_missing:
        subject.problems.append(f"no QC was made for this entry (it was cached with "
                                f"--no-report); `mriprep report {cache.root}` makes it")
        return
    from mriprep.qc.subject import qc_from_cache

    try:
        qc = qc_from_cache(cache, subject.key)
    except Exception as exc:  # noqa: BLE001 - a damaged entry is shown, not fatal
        subject.problems.append(f"QC could not be made from the cache: "
                                f"{type(exc).__name__}: {exc}")
        return
    identity = {"subject_id": subject.subject_id, "session_id": subject.session_id,
                "split": subject.split, "status": "cached"}
    try:
        write_qc(cache.root, subject.key, qc, identity, replace=False)
        subject.qc = read_qc(cache.root, subject.key)
    except OSError as exc:
        subject.problems.append(f"QC made from the cache could not be stored in "
                                f"{cache.root}: {exc}")


def _made_by_run(cache: Cache, subject: ReportSubject, run: dict[str, Any],
                 keep: bool = True) -> None:
    """The time of the run that made a cached entry: the last run's, kept in its
    ``qc.json`` when that run made it (``keep``: the report at the end of that run; a
    later ``mriprep report`` only reads, so a read-only cache reports as it is); read
    back from there when a run before made it."""
    if subject.status != "cached" or subject.qc is None:
        return
    if subject.seconds is None:  # made by an earlier run than the last
        subject.seconds = (subject.qc.get("made_by_run") or {}).get("seconds")
        return
    if not keep:
        return
    made = {"seconds": subject.seconds, "run_started": run.get("started")}
    if subject.qc.get("made_by_run") == made:
        return
    try:
        record_made_by_run(cache.root, subject.key, made)
        subject.qc["made_by_run"] = made
    except OSError as exc:
        subject.problems.append(f"the time of the run that made it could not be kept in "
                                f"its qc.json ({exc}): a rerun's report will not show it")


def _damage(cache: Cache, entry: IndexEntry) -> list[str]:
    """Cheap signs of a damaged entry: a tensor file missing or not of the size its index
    entry records (the checksums are ``mriprep check``'s job)."""
    problems = []
    for name, record in entry.files.items():
        path = cache.entry_dir(entry.key) / record.file
        size = path.stat().st_size if path.is_file() else None
        if size is None:
            problems.append(f"tensor {name} is missing ({path}); run `mriprep check`")
        elif record.bytes is not None and size != record.bytes:
            problems.append(f"tensor {name} is damaged: {path} holds {size} bytes, the "
                            f"entry recorded {record.bytes}; run `mriprep check`")
    return problems


def _flag_outliers(subjects: list[ReportSubject], declared: dict[str, QCMetric]) -> None:
    """Each cached subject's outlier flags, and its place in the cohort on every metric."""
    by_key = {s.key: s for s in subjects}
    cached = {s.key: s.metrics for s in subjects if s.status == "cached" and s.qc is not None}
    for outlier in cohort_flags(cached, declared):
        by_key[outlier.name].outliers.append(outlier)
    for metric in sorted({m for values in cached.values() for m in values}):
        keys = list(cached)
        z, median = cohort_scores([_number(cached[k].get(metric)) for k in keys],
                                  declared.get(metric))
        for key, score in zip(keys, z):
            by_key[key].cohort[metric] = (median, float(score))


def _number(value) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return float("nan")
    return float(value)
