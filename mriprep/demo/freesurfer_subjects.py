"""A small ``SUBJECTS_DIR`` as FreeSurfer and FastSurfer leave one, for the demo, the
tests and ``make bench`` (fastsurfer).

Each subject is a synthetic person (:func:`mriprep.demo.freesurfer_cohort.scanned_person`,
with the medial wall's "unknown" cortex that FreeSurfer leaves), conformed the way
FastSurfer conforms (:func:`mriprep.demo.fastsurfer_conform.fastsurfer_conform`: 256^3,
1 mm, LIA, uint8), its labels pulled onto that grid by nearest neighbour. What
``<id>/mri/`` holds depends on the subject's kind:

``"dkt"``      ``orig.mgz``, ``aparc.DKTatlas+aseg.mgz`` and ``aseg.mgz``: a FastSurfer or
               FreeSurfer 7 subject.
``"desikan"``  ``orig.mgz``, ``aparc+aseg.mgz`` and ``aseg.mgz``: FreeSurfer's default
               Desikan atlas, with its three parcels per hemisphere DKT dropped
               (bankssts 1001/2001, frontalpole 1032/2032, temporalpole 1033/2033) and
               the corpus callosum 251-255 in the midline white matter.
``"aseg"``     ``orig.mgz`` and ``aseg.mgz`` only: all cortex one label (3/42), no
               parcels.

Only the label numbering is FreeSurfer's; the regions are coarse boxes
(:mod:`mriprep.demo.freesurfer_labels`).
"""

from __future__ import annotations

from pathlib import Path

import nibabel as nib
import numpy as np
from nibabel.affines import apply_affine
from scipy import ndimage

from mriprep.demo.fastsurfer_conform import fastsurfer_conform
from mriprep.demo.freesurfer_cohort import scanned_person

KINDS = ("dkt", "desikan", "aseg")
# Desikan parcels carved out of DKT ones: (DKT parcels, the Desikan parcel, which part).
_DESIKAN = (
    ((1030,), 1001, lambda xyz: xyz[:, 1] < -30),                 # bankssts
    ((1027, 1028), 1032, lambda xyz: xyz[:, 1] > 50),             # frontalpole
    ((1030, 1015, 1009), 1033, lambda xyz: xyz[:, 1] > 0),        # temporalpole
)


def build_subjects_dir(root: str | Path, kinds=KINDS, seed: int = 0) -> Path:
    """Write one subject per entry of ``kinds`` into ``root`` (named ``subj-01``, ...);
    return ``root``."""
    root = Path(root)
    for i, kind in enumerate(kinds):
        if kind not in KINDS:
            raise ValueError(f"subject kind {kind!r}; choose from {KINDS}")
        image, labels, affine = scanned_person(seed, 20 + i, medial_unknown=True)
        orig, orig_affine = fastsurfer_conform(image, affine)
        to_scan = np.linalg.inv(affine) @ orig_affine
        aparc = ndimage.affine_transform(labels, to_scan[:3, :3], to_scan[:3, 3],
                                         output_shape=orig.shape, order=0, mode="constant",
                                         cval=0).astype(np.int32)
        mri = root / f"subj-{i + 1:02d}" / "mri"
        mri.mkdir(parents=True, exist_ok=True)
        nib.save(nib.MGHImage(orig, orig_affine), mri / "orig.mgz")
        aseg = _as_aseg(aparc)
        nib.save(nib.MGHImage(aseg, orig_affine), mri / "aseg.mgz")
        if kind == "dkt":
            nib.save(nib.MGHImage(aparc, orig_affine), mri / "aparc.DKTatlas+aseg.mgz")
        elif kind == "desikan":
            nib.save(nib.MGHImage(_as_desikan(aparc, orig_affine), orig_affine),
                     mri / "aparc+aseg.mgz")
    return root


def _as_aseg(aparc: np.ndarray) -> np.ndarray:
    """Every cortical parcel as the hemisphere's cortex, as aseg.mgz holds it."""
    aseg = aparc.copy()
    aseg[(aparc >= 1000) & (aparc < 2000)] = 3
    aseg[(aparc >= 2000) & (aparc < 3000)] = 42
    return aseg


def _as_desikan(aparc: np.ndarray, affine: np.ndarray) -> np.ndarray:
    out = aparc.copy()
    for dkt, desikan, part in _DESIKAN:
        for offset in (0, 1000):
            where = np.argwhere(np.isin(aparc, [p + offset for p in dkt]))
            chosen = where[part(apply_affine(affine, where))]
            out[tuple(chosen.T)] = desikan + offset
    # The corpus callosum: the midline white matter between the ventricles' top and the
    # cingulate, in five parts from back (251) to front (255).
    white = np.argwhere(np.isin(aparc, (2, 41)))
    xyz = apply_affine(affine, white)
    band = (np.abs(xyz[:, 0]) < 4) & (xyz[:, 1] > -35) & (xyz[:, 1] < 30) & \
        (xyz[:, 2] > 5) & (xyz[:, 2] < 25)
    part = np.clip(((xyz[band, 1] + 35) / 13).astype(int), 0, 4)
    out[tuple(white[band].T)] = 251 + part
    return out
