"""What the QC report shows of ``mriprep check``: each labelled subject's per-structure
table (:mod:`mriprep.qc.structures`) and the findings the last check kept for it
(:mod:`mriprep.cache.check_record`), read from the cache here, at the report's edge.

Structures are named from the label table the check used, else as the label mosaic's
legend names them. The voxels per structure come from the check's record when it judged the entry as it is
now (the tensor pass counted them), else from the label map itself. A record older than
an entry is not shown as the entry's findings: the page says it is stale and which
command checks again. Nothing here raises for a damaged cache: what cannot be read
becomes a note on the page.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from mriprep.cache import Cache, IndexEntry
from mriprep.cache.check_record import CheckRecord, KeptFinding, read_check_record
from mriprep.core.errors import MriprepError
from mriprep.qc.mosaic import label_legend
from mriprep.qc.structures import (StructureRow, cohort_medians, label_counts,
                                   structure_rows, volumes)


@dataclass
class SubjectCheck:
    """One cached subject's part of the report: ``structures`` (None without a label
    map), ``findings`` the check kept for it (warnings and errors that name it, alone or
    with others), and ``note``: why there are none to show (no record, a stale one, an
    unreadable map)."""

    structures: list[StructureRow] | None = None
    findings: list[KeptFinding] = field(default_factory=list)
    note: str = ""

    @property
    def codes(self) -> list[str]:
        return list(dict.fromkeys(f.code for f in self.findings))


@dataclass
class CohortCheck:
    """The check as the index page shows it: when it ran (None: no record), each
    subject's part by entry key, and a note for the whole report."""

    made: str | None
    subjects: dict[str, SubjectCheck]
    note: str = ""

    @property
    def flagged(self) -> int:
        return sum(1 for s in self.subjects.values() if s.findings)


def cohort_check(cache_root: str | Path, read_maps: bool = True) -> CohortCheck:
    """Every indexed entry's structures and kept findings.

    The structure table counts each label map's voxels from a fresh check record, else
    from the map itself (a read of every map); ``read_maps=False`` (the report at the
    end of a run, which must not become a second pass over the cohort) leaves the table
    out where no fresh record holds the counts, and says so."""
    root = Path(cache_root)
    cache = Cache(root)
    try:
        entries = cache.read_entries().entries
    except MriprepError as exc:  # the report shows the damaged index already
        return CohortCheck(None, {}, f"the check's findings cannot be shown: {exc}")
    note = ""
    try:
        record = read_check_record(root)
    except MriprepError as exc:
        record, note = None, str(exc)
    if record is None and not note:
        note = (f"no check has kept its findings for this cache: `mriprep check {root} "
                "--lut dkt` (or your label table) judges the label maps and keeps them")
    stale = record.stale(entries.values()) if record is not None else {}
    subjects = {key: SubjectCheck() for key in entries}
    counts: dict[str, dict[int, int]] = {}
    for key, entry in entries.items():
        part = subjects[key]
        if record is not None and key in stale:
            part.note = (f"the check record of {record.made} is stale for this entry "
                         f"({stale[key]}): `{record.again(root)}` judges it again")
        elif record is not None:
            part.findings = [f for f in record.findings_of(key) if f.at_least("warning")]
        if entry.has_label:
            found = _counts(cache, entry, record if key not in stale else None, read_maps)
            if isinstance(found, str):
                part.note = "; ".join(filter(None, (part.note, found)))
            else:
                counts[key] = found
    voxel = {key: _voxel_mm3(entries[key]) for key in counts}
    medians = cohort_medians(volumes(c, voxel[key]) for key, c in counts.items())
    names = _names({v for c in counts.values() for v in c}, record)
    for key, found in counts.items():
        subjects[key].structures = structure_rows(found, voxel[key], medians, names)
    return CohortCheck(record.made if record is not None else None, subjects, note)


def _counts(cache: Cache, entry: IndexEntry, record: CheckRecord | None,
            read_maps: bool = True) -> dict[int, int] | str:
    """Voxels per label value (from a fresh record, else the map), or why not."""
    if record is not None:
        kept = record.label_voxels(entry.key)
        if kept is not None:
            return kept
    if not read_maps:
        return (f"no structure table: no fresh check record holds its label counts "
                f"(`mriprep check {cache.root} --lut dkt` keeps them, or `mriprep report "
                f"{cache.root}` counts them)")
    try:
        return label_counts(np.asarray(cache.load_tensor(entry.key, "label")))
    except (MriprepError, OSError, ValueError) as exc:
        return f"its label map cannot be read for the structure table ({exc})"


def _names(values: set[int], record: CheckRecord | None) -> dict[int, str]:
    """Value -> name: from the table the check judged with, else from the shipped DKT
    table where the maps are numbered as FreeSurfer numbers labels (the label mosaic's
    legend, :func:`mriprep.qc.mosaic.label_legend`)."""
    names = {e["value"]: e["name"] for e in label_legend(values) if e["in_table"]}
    if record is not None:
        names.update(record.label_names)
    return names


def _voxel_mm3(entry: IndexEntry) -> float:
    spacing = entry.spacing
    return float(np.prod(spacing)) if spacing else 1.0


def subject_context(part: SubjectCheck | None) -> dict[str, Any]:
    """The subject page's variables for its structure table and check findings."""
    if part is None:
        return dict(structures=None, check_findings=[], check_note="")
    return dict(structures=part.structures, check_findings=part.findings,
                check_note=part.note)
