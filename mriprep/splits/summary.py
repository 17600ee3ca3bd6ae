"""What ``mriprep splits`` did, as JSON for scripts and as text for people.

:func:`assign_and_check` runs the assignment the options ask for (splits, folds or both,
:mod:`~mriprep.splits.assignment`) and the split checks on its result
(:mod:`~mriprep.splits.manifest_check`); it writes nothing. The
:class:`SplitsSummary` it returns (or that wraps a plain check) renders both forms:
:meth:`SplitsSummary.to_json` (``--json``) and :meth:`SplitsSummary.render`.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping, Sequence

from mriprep.core.findings import Severity
from mriprep.splits.assignment import Assignment, FoldAssignment, assign_folds, assign_splits
from mriprep.splits.manifest_check import SplitsReport, check_manifest_splits


@dataclass
class SplitsSummary:
    """The split check's report and, when splits or folds were assigned, how.

    ``fractions``, ``seed``, ``stratify`` and ``folds_of`` are the settings the
    assignment ran with (``folds_of``: a split, or ``"all"``); ``written`` is the
    manifest written, None while nothing is (or when the check failed).
    """

    report: SplitsReport
    assignment: Assignment | None = None
    folds: FoldAssignment | None = None
    fractions: Mapping[str, float] | None = None
    seed: str = "0"
    stratify: str | None = None
    folds_of: str | None = None
    written: Path | None = None

    @property
    def assigning(self) -> bool:
        return self.assignment is not None or self.folds is not None

    def to_json(self) -> dict[str, Any]:
        doc = self.report.to_json()
        if self.assignment is not None:
            a = self.assignment
            doc["assignment"] = {
                "fractions": dict(self.fractions or {}),
                "seed": self.seed,
                "stratify": self.stratify,
                "targets": a.targets,
                "assigned_subjects": a.assigned,
                "kept_subjects": a.kept,
                "strata": a.strata,
                "notes": a.notes,
            }
        if self.folds is not None:
            f = self.folds
            doc["folds"] = {"k": f.folds, "of": self.folds_of, "sizes": f.sizes,
                            "assigned_subjects": f.assigned, "kept_subjects": f.kept,
                            "strata": f.strata, "notes": f.notes}
        if self.assigning:
            doc["output"] = str(self.written) if self.written else None
        return doc

    def render(self) -> str:
        """The result as text for people: counts per split, findings, verdict."""
        report, assignment, folds = self.report, self.assignment, self.folds
        subjects = sum(c["subjects"] for c in report.splits.values())
        lines = [f"manifest {report.manifest}: {report.rows} row(s), {subjects} subject(s)"]
        if report.files_hashed:
            lines.append(f"  {report.files_hashed} image file(s) of equal size hashed for "
                         "identical content")
        if assignment is not None:
            lines.append(
                f"  assigned {assignment.assigned} subject(s) in the order of their hash "
                f"(seed {self.seed}), kept the split of {assignment.kept}"
            )
        lines += ["", *self._split_table()]
        if assignment is not None and assignment.strata:
            names = list(self.fractions or {})
            lines += ["", f"{self.stratify:<16}" + "".join(f"{n:>8}" for n in names)]
            for value, counts in assignment.strata.items():
                lines.append(f"{value:<16}" + "".join(f"{counts[n]:>8}" for n in names))
        if folds is not None:
            lines += ["", *self._fold_table()]
        notes = self.notes()
        lines += [f"WARNING {note}" for note in notes]
        if report.findings:
            lines.append("")
        for finding in sorted(report.findings,
                              key=lambda f: (f.severity != Severity.ERROR, f.code)):
            lines.append(f"{finding.severity.upper():<8}{finding.code:<20}{finding.message}")
        verdict = "OK" if report.ok else "FAILED"
        # The summary counts every WARNING line above: the findings' and the assignment's.
        warned = len(report.warnings) + len(notes)
        lines += ["", f"{verdict}: {len(report.errors)} error(s), {warned} warning(s)"]
        if self.written:
            lines.append(f"wrote {self.written}")
        elif self.assigning and not report.ok:
            lines.append("nothing written: fix the errors above first")
        return "\n".join(lines)

    def notes(self) -> list[str]:
        """The assignment's warnings (a stratum too small, ...), splits' then folds'."""
        return ((self.assignment.notes if self.assignment else [])
                + (self.folds.notes if self.folds else []))

    def _split_table(self) -> list[str]:
        targets = self.assignment.targets if self.assignment is not None else {}
        rows = [f"{'split':<12}{'subjects':>9}{'scans':>8}" + (f"{'asked':>8}" if targets else "")]
        for split, counts in self.report.splits.items():
            asked = f"{targets[split]:>8}" if split in targets else ""
            rows.append(f"{split or '(none)':<12}{counts['subjects']:>9}{counts['scans']:>8}"
                        + asked)
        return rows

    def _fold_table(self) -> list[str]:
        folds = self.folds
        rows = [f"{folds.folds} folds of {self.folds_of} (column 'fold'): "
                f"assigned {folds.assigned} subject(s), kept {folds.kept}",
                f"{'fold':<16}" + "".join(f"{f:>6}" for f in folds.sizes),
                f"{'subjects':<16}" + "".join(f"{n:>6}" for n in folds.sizes.values())]
        for value, counts in folds.strata.items():
            rows.append(f"{value:<16}" + "".join(f"{n:>6}" for n in counts.values()))
        return rows


