"""Checks that need only the index entries (and image fingerprints): well-formed
records, self-consistent geometry, one pipeline, honest splits, no duplicates, no person
under two ids or in two splits (identity fingerprints, :mod:`mriprep.splits.identity`).

:func:`well_formed_entries` turns the raw ``index.json`` documents into
:class:`~mriprep.cache.IndexEntry` (or an ``index-entry-unsafe`` or ``index-malformed``
finding); every other check takes those entries."""

from __future__ import annotations

from collections import defaultdict
from typing import Any, Iterable

import numpy as np
from nibabel.affines import voxel_sizes

from mriprep.cache import IndexEntry, MalformedEntry, read_entries
from mriprep.check.identity import check_identity
from mriprep.check.report import by_name, subjects_of
from mriprep.core.findings import Finding, named
from mriprep.splits import (
    NEAR_DUPLICATE_THRESHOLD,
    find_identical,
    find_subject_leaks,
    find_unassigned,
)


def well_formed_entries(
    raw_index: dict[str, Any],
    cache_root: Any = "CACHE",
) -> tuple[dict[str, IndexEntry], list[Finding]]:
    """Split the raw index into the entries every other check can rely on and an error
    for each of the rest (:func:`mriprep.cache.read_entries`): ``index-entry-unsafe`` for
    an entry that would lead outside the cache (never followed: no file of it is read),
    ``index-malformed`` for one that is not well formed. ``cache_root`` is the cache
    the messages name in their fix.

    Returns
    -------
    index : dict
        Cache key -> :class:`~mriprep.cache.IndexEntry`, for the usable entries.
    findings : list of Finding
        One error per refused entry, naming it and what is wrong with it.
    """
    reading = read_entries(raw_index)
    findings = []
    for refused in reading.refused:
        if refused.unsafe:
            findings.append(Finding(
                "index-entry-unsafe",
                f"{refused.name}: index entry is unsafe and was not followed: "
                f"{'; '.join(refused.problems)}. index.json was rewritten by someone or "
                f"something other than mriprep: `mriprep cache repair {cache_root}` takes "
                "it out of the index and quarantines it",
                (refused.key,)))
        else:
            findings.append(Finding(
                "index-malformed",
                f"{refused.name}: index entry {'; '.join(refused.problems)}",
                (refused.key,)))
    return dict(sorted(reading.entries.items())), findings


def check_geometry(entry: IndexEntry) -> list[Finding]:
    """The recorded grid is self-consistent: spacing = affine column norms, tensor shapes
    equal the recorded shape, labels are integers."""
    problems = []
    files = entry.files
    image_shape = list(files["image"].shape)
    if len(image_shape) != 3:
        problems.append(f"image shape {image_shape} is not 3-D")
    if entry.shape is not None and list(entry.shape) != image_shape:
        problems.append(
            f"recorded shape {list(entry.shape)} differs from {files['image'].file}'s "
            f"{image_shape}"
        )
    for kind in ("valid", "label"):
        if kind in files and list(files[kind].shape) != image_shape:
            shape = list(files[kind].shape)
            problems.append(f"{files[kind].file} shape {shape} differs from "
                            f"{files['image'].file}'s {image_shape}")
    for kind, record in files.items():
        try:
            dtype = np.dtype(record.dtype)
        except TypeError:
            problems.append(f"{record.file} dtype {record.dtype!r} is not a numpy dtype")
            continue
        if kind == "label" and not np.issubdtype(dtype, np.integer):
            problems.append(f"{record.file} dtype {dtype} is not an integer type")
    try:
        affine = entry.affine
    except MalformedEntry as exc:  # not a finite 4x4 matrix
        problems += exc.problems
    else:
        if affine is None:
            pass
        elif abs(np.linalg.det(affine[:3, :3])) < 1e-9:
            problems.append("affine is singular")
        elif entry.spacing is not None:
            norms = voxel_sizes(affine)
            spacing = np.asarray(entry.spacing, dtype=np.float64)
            if spacing.shape != (3,) or not np.allclose(norms, spacing, rtol=1e-4, atol=1e-6):
                problems.append(
                    f"recorded spacing {list(entry.spacing)} differs from the affine's voxel "
                    f"size {np.round(norms, 6).tolist()}"
                )
    name = entry.finding_name
    return [
        Finding("geometry", f"{name}: {p}", (entry.key,), (entry.subject_id,))
        for p in problems
    ]


def image_input_hashes(entry: IndexEntry) -> list[str]:
    """SHA-256 of the entry's input images (every input except label maps).

    Accepts the shapes the runner may record: ``{"image": {"path", "sha256"}}``,
    ``{"image": "<sha256>"}`` or a list of ``{"name"/"role", "sha256"}``.
    """
    inputs = entry.inputs
    items: Iterable[tuple[str, Any]]
    if isinstance(inputs, dict):
        items = inputs.items()
    elif isinstance(inputs, list):
        items = [
            (str(i.get("name") or i.get("role") or ""), i) for i in inputs if isinstance(i, dict)
        ]
    else:
        return []
    hashes = []
    for name, value in items:
        if "label" in name:
            continue
        digest = value.get("sha256") if isinstance(value, dict) else value
        if isinstance(digest, str) and digest:
            hashes.append(digest)
    return hashes


