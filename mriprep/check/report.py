"""The report model of ``mriprep check``: per-split counts, the report, entry names."""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Iterable

from mriprep.cache import IndexEntry
from mriprep.core.findings import Finding, FindingsMixin, Severity

if TYPE_CHECKING:
    from mriprep.check.entries import EntryScan


@dataclass
class SplitCounts:
    """What one split holds, so that a skewed split is visible at a glance.

    ``invalid_fraction`` is the share of voxels whose ``valid`` mask is False (filled or
    masked by the pipeline); ``label_shares`` maps each label value to its share of the
    split's labelled voxels.
    """

    split: str
    entries: int = 0
    subjects: int = 0
    sessions: int = 0
    voxels: int = 0
    invalid_voxels: int = 0
    labelled_entries: int = 0
    label_counts: dict[int, int] = field(default_factory=dict)

    @property
    def invalid_fraction(self) -> float:
        return self.invalid_voxels / self.voxels if self.voxels else 0.0

    @property
    def label_shares(self) -> dict[int, float]:
        total = sum(self.label_counts.values())
        return {v: c / total for v, c in sorted(self.label_counts.items())} if total else {}

    def to_json(self) -> dict[str, Any]:
        return {
            "split": self.split,
            "entries": self.entries,
            "subjects": self.subjects,
            "sessions": self.sessions,
            "voxels": self.voxels,
            "invalid_fraction": self.invalid_fraction,
            "labelled_entries": self.labelled_entries,
            "label_shares": {str(v): s for v, s in self.label_shares.items()},
        }


@dataclass
class CheckReport(FindingsMixin):
    """Everything :func:`mriprep.check.check_cache` found; ``ok`` when no finding is an error."""

    cache: str
    dtype: str = "float16"  # the training dtype the images' cast was checked for
    entries: int = 0
    findings: list[Finding] = field(default_factory=list)
    splits: dict[str, SplitCounts] = field(default_factory=dict)
    pipeline_hashes: dict[str, int] = field(default_factory=dict)
    bytes_read: int = 0
    read_seconds: float = 0.0
    seconds: float = 0.0
    near_duplicate_search: dict[str, Any] = field(default_factory=dict)
    # the label table the label maps were judged with (--lut), and what it found
    label_table: dict[str, Any] | None = None
    # where the findings were kept in the cache, or why they could not be
    # (mriprep.check.kept.keep_record); None when the check kept nothing
    record: dict[str, Any] | None = None

    @property
    def read_mb_per_s(self) -> float:
        return self.bytes_read / 1e6 / self.read_seconds if self.read_seconds > 0 else 0.0

    @property
    def infos(self) -> list[Finding]:
        return [f for f in self.findings if f.severity == Severity.INFO]

    def codes(self) -> set[str]:
        return {f.code for f in self.findings}

    def to_json(self) -> dict[str, Any]:
        return {
            "cache": self.cache,
            "dtype": self.dtype,
            "ok": self.ok,
            "entries": self.entries,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "infos": len(self.infos),
            "findings": [f.to_json() for f in self.findings],
            "splits": {name: s.to_json() for name, s in sorted(self.splits.items())},
            "pipeline_hashes": dict(self.pipeline_hashes),
            "bytes_read": self.bytes_read,
            "read_seconds": round(self.read_seconds, 4),
            "read_mb_per_s": round(self.read_mb_per_s, 1),
            "seconds": round(self.seconds, 4),
            "near_duplicate_search": self.near_duplicate_search,
            "label_table": self.label_table,
            "record": self.record,
        }


def by_name(index: dict[str, IndexEntry], keys: Iterable[str]) -> list[str]:
    """Cache keys in the order messages list them: by their entries' names."""
    return sorted(keys, key=lambda k: index[k].finding_name)


def subjects_of(index: dict[str, IndexEntry], keys: Iterable[str]) -> tuple[str, ...]:
    """The distinct subject ids of some cache keys, sorted (a finding's ``subjects``)."""
    return tuple(sorted({index[k].subject_id for k in keys}))


def count_splits(
    index: dict[str, IndexEntry], scans: dict[str, EntryScan]
) -> dict[str, SplitCounts]:
    """Per-split counts, invalid-voxel fraction and label shares."""
    counts: dict[str, SplitCounts] = {}
    subjects: dict[str, set] = defaultdict(set)
    for key, entry in index.items():
        split = entry.split or "(none)"
        s = counts.setdefault(split, SplitCounts(split))
        s.entries += 1
        subjects[split].add(entry.subject_id)
        s.sessions += 1 if entry.session_id else 0
        scan = scans.get(key)
        if scan is None:
            continue
        if scan.valid_voxels is not None and scan.voxels:
            s.voxels += scan.voxels
            s.invalid_voxels += scan.voxels - scan.valid_voxels
        if scan.label_counts is not None:
            s.labelled_entries += 1
            for value, count in scan.label_counts.items():
                s.label_counts[value] = s.label_counts.get(value, 0) + count
    for split, s in counts.items():
        s.subjects = len(subjects[split])
    return counts
