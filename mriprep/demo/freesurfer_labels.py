"""Label maps numbered as FreeSurfer numbers them, for the demo and the tests.

FastSurfer-style training needs ``aparc.DKTatlas+aseg``-like maps: about 40-90 sparse
values 0..2035. No such map of a real brain may be shipped here, so one is made from the
demo's CSF/GM/WM tissue map, split by hemisphere and region in the anatomy's own
millimetre space (MNI-like; a synthetic person is the template warped, so the regions
move with the person when the map is made before the person is scanned):

* left/right by the sign of x (RAS: x < 0 is left);
* white matter -> 2/41; cerebellum (below and behind) -> 7/46 (WM) and 8/47 (GM);
  brain stem -> 16; deep grey matter -> thalamus 10/49, caudate 11/50, putamen 12/51;
  hippocampus 17/53;
* CSF near the centre -> lateral ventricles 4/43, elsewhere -> CSF 24;
* cortical grey matter -> the nearest of :data:`PARCEL_SEEDS` in its hemisphere (the
  31 DKT parcels 10xx / 20xx, medial and lateral ones);
* the small structures of FastSurfer's DKT table as boxes of any brain tissue:
  pallidum 13/52, amygdala 18/54, accumbens 26/58, ventral DC 28/60, inferior lateral
  ventricles 5/44, choroid plexus 31/63, 3rd and 4th ventricle 14/15, and a few white
  matter hypointensities 77, so that every class of the table occurs;
* with ``medial_unknown``, the cortex of the medial wall above the corpus callosum ->
  "unknown" 1000 / 2000, where FreeSurfer's own maps leave it: the voxels FastSurfer's
  rules fill from the neighbouring parcels.

The boxes are coarse: the maps have FreeSurfer's numbers and FastSurfer's class
structure (left/right pairs, medial parcels, cortex above 1000), not its anatomy.
"""

from __future__ import annotations

import numpy as np
from nibabel.affines import apply_affine

CSF, GM, WM = 1, 2, 3  # the demo's tissue classes (mriprep.demo.anatomy)

# DKT parcel (left-hemisphere number) -> a seed point in MNI mm with x > 0 (mirrored for
# the left hemisphere). Medial ones first: those FastSurfer keeps lateralised.
PARCEL_SEEDS = {
    1002: (6, 20, 28),     # caudal anterior cingulate
    1005: (8, -82, 20),    # cuneus
    1013: (12, -70, -4),   # lingual
    1025: (8, -60, 40),    # precuneus
    1028: (18, 30, 50),    # superior frontal
    1024: (38, -12, 55),   # precentral
    1022: (40, -30, 55),   # postcentral
    1029: (28, -60, 55),   # superior parietal
    1030: (55, -15, 2),    # superior temporal
    1015: (60, -35, -8),   # middle temporal
    1009: (52, -30, -28),  # inferior temporal
    1011: (38, -85, 0),    # lateral occipital
    1035: (38, 0, 5),      # insula
    1027: (36, 45, 20),    # rostral middle frontal
    1012: (28, 30, -15),   # lateral orbitofrontal
    1007: (36, -50, -18),  # fusiform
    1031: (55, -40, 35),   # supramarginal
    1003: (36, 12, 48),    # caudal middle frontal
    1006: (24, -8, -32),   # entorhinal
    1008: (44, -66, 34),   # inferior parietal
    1010: (8, -46, 14),    # isthmus cingulate
    1014: (6, 42, -14),    # medial orbitofrontal
    1016: (24, -30, -16),  # parahippocampal
    1017: (8, -26, 62),    # paracentral
    1018: (50, 12, 14),    # pars opercularis
    1019: (44, 36, -10),   # pars orbitalis
    1020: (50, 28, 4),     # pars triangularis
    1021: (10, -86, 6),    # pericalcarine
    1023: (6, -16, 38),    # posterior cingulate
    1026: (6, 38, 4),      # rostral anterior cingulate
    1034: (44, -22, 10),   # transverse temporal
}


def _box(xyz: np.ndarray, x=None, y=None, z=None) -> np.ndarray:
    keep = np.ones(len(xyz), dtype=bool)
    for axis, bounds in enumerate((x, y, z)):
        if bounds is not None:
            keep &= (xyz[:, axis] >= bounds[0]) & (xyz[:, axis] < bounds[1])
    return keep


