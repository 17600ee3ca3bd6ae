"""Integrity checks of a tensor cache before training (``mriprep check``).

:func:`check_cache` proves that a cache is safe to train on, or lists every reason it is
not, all at once. It runs the checks of :mod:`mriprep.check` in order; each problem is
a :class:`Finding` with a stable ``code``, registered with its severity, meaning and fix
in :data:`mriprep.core.finding_codes.CODES` (``mriprep check --explain CODE``):

Tensor pass (:mod:`mriprep.check.entries`: every file read once, in chunks)
    ``file-missing``, ``file-size``, ``tensor-unreadable``, ``tensor-layout``,
    ``dtype-mismatch``, ``shape-mismatch``, ``checksum-mismatch``, ``non-finite``,
    ``extreme-values`` (beyond the range of the training dtype, ``dtype=``: the cast under
    mixed-precision training overflows to Inf), ``cast-underflow`` (warning: so many
    nonzero values below the dtype's smallest normal number that the image loses its
    contrast), ``cast-precision`` (warning: integers the dtype cannot hold exactly),
    ``meta-missing``, ``meta-mismatch``.
Label values (:mod:`mriprep.check.labels`)
    ``label-values``, ``labels-unchecked`` (warning).
Label maps against a label table (with ``label_table=``; :mod:`mriprep.check.label_table`,
in place of the label values)
    ``lut-unknown-values``, ``lut-unknown-background`` (warning), ``lut-cortex-lost``,
    ``lut-absent-classes``, ``lut-absent-allowed`` (warning), ``lut-rewrites`` (info).
Index checks (pure, on the index entries; :mod:`mriprep.check.index`)
    ``index-unreadable``, ``empty-cache``, ``index-entry-unsafe`` (an entry that would
    lead outside the cache: never followed), ``index-malformed``, ``geometry``,
    ``pipeline-mismatch``, ``split-missing``, ``subject-split-leak``, ``duplicate-input``,
    ``duplicate-tensor``, ``identity-leak``, ``possible-identity-leak`` (warning),
    ``duplicate-session`` (warning), ``near-duplicate`` (warning), ``grid-mismatch``
    (warning), ``identity-too-uniform`` (warning: entries that deviate from the
    reference population alike, too uniform to judge identity;
    :mod:`mriprep.check.identity`).
Quality outliers (:mod:`mriprep.check.quality`, from the QC metrics of each entry)
    ``qc-outlier`` (warning), ``qc-missing`` (warning).
Header conflicts (:mod:`mriprep.check.headers`, from each entry's load record)
    ``header-conflict`` (warning: the input's qform and sform place the field of view more
    than :data:`~mriprep.inputs.headers.FORM_CONFLICT_LIMIT_MM` apart and no ``header:``
    chose between them).
Falsely fine inputs (:mod:`mriprep.check.resolution`, from each entry's plausibility record)
    ``resolution-falsely-fine`` (warning: the input's header claims at least 1.5x finer
    voxels than its data hold along an axis).
Manifest checks (with ``manifest=``; :mod:`mriprep.check.manifest`)
    ``manifest-missing``, ``manifest-failed``, ``manifest-split-mismatch``,
    ``manifest-excluded`` (warning), ``not-in-manifest`` (warning).

Errors make :attr:`CheckReport.ok` false; warnings and infos are reported but do not fail
the gate.

One person's anatomy under two ids is found on identity fingerprints made during the
tensor pass (:mod:`mriprep.splits.identity`: 32^3 block means of each image, the blocks
of the brain's core robustly standardised, centred and scaled on a fixed reference
population (:mod:`mriprep.splits.reference`) and compared by correlation, so that a
pair's score does not depend on the rest of the cache; every pair up to
:data:`~mriprep.splits.EXACT_SEARCH_MAX` entries, LSH above). In two splits a match is an
``identity-leak`` error from :data:`~mriprep.splits.IDENTITY_ERROR`, a
``possible-identity-leak`` warning below it; in one split a ``near-duplicate`` warning;
the ids that matches join are one person, and one finding names them all (the pairs in
its ``details``). Off the reference grid (t1w_mni_rigid's MNI152 1 mm) fingerprints are
centred on their own cohort (:mod:`mriprep.check.identity`).
Identity is promised on registered pipelines only: without registration two scans of one
person are not on one grid, and the check's summary says that only identical
acquisitions are found.

The split-leak checks themselves (unassigned scans, subjects in two splits, identical
content) live in :mod:`mriprep.splits`, shared with ``mriprep splits``, which runs them on
a manifest before any preprocessing.
"""

from __future__ import annotations