def default_folds_of(rows: Sequence[Any], assigning_splits: bool) -> str:
    """The split whose subjects ``--folds`` deals by default: ``train`` when the manifest
    has splits (or gets them now), every subject (``"all"``) when it has none, as
    nnU-Net does."""
    return "train" if assigning_splits or any(r.split for r in rows) else "all"


def assign_and_check(
    manifest: Any,
    *,
    fractions: Mapping[str, float] | None = None,
    seed: str = "0",
    stratify: str | None = None,
    reassign: bool = False,
    folds: int | None = None,
    folds_of: str | None = None,
    hash_files: bool = True,
    workers: int | None = None,
    output: Path | None = None,
) -> SplitsSummary:
    """Assign splits (``fractions``) and/or folds (``folds`` of split ``folds_of``, or
    ``"all"``) to the rows of ``manifest``, then check the assigned rows' splits as the
    manifest ``output`` they are meant for. Nothing is written: the caller writes
    ``summary.assignment`` or ``summary.folds`` rows when ``summary.report.ok``.

    Raises
    ------
    ValueError
        When the assignment is impossible (see :func:`assign_splits`,
        :func:`assign_folds`).
    """
    from mriprep.inputs.manifest import Manifest

    rows = list(manifest.rows)
    if folds is not None and folds_of is None:
        folds_of = default_folds_of(rows, fractions is not None)
    assignment = dealt = None
    if fractions is not None:
        assignment = assign_splits(rows, dict(fractions), seed, stratify, reassign)
        rows = assignment.rows
    if folds is not None:
        within = None if folds_of == "all" else folds_of
        dealt = assign_folds(rows, folds, seed, stratify, within, reassign)
        rows = dealt.rows
    # Folds over a manifest without any split stand in for the splits (fold k validates).
    folds_only = dealt is not None and folds_of == "all" and not any(r.split for r in rows)
    report = check_manifest_splits(Manifest(path=output, rows=tuple(rows)), hash_files,
                                   workers, require_splits=not folds_only)
    report.manifest = str(getattr(manifest, "path", ""))
    return SplitsSummary(report, assignment, dealt, fractions, seed, stratify,
                         folds_of if dealt is not None else None)


def assigned_rows(summary: SplitsSummary) -> list[Any]:
    """The rows to write: the folds' when folds were dealt, else the splits'."""
    if summary.folds is not None:
        return list(summary.folds.rows)
    if summary.assignment is not None:
        return list(summary.assignment.rows)
    raise ValueError("nothing was assigned: there are no rows to write")