def check_index(
    index: dict[str, IndexEntry],
    fingerprints: dict[str, np.ndarray] | None = None,
    near_duplicate_threshold: float = NEAR_DUPLICATE_THRESHOLD,
    near_duplicate_method: str = "auto",
    search_info: dict[str, Any] | None = None,
) -> list[Finding]:
    """Checks that need only the index entries (and the image fingerprints).

    One pipeline hash for every entry and split; every entry has a split; no subject in
    two splits; no identical input image or cached image under two subject ids or in two
    splits; no one person's anatomy under two subject ids: ``identity-leak`` (error) in
    two splits from :data:`~mriprep.splits.IDENTITY_ERROR`, ``possible-identity-leak``
    (warning) in two splits below it, ``near-duplicate`` (warning) in one split, one
    finding per person (the ids that matches join).

    Parameters
    ----------
    index : dict
        Cache key -> :class:`~mriprep.cache.IndexEntry` (see :func:`well_formed_entries`).
    fingerprints : dict, optional
        Cache key -> identity fingerprint (see
        :func:`~mriprep.check.tensors.scan_tensor_file`); without them the identity
        search is skipped.
    near_duplicate_threshold : float
        Correlation of cohort-centred fingerprints from which two subjects' images are
        reported (a warning; an error in two splits from
        ``max(threshold, IDENTITY_ERROR)``).
    near_duplicate_method : {"auto", "exact", "lsh"}
        See :func:`~mriprep.splits.find_identity_matches`.
    search_info : dict, optional
        Filled with how the near-duplicate search ran (method, pairs compared, seconds).
    """
    items = list(index.values())  # an index entry is a SplitMember
    findings = _check_pipeline(index)
    findings += find_unassigned(
        items, "give every manifest row a split (`mriprep splits --assign`) and rerun `mriprep run`"
    )
    findings += find_subject_leaks(
        items, "assign splits per subject (`mriprep splits --assign`) and rerun `mriprep run`"
    )
    reported: list[set[str]] = []
    findings += find_identical(
        items,
        {k: image_input_hashes(e) for k, e in index.items()},
        "duplicate-input",
        "input image (sha256 {})",
        reported,
    )
    findings += find_identical(
        items,
        {k: [e.files["image"].xxh3_128] for k, e in index.items()},
        "duplicate-tensor",
        "cached image (xxh3 {})",
        reported,
    )
    findings += _check_grids(index)
    if fingerprints:
        findings += check_identity(
            index,
            fingerprints,
            near_duplicate_threshold,
            near_duplicate_method,
            reported,
            search_info if search_info is not None else {},
        )
    return findings


def _pipeline_name(entry: IndexEntry) -> str:
    return "?" if entry.pipeline_name is None else entry.pipeline_name


def _check_pipeline(index: dict[str, IndexEntry]) -> list[Finding]:
    """Entries made by another pipeline than the majority (every group on a tie)."""
    by_hash: dict[str, list[str]] = defaultdict(list)
    for key, entry in index.items():
        by_hash[entry.pipeline_hash].append(key)
    if len(by_hash) <= 1:
        return []
    ranked = sorted(by_hash.items(), key=lambda kv: (-len(kv[1]), kv[0]))
    counts = ", ".join(
        f"{h[:12]} ({_pipeline_name(index[keys[0]])}): {len(keys)}" for h, keys in ranked
    )
    has_majority = len(ranked[0][1]) > len(ranked[1][1])
    findings = []
    for pipeline_hash, keys in ranked[1:] if has_majority else ranked:
        keys = by_name(index, keys)
        splits = sorted({index[k].split or "(none)" for k in keys})
        name = _pipeline_name(index[keys[0]])
        findings.append(
            Finding(
                "pipeline-mismatch",
                f"{len(keys)} entr{'y' if len(keys) == 1 else 'ies'} (split {', '.join(splits)}) "
                f"{'was' if len(keys) == 1 else 'were'} made by pipeline {name} "
                f"{pipeline_hash[:12]}: "
                f"{named([index[k].finding_name for k in keys])}. The cache mixes "
                f"{len(ranked)} pipelines (entries per hash: {counts}); train, val and test "
                "must be preprocessed the same way: rerun `mriprep run` with one pipeline, "
                "or remove the stale entries",
                tuple(sorted(keys)),
                subjects_of(index, keys),
            )
        )
    return findings


def _check_grids(index: dict[str, IndexEntry]) -> list[Finding]:
    """Entries of one pipeline on different grids (shape or spacing): a warning each."""
    findings = []
    by_pipeline: dict[str, dict[tuple, list[str]]] = defaultdict(lambda: defaultdict(list))
    for key, entry in index.items():
        grid = (
            entry.files["image"].shape,
            tuple(round(float(s), 4) for s in entry.spacing or ()),
        )
        by_pipeline[entry.pipeline_hash][grid].append(key)
    for pipeline_hash, grids in sorted(by_pipeline.items()):
        if len(grids) <= 1:
            continue
        ranked = sorted(grids.items(), key=lambda kv: -len(kv[1]))
        desc = "; ".join(
            f"shape {list(shape)} spacing {list(spacing)}: {len(keys)} entries "
            f"(e.g. {index[keys[0]].finding_name})"
            for (shape, spacing), keys in ranked
        )
        minority = sorted(k for _, keys in ranked[1:] for k in keys)
        findings.append(
            Finding(
                "grid-mismatch",
                f"pipeline {pipeline_hash[:12]} produced {len(grids)} different grids ({desc}); "
                "whole-volume batches need one shape (thick slices batch with "
                "padded_size, and the FastSurfer HDF5 export writes a group per size)",
                tuple(minority),
                subjects_of(index, minority),
            )
        )
    return findings

