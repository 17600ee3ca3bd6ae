"""Honest splits: find leaks between train/val/test, and assign splits by subject.

A validation score is only honest when no person's anatomy is in two splits. This package
holds the checks that prove it, shared by ``mriprep splits`` (on a manifest, before any
preprocessing) and ``mriprep check`` (on a cache, after):

* :mod:`~mriprep.splits.leaks`: every scan has a split (:func:`find_unassigned`), all
  scans (sessions) of a subject share one (:func:`find_subject_leaks`), and the same
  content (a SHA-256 of the input file, or the checksum of the cached tensor) is not
  under two subject ids or in two splits (:func:`find_identical`);
* :mod:`~mriprep.splits.near_duplicates`: images that are almost the same (the same scan
  re-encoded, re-registered or lightly edited), on small fingerprints, without comparing
  every pair (:func:`find_near_duplicates`);
* :mod:`~mriprep.splits.identity`: one person's anatomy under two ids or in two splits
  (rescans in other poses, resolutions, contrasts, skull-stripped or not), on
  descriptors of registered images (:func:`identity_descriptor`,
  :func:`find_identity_matches`);
* :mod:`~mriprep.splits.manifest_check`: all of the above that need no tensors, on a
  manifest (:func:`check_manifest_splits`);
* :mod:`~mriprep.splits.assignment`: a split per subject (never per scan), in counts
  within one subject of the fractions, drawn in an order fixed by a hash of the subject
  id and a seed, keeping existing splits as the cohort grows (:func:`assign_splits`);
  K-fold cross-validation folds by subject (:func:`assign_folds`);
* :mod:`~mriprep.splits.summary`: ``mriprep splits``'s work, an assignment and the
  check of its result (:func:`assign_and_check`), and what it did as JSON and as text
  (:class:`SplitsSummary`).

Every problem is a :class:`~mriprep.core.findings.Finding`. The names below are the API
of ``mriprep splits`` and ``mriprep check``; the modules of this package import each
other directly.
"""

from mriprep.splits.assignment import (
    FOLD_COLUMN,
    Assignment,
    FoldAssignment,
    assign_folds,
    assign_splits,
    parse_fractions,
    split_targets,
)
from mriprep.splits.identity import (
    IDENTITY_ERROR,
    IDENTITY_WARNING,
    find_identity_matches,
    identity_descriptor,
)
from mriprep.splits.leaks import SplitMember, find_identical, find_subject_leaks, find_unassigned
from mriprep.splits.manifest_check import SplitsReport, check_manifest_splits
from mriprep.splits.near_duplicates import (
    EXACT_SEARCH_MAX,
    NEAR_DUPLICATE_THRESHOLD,
    find_near_duplicates,
)
from mriprep.splits.summary import SplitsSummary, assign_and_check

__all__ = [
    "EXACT_SEARCH_MAX",
    "FOLD_COLUMN",
    "IDENTITY_ERROR",
    "IDENTITY_WARNING",
    "NEAR_DUPLICATE_THRESHOLD",
    "Assignment",
    "FoldAssignment",
    "assign_folds",
    "SplitMember",
    "SplitsReport",
    "SplitsSummary",
    "assign_and_check",
    "assign_splits",
    "check_manifest_splits",
    "find_identical",
    "find_identity_matches",
    "find_near_duplicates",
    "find_subject_leaks",
    "find_unassigned",
    "identity_descriptor",
    "parse_fractions",
    "split_targets",
]