def freesurfer_labels(tissue: np.ndarray, affine: np.ndarray,
                      medial_unknown: bool = False) -> np.ndarray:
    """FreeSurfer-numbered labels (int16) of a CSF/GM/WM map whose voxels ``affine``
    places in MNI-like millimetres (module docstring)."""
    out = np.zeros(tissue.shape, dtype=np.int16)
    ijk = np.argwhere(tissue > 0)
    if len(ijk) == 0:
        return out
    t = tissue[tuple(ijk.T)]
    xyz = apply_affine(affine, ijk)
    right = xyz[:, 0] >= 0
    ax = np.abs(xyz[:, 0])
    lab = np.zeros(len(t), dtype=np.int16)

    def side(mask, left_id, right_id):
        lab[mask & ~right] = left_id
        lab[mask & right] = right_id

    # Cortex first; later rules overwrite it where a structure lies.
    gm = t == GM
    seeds = np.array(list(PARCEL_SEEDS.values()), dtype=float)
    ids = np.array(list(PARCEL_SEEDS), dtype=np.int16)
    mirrored = np.c_[ax, xyz[:, 1:]]
    nearest = np.argmin(((mirrored[gm, None, :] - seeds[None]) ** 2).sum(-1), axis=1)
    lab[gm] = ids[nearest] + np.where(right[gm], 1000, 0).astype(np.int16)
    if medial_unknown:
        wall = gm & (ax < 10) & _box(xyz, y=(-30, 25), z=(5, 30))
        side(wall, 1000, 2000)
    side(t == WM, 2, 41)
    csf = t == CSF
    lab[csf] = 24
    side(csf & _box(xyz, x=(-25, 25), y=(-40, 25), z=(-5, 30)) & (ax > 2), 4, 43)
    deep = (t == GM) & _box(xyz, x=(-30, 30), y=(-35, 25), z=(-12, 22))
    side(deep & (ax < 20) & (xyz[:, 1] < -5), 10, 49)
    side(deep & (ax < 20) & (xyz[:, 1] >= 0) & (xyz[:, 2] > 5), 11, 50)
    side(deep & (ax >= 18) & (xyz[:, 1] > -15), 12, 51)
    side((t == GM) & _box(xyz, y=(-40, -10), z=(-25, -8)) & (ax > 20) & (ax < 38), 17, 53)
    cerebellum = _box(xyz, y=(-100, -40), z=(-80, -20))
    side(cerebellum & (t == WM), 7, 46)
    side(cerebellum & (t == GM), 8, 47)
    stem = _box(xyz, x=(-10, 10), y=(-40, -15), z=(-80, -15)) & (t != CSF)
    lab[stem] = 16
    brain = t > 0
    side(brain & (ax >= 14) & (ax < 19) & _box(xyz, y=(-8, 4), z=(-4, 4)), 13, 52)
    side(brain & (ax >= 18) & (ax < 28) & _box(xyz, y=(-8, 0), z=(-24, -14)), 18, 54)
    side(brain & (ax >= 6) & (ax < 12) & _box(xyz, y=(8, 16), z=(-10, -2)), 26, 58)
    side(brain & (ax >= 4) & (ax < 14) & _box(xyz, y=(-24, -12), z=(-14, -6)), 28, 60)
    side(brain & (ax >= 28) & (ax < 32) & _box(xyz, y=(-30, -20), z=(-14, -8)), 5, 44)
    side(brain & (ax >= 12) & (ax < 16) & _box(xyz, y=(-32, -26), z=(14, 20)), 31, 63)
    lab[brain & (ax < 2) & _box(xyz, y=(-20, -4), z=(-2, 10))] = 14
    lab[brain & (ax < 4) & _box(xyz, y=(-48, -42), z=(-36, -28))] = 15
    for centre in ((24, 4, 26), (-26, -18, 30), (28, -40, 24)):
        lab[brain & (((xyz - centre) ** 2).sum(axis=1) <= 4)] = 77
    out[tuple(ijk.T)] = lab
    return out
