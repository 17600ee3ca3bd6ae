"""A small checked cache with flagged entries, for the tests of the kept findings and of
what reads them (exclude_flagged=, the QC report).

Three FreeSurfer-numbered subjects (tests/training/fastsurfer_cache.py, 72^3): sub-01
with left and right hippocampus swapped (label-side-swap, an error), sub-02's map moved
two voxels against its image (label-misfit, a warning), sub-00 clean.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mriprep.cache import Cache
from tests.training.fastsurfer_cache import subject, write_cache


def swap_hippocampus(labels: np.ndarray) -> None:
    left, right = labels == 17, labels == 53
    labels[left], labels[right] = 53, 17


def moved(labels: np.ndarray) -> None:
    labels[:] = np.roll(labels, 2, axis=1)


EDITS = {1: swap_hippocampus, 2: moved}


def flagged_cache(root: Path, check: bool = False) -> Path:
    """The cache; with ``check`` checked with the shipped DKT table (its record kept)."""
    def edit(index, tensors):
        if index in EDITS:
            EDITS[index](tensors["label"])
    write_cache(root, 3, "train", edit)
    if check:
        from mriprep import check as chk
        from mriprep.training.labels import dkt_table

        chk.check_cache(root, label_table=dkt_table(), workers=1)
    return Path(root)


def rebuild(root: Path, index: int, edit=None) -> None:
    """Write sub-0<index>'s entry again under its key (as `mriprep run --force` does),
    changed by ``edit`` (default: as clean as sub-00)."""
    cache = Cache(root)
    tensors = subject(index)
    if edit is not None:
        edit(tensors["label"])
    old = next(e for e in cache.entries() if e.subject_id == f"sub-{index:02d}")
    meta = {k: v for k, v in cache.read_meta(old.key).items()
            if k not in ("files", "key", "format_version")}
    cache.update_index([cache.write_entry(old.key, tensors, meta, replace=True)
                        .with_split(old.split)])
