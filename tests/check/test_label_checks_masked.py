"""The label checks that read the image (``label-misfit``, ``label-off-anatomy``) read
only the voxels the cache marks valid: a slab the pipeline masked (zero-filled, NaN, an
artifact) holds a fill, not the tissue under its labels, and so does the grid beyond a
scan's field of view (there the background is read on the scan's own edge).

Before, a true map of a 1x1x2 mm scan with a zero-filled slab was named as another
person's (separation 0.58 against 2.3 without the slab: the outcome bench's
sub-train03). The made-up heads here are tests/training/fastsurfer_cache.py's.
"""

from __future__ import annotations

import numpy as np

from mriprep import check as chk
from mriprep.check.label_anatomy import MAX_OUTSIDE_MM3, read_anatomy
from mriprep.check.label_fit import read_fit
from mriprep.check.label_table import background_twin, judge_map
from mriprep.qc.structures import label_counts
from mriprep.training.labels import dkt_table
from tests.training.fastsurfer_cache import subject, write_cache

# An axial slab through the middle of the brain (LIA: axis 1 runs inferior), 9 voxels
# of the made-up head's 72.
SLAB = (slice(None), slice(30, 39), slice(None))


def _masked(tensors: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The subject with its slab zero-filled and marked invalid, as mask_slices leaves a
    zero-filled slab."""
    tensors["image"][SLAB] = 0
    tensors["valid"][SLAB] = False
    return tensors


def test_a_masked_slab_leaves_the_fit_as_clean_as_without_it():
    clean = subject(0)
    masked = _masked(subject(0))
    labels = masked["label"]
    assert np.count_nonzero(labels[SLAB]) > 1000  # the slab crosses labelled tissue
    here = read_fit(clean["image"], labels).here
    # Read as tissue, the fill wrecks the separation: the fault the mask mends.
    blind = read_fit(masked["image"], labels)
    assert blind.verdict() is not None and blind.here < 0.8 * here
    seen = read_fit(masked["image"], labels, valid=masked["valid"])
    assert seen.verdict() is None
    assert abs(seen.here - here) < 0.1 * here


def test_labels_in_a_masked_slab_are_not_outside_the_head():
    masked = _masked(subject(0))
    blind = read_anatomy(masked["image"], masked["label"])
    assert blind.outside_mm3 > MAX_OUTSIDE_MM3  # the zero slab looks like air
    seen = read_anatomy(masked["image"], masked["label"], valid=masked["valid"])
    assert seen.outside_mm3 == 0 and seen.verdict() is None


def test_a_z_scored_scan_whose_field_of_view_misses_the_grids_faces_is_judged_on_its_edge():
    """A tight field of view on the template's grid: the faces hold the pipeline's fill for
    voxels the scan never saw (0, a z-scored cache's mean tissue), not air. Read from the
    faces, the background was the cortex's level and clean labels lay "outside the head";
    read from the scan's own edge, none do."""
    tensors = subject(0)
    image, labels = tensors["image"].astype(np.float32), tensors["label"]
    inside = image[labels > 0]
    zscored = (image - inside.mean()) / inside.std()
    found = np.argwhere(labels > 0)
    seen = np.zeros(image.shape, dtype=bool)
    seen[tuple(slice(max(0, lo - 4), hi + 5)
               for lo, hi in zip(found.min(axis=0), found.max(axis=0)))] = True
    cached = np.where(seen, zscored, 0.0).astype(np.float32)
    assert not seen[0].all()  # the scan does not reach the grid's faces
    assert read_anatomy(cached, labels).outside_mm3 > MAX_OUTSIDE_MM3
    judged = read_anatomy(cached, labels, valid=seen)
    assert judged.outside_mm3 == 0 and judged.verdict() is None
    # A stray blob of labels where the scan did see is still named.
    labels = labels.copy()
    corner = tuple(slice(lo - 4, lo + 4) for lo in found.min(axis=0))
    assert seen[corner].all() and not labels[corner].any()
    labels[corner] = 17
    assert read_anatomy(cached, labels, valid=seen).verdict() is not None


def test_labels_in_air_the_scan_did_see_are_still_named():
    """The mask spares only what the scan did not see: a blob of labels in valid air is
    named as before."""
    tensors = _masked(subject(0))
    tensors["label"][:8, :8, :8] = 17
    verdict = read_anatomy(tensors["image"], tensors["label"],
                           valid=tensors["valid"]).verdict()
    assert verdict is not None and "shows no head" in verdict


def test_check_reads_the_cached_mask(tmp_path):
    """Through ``check``: the entry with the masked slab has no label finding, the map
    moved against its image (sub-02) still has its misfit."""
    def edit(index, tensors):
        if index == 1:
            _masked(tensors)
        if index == 2:
            _masked(tensors)
            tensors["label"][:] = np.roll(tensors["label"], 2, axis=0)

    root = write_cache(tmp_path / "c", 3, "train", edit)
    report = chk.check_cache(root, label_table=dkt_table(), workers=1)
    named = {(f.code, sid) for f in report.findings if f.code.startswith("label-")
             for sid in f.subjects}
    assert not {code for code, sid in named if sid == "sub-01"}
    assert ("label-misfit", "sub-02") in named


def test_a_damaged_compressed_mask_is_reported_and_the_check_goes_on(tmp_path):
    """A ``valid`` mask that blosc2 cannot open: the tensor pass names it, the map's fit
    and head are not judged, and the rest of the cache is checked."""
    from mriprep.cache import Cache

    root = write_cache(tmp_path / "c", 2, "train")
    cache = Cache(root)
    entry = next(e for e in cache.entries() if e.subject_id == "sub-00")
    meta = {k: v for k, v in cache.read_meta(entry.key).items()
            if k not in ("files", "key", "format_version")}
    rewritten = cache.write_entry(entry.key, subject(0), meta, replace=True,
                                  compression={"image": "none", "valid": "lz4",
                                               "label": "none"})
    cache.update_index([rewritten.with_split("train")])
    mask = cache.tensor_path(entry.key, "valid")
    assert mask.suffix == ".b2nd"
    mask.write_bytes(mask.read_bytes()[:len(mask.read_bytes()) // 2])

    report = chk.check_cache(root, label_table=dkt_table(), workers=1)
    assert ("tensor-unreadable", "sub-00") in {(f.code, sid) for f in report.findings
                                               for sid in f.subjects}
    assert report.label_table["label_maps"] == 2
    judged = judge_map(cache, entry, background_twin(dkt_table()),
                       label_counts(cache.load_tensor(entry.key, "label")))
    assert judged.fit is None and judged.anatomy is None  # not judged blind