import os
import time
from collections import Counter
from pathlib import Path
from typing import Any, Callable, Iterable

from mriprep.cache import Cache
from mriprep.cache.run_report import read_latest_run_report
from mriprep.check.entries import scan_entries
from mriprep.check.headers import check_headers
from mriprep.check.index import check_geometry, check_index, well_formed_entries
from mriprep.check.kept import check_record, keep_record, table_options
from mriprep.check.label_table import (ABSENT_CLASSES, ClassTable, check_label_table,
                                       table_source)
from mriprep.check.labels import check_labels
from mriprep.check.quality import check_quality
from mriprep.check.manifest import check_against_manifest, manifest_name, manifest_rows
from mriprep.check.report import CheckReport, by_name, count_splits
from mriprep.check.resolution import check_resolution
from mriprep.core.errors import CacheError
from mriprep.core.findings import Finding
from mriprep.core.limits import cast_limits
from mriprep.splits import NEAR_DUPLICATE_THRESHOLD


def check_cache(
    cache_dir: str | os.PathLike,
    manifest: Any = None,
    *,
    allowed_labels: Iterable[int] | None = None,
    near_duplicate_threshold: float = NEAR_DUPLICATE_THRESHOLD,
    near_duplicate_method: str = "auto",
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
    exclusions: Iterable[str] = (),
    dtype: Any = "float16",
    label_table: ClassTable | None = None,
    absent_classes: str = "error",
    label_progress: Callable[[int, int], None] | None = None,
    keep: bool = True,
) -> CheckReport:
    """Check a cache for everything that would make training fail or mislead.

    Parameters
    ----------
    cache_dir : path-like
        The cache folder (as written by ``mriprep run``).
    manifest : path-like or Manifest, optional
        Check that every manifest row is cached, or listed as failed (with its reason) in
        the run report ``CACHE/reports/latest.json``, and in the manifest's split.
    allowed_labels : iterable of int, optional
        Allowed label values; overrides the set recorded with each entry. Not with
        ``label_table``.
    near_duplicate_threshold : float
        Correlation of centred fingerprints from which two subjects' images are reported
        as near-duplicates (warnings).
    near_duplicate_method : {"auto", "exact", "lsh"}
        See :func:`find_near_duplicates`.
    workers : int, optional
        Threads reading tensors (default: up to 4, at most the CPU count).
    progress : callable, optional
        Called as ``progress(done, total)`` after each entry's tensors are read.
    exclusions : iterable of str
        Manifest rows known not to be cached (``sub-01``, or ``sub-01/ses-2``): reported
        as a warning; every other failed or missing row is an error.
    dtype : {"float16", "bfloat16", "float32"}
        The dtype training casts images to (the AMP autocast dtype; a numpy or torch
        dtype, or its name, is accepted too). float16 (the default: a T4 has no
        bfloat16) and bfloat16: an image value that overflows to Inf in it is an
        ``extreme-values`` error, a share of nonzero values above
        :data:`~mriprep.check.tensors.CAST_UNDERFLOW_SHARE` below its smallest normal
        number a ``cast-underflow`` warning. float32: no cast check.
    label_table : LabelTable, optional
        Judge the label maps with the table training will use
        (:class:`mriprep.training.labels.LabelTable`: its rules, and its ``unknown``
        policy), in place of the label values check (:mod:`mriprep.check.label_table`).
    absent_classes : {"error", "allow"}
        With ``label_table``: a class no label map of a split holds is an error, or
        (``"allow"``) a warning; as ``MRIDataset(absent_classes=...)``.
    label_progress : callable, optional
        Called as ``progress(done, total)`` after each label map the table judged.
    keep : bool
        Keep the findings in the cache (``CACHE/check/findings.json``,
        :mod:`mriprep.cache.check_record`), with the options and the state of every
        entry judged, for ``exclude_flagged=`` and the QC report. A cache that cannot be
        written is checked all the same; ``report.record`` says why nothing was kept.

    Returns
    -------
    CheckReport
        All findings and the per-split counts; ``report.ok`` is the verdict.

    Raises
    ------
    CacheError
        When ``cache_dir`` is not a folder or not an mriprep cache (a usage error, not a
        finding).
    ValueError
        When ``dtype`` or ``absent_classes`` is not one of the choices, or both
        ``allowed_labels`` and ``label_table`` are given.
    """
    started = time.perf_counter()
    cast = cast_limits(dtype)
    if absent_classes not in ABSENT_CLASSES:
        raise ValueError(f"absent_classes={absent_classes!r}; choose one of {ABSENT_CLASSES}")
    if allowed_labels is not None and label_table is not None:
        raise ValueError(
            "allowed_labels= and label_table= both judge the label values; give one: "
            "with a label table its values after its rules are the allowed set")
    root = _cache_root(cache_dir)
    cache = Cache(root)
    report = CheckReport(cache=str(root), dtype=cast.name)
    # A manifest that cannot be read fails the command before the (long) tensor pass.
    rows = manifest_rows(manifest) if manifest is not None else None
    integrity = _integrity(cache, report, cast, workers, progress)
    options = {"dtype": cast.name,
               "allowed_labels": sorted(allowed_labels) if allowed_labels is not None
               else None,
               "label_table": None if label_table is None
               else table_options(label_table, table_source(label_table)),
               "absent_classes": absent_classes,
               "near_duplicate_threshold": near_duplicate_threshold,
               "manifest": manifest_name(manifest) if manifest is not None else None}
    if integrity is None:
        if keep:  # the last check judged nothing: no older record may speak for it
            report.record = keep_record(root, check_record(report, {}, {}, options))
        report.seconds = time.perf_counter() - started
        return report
    index, scans = integrity
    fingerprints = {k: s.fingerprint for k, s in scans.items() if s.fingerprint is not None}
    report.findings += check_index(
        index,
        fingerprints,
        near_duplicate_threshold,
        near_duplicate_method,
        report.near_duplicate_search,
    )
    regions: dict = {}
    if label_table is None:
        report.findings += check_labels(index, scans, allowed_labels)
    else:
        found, report.label_table, regions = check_label_table(
            cache, index, scans, label_table, absent_classes, workers, label_progress)
        report.findings += found
    report.findings += check_headers(index, {k: s.meta for k, s in scans.items()})
    report.findings += check_resolution(index, {k: s.meta for k, s in scans.items()})
    if index:
        report.findings += check_quality(root, index)
    report.splits = count_splits(index, scans)
    report.pipeline_hashes = dict(Counter(e.pipeline_hash for e in index.values()))
    if rows is not None:
        report.findings += check_against_manifest(
            index, rows, read_latest_run_report(root), manifest_name(manifest), tuple(exclusions)
        )
    if keep:
        record = check_record(report, index, {k: s.label_counts for k, s in scans.items()},
                              options, label_table)
        report.record = keep_record(root, record, regions)
    report.seconds = time.perf_counter() - started
    return report


