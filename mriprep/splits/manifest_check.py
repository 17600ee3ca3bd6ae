"""The split checks of ``mriprep splits``: on a manifest, before any preprocessing.

:func:`check_manifest_splits` runs the leak checks of :mod:`mriprep.splits.leaks` on the
rows of a manifest (a row is a :class:`~mriprep.splits.leaks.SplitMember` whose ref is its
line, ``"line 12"``): every row has a split, all sessions of a subject share one, and no
image file's content (SHA-256, see :func:`hash_images`) appears under two subject ids or
in two splits. It returns a :class:`SplitsReport` with every finding and the subjects
and scans of each split; it writes nothing.
"""

from __future__ import annotations

import concurrent.futures
import os
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from mriprep.core.findings import Finding, FindingsMixin
from mriprep.core.hashing import sha256_file
from mriprep.splits.leaks import find_identical, find_subject_leaks, find_unassigned


@dataclass
class SplitsReport(FindingsMixin):
    """What :func:`check_manifest_splits` found; ``ok`` when no finding is an error."""

    manifest: str
    rows: int = 0
    findings: list[Finding] = field(default_factory=list)
    splits: dict[str, dict[str, int]] = field(default_factory=dict)
    files_hashed: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "manifest": self.manifest,
            "ok": self.ok,
            "rows": self.rows,
            "errors": len(self.errors),
            "warnings": len(self.warnings),
            "findings": [f.to_json() for f in self.findings],
            "splits": self.splits,
            "files_hashed": self.files_hashed,
        }


def split_counts(rows: Iterable[Any]) -> dict[str, dict[str, int]]:
    """Split name (``""`` for unassigned) -> numbers of subjects and scans."""
    subjects: dict[str, set] = defaultdict(set)
    scans: Counter = Counter()
    for row in rows:
        subjects[row.split].add(row.subject_id)
        scans[row.split] += 1
    return {s: {"subjects": len(subjects[s]), "scans": scans[s]} for s in sorted(scans)}


def hash_images(paths: Iterable[Path], workers: int | None = None) -> dict[Path, str]:
    """SHA-256 of every file that shares its byte size with another one.

    Files of different sizes cannot be identical, so most of a cohort is never read.
    """
    by_size: dict[int, list[Path]] = defaultdict(list)
    for path in set(paths):
        by_size[path.stat().st_size].append(path)
    suspects = sorted(p for group in by_size.values() if len(group) > 1 for p in group)
    workers = workers or min(4, os.cpu_count() or 1)
    with concurrent.futures.ThreadPoolExecutor(workers) as pool:
        return dict(zip(suspects, pool.map(sha256_file, suspects)))


def check_manifest_splits(
    manifest: Any, hash_files: bool = True, workers: int | None = None,
    require_splits: bool = True,
) -> SplitsReport:
    """The split checks that need no tensors, on a manifest, before preprocessing.

    Every row has a split; all sessions of a subject share one split; no image file
    content (SHA-256) appears under two subject ids or in two splits.

    Parameters
    ----------
    manifest : Manifest
        As returned by :func:`mriprep.inputs.manifest.read_manifest`.
    hash_files : bool
        Compare image contents (files of equal size are hashed). Without it only ids and
        splits are checked.
    workers : int, optional
        Threads hashing files.
    require_splits : bool
        A row without a split is an error (default). False for a manifest whose ``fold``
        column, over every subject, stands in for the splits (K-fold without a test set).
    """
    rows = list(manifest.rows)
    report = SplitsReport(manifest=str(getattr(manifest, "path", "")), rows=len(rows))
    if require_splits:
        report.findings += find_unassigned(
            rows, "assign splits per subject with `mriprep splits MANIFEST --assign ... -o OUT`"
        )
    report.findings += find_subject_leaks(
        rows, "put every session of a subject in one split (`mriprep splits --assign --reassign`)"
    )
    if hash_files:
        digests = hash_images([r.image for r in rows], workers)
        report.files_hashed = len(digests)
        hashes = {r.ref: [digests[r.image]] for r in rows if r.image in digests}
        # A manifest row is a SplitMember: the leak checks take the rows as they are.
        report.findings += find_identical(
            rows, hashes, "duplicate-input", "image file (sha256 {})"
        )
    report.splits = split_counts(rows)
    return report
