"""The fixed population identity descriptors are measured against.

An identity descriptor (:func:`mriprep.splits.identity.identity_descriptor`) says how an
image's brain core looks; what identifies a person is how that differs from an average
person. Centred on the cohort being checked, a person who makes up much of a small cohort
*is* the average, and their rescans lose what makes them alike (issue 30: Colin27 in
train, its 0.5 mm copy in val and its skull-stripped copy in test, in a cache of 6, were
not paired). Centred and scaled on this fixed population instead, a pair's correlation
depends on the pair only, whatever else the cache holds.

The population is :data:`~mriprep.demo.identity_reference.REFERENCE_PEOPLE` synthetic
people through ``t1w_mni_rigid``, made by :mod:`mriprep.demo.identity_reference` and
shipped as ``identity_reference.npz`` (:data:`REFERENCE_PATH`, its SHA-256 in
:data:`REFERENCE_SHA256`). It describes images on the grid they were made on (MNI152
1 mm, 197x233x189): :meth:`Reference.fits` says whether a cache's grid is that one.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mriprep.core.hashing import sha256_file

REFERENCE_PATH = Path(__file__).with_name("identity_reference.npz")
# Written by `python -m mriprep.demo.identity_reference`, which prints the new value;
# tests/splits/test_identity_reference.py fails when the file and this differ.
REFERENCE_SHA256 = "96619cf9c1bb2efe8f1d0dedaacac33802580f7df09410135e71e3b56e0470d1"
# Each block's spread over the reference people is shrunk half way (in variance) to the
# median block's: with 16 people one block's standard deviation is known to about +-18%,
# and an unshrunk division would weigh the blocks that happened to vary little in the
# reference most. Measured in benchmarks/bench_identity.py (docs/benchmarks.md, identity).
SCALE_SHRINK = 0.5
# Two grids are one when every corner of their field of view is within this many mm
# (a sixth of a 6 mm block): the reference's blocks then cover the same brain.
GRID_TOLERANCE_MM = 1.0


@dataclass(frozen=True)
class Reference:
    """The centre and per-block scale of the reference population's descriptors, and the
    grid (``shape``, ``affine``) they belong to."""

    centre: np.ndarray
    scale: np.ndarray
    shape: tuple[int, ...]
    affine: np.ndarray
    people: int
    pipeline: str

    def fits(self, shape, affine) -> bool:
        """Whether images of ``shape`` with ``affine`` lie on the reference's grid."""
        if affine is None or tuple(int(n) for n in shape) != self.shape:
            return False
        corners = np.array([[i, j, k, 1.0] for i in (0, 1) for j in (0, 1) for k in (0, 1)])
        corners[:, :3] *= np.array(self.shape) - 1
        ours, theirs = corners @ np.asarray(affine).T, corners @ self.affine.T
        return bool(np.abs(ours - theirs).max() <= GRID_TOLERANCE_MM)

    def standardise(self, descriptors: np.ndarray) -> np.ndarray:
        """Descriptors as deviations from the reference person, in reference spreads
        (float64 rows; :func:`~mriprep.splits.near_duplicates.normalise_fingerprints`
        makes their correlations)."""
        d = np.asarray(descriptors, dtype=np.float64)
        if d.ndim != 2 or d.shape[1] != self.centre.size:
            raise ValueError(
                f"identity descriptors of {d.shape[-1]} values cannot be compared with the "
                f"reference population ({self.centre.size} values, {REFERENCE_PATH}); "
                "make them with mriprep.check.tensors.scan_tensor_file, or pass "
                "centre='cohort'")
        return (d - self.centre) / self.scale


def reference_from_arrays(arrays) -> Reference:
    """The :class:`Reference` of the arrays :func:`~mriprep.demo.identity_reference.
    build_reference` returns (or ``identity_reference.npz`` holds)."""
    descriptors = np.asarray(arrays["descriptors"], dtype=np.float64)
    spread = descriptors.std(axis=0, ddof=1)
    typical = float(np.median(spread))
    scale = np.sqrt((1.0 - SCALE_SHRINK) * spread**2 + SCALE_SHRINK * typical**2)
    return Reference(
        centre=descriptors.mean(axis=0),
        scale=np.maximum(scale, 1e-6 * max(typical, 1e-12)),
        shape=tuple(int(n) for n in arrays["shape"]),
        affine=np.asarray(arrays["affine"], dtype=np.float64),
        people=len(descriptors),
        pipeline=str(arrays["pipeline"][0]),
    )


def reference_sha256(path: Path = REFERENCE_PATH) -> str:
    return sha256_file(path)


@functools.lru_cache(maxsize=1)
def load_reference() -> Reference:
    """The shipped reference population (read once per process)."""
    try:
        with np.load(REFERENCE_PATH, allow_pickle=False) as arrays:
            return reference_from_arrays(arrays)
    except (OSError, KeyError, ValueError) as exc:
        raise RuntimeError(
            f"the identity reference {REFERENCE_PATH} cannot be read ({exc}); reinstall "
            "mriprep, or rebuild it with `python -m mriprep.demo.identity_reference`"
        ) from exc