def verify_cache(
    cache_dir: str | os.PathLike,
    *,
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> CheckReport:
    """The integrity part of :func:`check_cache` (``mriprep cache verify``): the index is
    readable and well formed, and every entry's files are present, whole, finite and
    equal to their checksums, sidecars and index records. No cast, split, leak, label
    or quality check."""
    started = time.perf_counter()
    root = _cache_root(cache_dir)
    report = CheckReport(cache=str(root), dtype="float32")
    integrity = _integrity(Cache(root), report, cast_limits("float32"), workers, progress)
    if integrity is not None:
        index, scans = integrity
        report.splits = count_splits(index, scans)
        report.pipeline_hashes = dict(Counter(e.pipeline_hash for e in index.values()))
    report.seconds = time.perf_counter() - started
    return report


def _cache_root(cache_dir: str | os.PathLike) -> Path:
    root = Path(cache_dir)
    if root.is_file():
        raise CacheError(f"{root} is a file, not a cache folder; pass the folder given to "
                         "`mriprep run -o`")
    if not root.is_dir():
        raise CacheError(
            f"cache folder {root} does not exist; pass the folder given to `mriprep run -o`"
        )
    return root


def _integrity(cache: Cache, report: CheckReport, cast, workers, progress):
    """Index and tensor findings into ``report``; the well-formed index and the scans,
    or None when the index cannot be read."""
    try:
        raw_index = cache.read_index()
    except CacheError as exc:
        report.findings.append(Finding(
            "index-unreadable",
            f"{exc}; `mriprep cache repair {cache.root}` rebuilds it from the entries' "
            "sidecars"))
        return None
    report.entries = len(raw_index)
    if not raw_index:
        report.findings.append(
            Finding(
                "empty-cache",
                f"{cache.root} has no indexed entries; run `mriprep run` first"
            )
        )
    index, malformed = well_formed_entries(raw_index, cache.root)
    report.findings += malformed
    for _, entry in sorted(index.items()):
        report.findings += check_geometry(entry)
    read_start = time.perf_counter()
    scans = scan_entries(cache, index, workers, progress, cast)
    report.read_seconds = time.perf_counter() - read_start
    for key in by_name(index, scans):
        report.findings += scans[key].findings
        report.bytes_read += scans[key].bytes_read
    return index, scans
