"""One person in two splits: identity descriptors of registered images, and their search.

A byte-identical copy is caught by its checksum; a rescan of the same person is not: a
new head pose, 5 mm slices, more noise, another scanner's contrast, a skull-stripped
brain or a 0.5 mm re-processing each change almost every voxel. On images already on one
grid (``t1w_mni_rigid`` registers every scan rigidly to MNI152 1 mm) what stays is the
person's anatomy: brain size and shape, ventricles, the position of the large folds,
i.e. how the image deviates from the cohort's average brain at a scale of a few mm.

:func:`identity_descriptor` keeps exactly that, from block means a single pass over the
image makes (:data:`IDENTITY_BLOCKS` per axis, about 6 mm on the MNI grid):

* only the central ellipsoid of the grid (:data:`CORE_RADIUS` of its half-extents),
  which on the MNI grid lies inside the brain: scalp, skull, neck and the field of view
  differ between two scans of one person (stripped or not, the vertex cut or not) and
  are not identity;
* each block mean robustly standardised on the image's own core (median, interquartile
  range) and clipped at :data:`ROBUST_CLIP`: contrast scaling and the z-score's
  reference (head or brain) cancel, and one corrupt voxel moves one block by at most
  the clip, not the whole descriptor.

:func:`find_identity_matches` centres and scales the descriptors on a fixed reference
population (:mod:`mriprep.splits.reference`: synthetic people through ``t1w_mni_rigid``,
shipped with the package), so that a pair's correlation is a property of the pair, not
of whoever else is in the cache (centred on the cohort, a person who made up most of a
small cohort was its average, and their rescans were missed: issue 30). Images on
another grid can only be centred on their own cohort (``centre="cohort"``). It returns
the pairs whose correlation reaches a threshold: every pair up to
:data:`~mriprep.splits.near_duplicates.EXACT_SEARCH_MAX` entries, random-hyperplane LSH
above (on a random sketch of the descriptors); 10,000 entries take seconds either way
(docs/benchmarks.md, row 37).
:func:`shared_deviation` says when a cache is too uniform for correlations to tell
people apart.

What it can promise: on a registered pipeline, rescans of one person are found across
resolutions, poses, noise, contrast and skull stripping (``benchmarks/bench_identity.py``
measures it). On a pipeline that does not register (``conform_1mm`` only reorients and
resamples), two scans of one person are not on one grid: the search still runs there and
finds the same acquisition (a copy, a re-encoding, noise added), but a rescan in another
pose is not found, and the thresholds were not measured on such caches. Identity is
promised on registered pipelines only.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from mriprep.splits.near_duplicates import (
    EXACT_SEARCH_MAX,
    NEAR_DUPLICATE_THRESHOLD,
    _lsh_candidates,
    correlated_pairs,
    normalise_fingerprints,
)
from mriprep.splits.reference import Reference, load_reference

IDENTITY_BLOCKS = 32
# Half-axes of the core ellipsoid, as a share of the grid's half-extents. Measured on the
# calibration set (benchmarks/bench_identity.py: 12 synthetic people x 4-5 scans and
# Colin27 x 4, 54 entries; offline, on 6 mm blocks of the cached images, robust z):
# rescans min / different people max correlation 0.816 / 0.346 at 0.55; 0.824 / 0.337
# at 0.5; 0.826 / 0.349 at 0.6; 0.596 / 0.489 at 0.7 (the core reaches the scalp of the
# smaller heads); the whole grid (no core): rescans down to -0.36, others up to 0.87, as
# bad as the old fingerprint. Blocks of 4 or 8 mm: 0.805 / 0.330 and 0.804 / 0.378.
CORE_RADIUS = 0.55
# Robust z-scores beyond this are clipped: a block holding one voxel of 1e5 counts as a
# very bright block, no more. Clipping at 3 loses nothing else on the calibration set
# (robust z without clipping: rescans min 0.80; ranks instead of z: 0.798 / 0.435).
ROBUST_CLIP = 3.0

# Correlations of the descriptors centred and scaled on the fixed reference population
# (16 synthetic people, mriprep/splits/identity_reference.npz), so that a pair's score does
# not depend on who else is in the cache. Measured by `make bench` identity (section
# "Identity leaks" of docs/benchmarks.md) on 200 cached scans of 50 people: 49 synthetic
# people and Colin27, each scanned 4-5 ways (1 mm, thick and noisy, other contrast,
# skull-stripped, 0.5 mm, each in its own pose). Rescans of one person: 0.772 min, 0.859
# 5th percentile (0.68 min in an earlier set of 5 people in other poses). Different
# people (19,598 pairs): 0.572 max, 0.409 99th percentile; the highest are two pairs of
# look-alike synthetic people, in every acquisition. The reference people among
# themselves: 0.49 max. The same in cohorts of 5, 20 and 200 entries and in cohorts one
# person dominates. So the warning (0.6) names every rescan measured and no pair of
# different people (0.5 named 0.21% of them); the error (0.7) takes every rescan of this
# set and about 95% of the earlier one's, the rest are warnings.
IDENTITY_ERROR = 0.7
IDENTITY_WARNING = NEAR_DUPLICATE_THRESHOLD  # 0.6, `mriprep check --near-threshold`

# Off the reference grid the descriptors can only be centred on their own cohort, whose
# mean is a poor average person in a small cohort and the person themselves in a cohort
# that one person dominates (docs/benchmarks.md, "Identity leaks": cohort-centred rows).
# Below 3 entries there is no average at all: the search's summary says they are too
# few to judge.
COHORT_CENTRED_MIN = 3
# The mean correlation of different ids' deviations from the reference population from
# which a cache is too uniform to judge (shared_deviation). Measured (make bench identity,
# 22 entries of 5 people): cohorts dominated by one person 0.23-0.69; docs/benchmarks.md.
UNIFORM_DEVIATION = 0.3

# LSH above EXACT_SEARCH_MAX entries hashes a random sketch of this many dimensions; the
# sketch moves a correlation rho by about (1 - rho^2) / sqrt(SKETCH_DIMS) (0.032 at 0.7),
# so the hashing threshold is lowered by SKETCH_MARGIN_SD of that.
SKETCH_DIMS = 256
SKETCH_MARGIN_SD = 4.0
# Candidates are filtered on the Hamming distance of this many signature bits (of the
# ~14,000 the bands hold), with a margin of FILTER_MARGIN_SD standard deviations above
# a pair at the hashing threshold (it loses one such pair in 3 million): the filter then
# lets through pairs from a correlation of about 0.43, and compares 7x fewer bits.
FILTER_BITS = 2048
FILTER_MARGIN_SD = 5.0


def core_mask(shape: tuple[int, ...], radius: float = CORE_RADIUS) -> np.ndarray:
    """The blocks of a ``shape`` grid of blocks whose centres lie inside the central
    ellipsoid with half-axes ``radius`` times the grid's half-extents."""
    axes = [(np.arange(n) + 0.5) / n * 2.0 - 1.0 for n in shape]
    grids = np.meshgrid(*axes, indexing="ij", sparse=True)
    return sum(g * g for g in grids) <= radius * radius


def identity_descriptor(block_means: np.ndarray) -> np.ndarray | None:
    """The identity descriptor of one image from its grid of block means (3-D).

    Returns the core blocks (:func:`core_mask`), robustly standardised on the image's
    own core and clipped (float32), or None when the core holds no contrast (a constant
    image has no anatomy to identify).
    """
    core = np.asarray(block_means, dtype=np.float64)[core_mask(block_means.shape)]
    median = np.median(core)
    low, high = np.percentile(core, [25, 75])
    if not high > low:
        return None
    z = (core - median) / (high - low)
    return np.clip(z, -ROBUST_CLIP, ROBUST_CLIP).astype(np.float32)


def find_identity_matches(
    descriptors: np.ndarray,
    threshold: float = IDENTITY_WARNING,
    *,
    centre: str | Reference = "reference",
    method: str = "auto",
    seed: int = 0,
    miss_probability: float = 1e-4,
    info: dict[str, Any] | None = None,
) -> list[tuple[int, int, float]]:
    """Pairs of rows whose descriptors, as deviations from an average person, correlate
    at or above ``threshold``.

    Parameters
    ----------
    descriptors : ndarray, shape (n, d)
        One :func:`identity_descriptor` per image, all of one pipeline and grid.
    threshold : float
        Correlation from which a pair is returned (:data:`IDENTITY_WARNING`).
    centre : "reference", "cohort" or Reference
        The average person: ``"reference"`` (the shipped population,
        :func:`~mriprep.splits.reference.load_reference`; the thresholds were measured
        so, and a pair's correlation depends on the pair only) or another
        :class:`~mriprep.splits.reference.Reference`, for images on its grid;
        ``"cohort"``, the rows' own mean, for images on another grid (at least 3 rows;
        a person making up much of the cohort then becomes the average and is missed).
    method : {"auto", "exact", "lsh"}
        ``exact`` compares every pair (``auto`` up to
        :data:`~mriprep.splits.near_duplicates.EXACT_SEARCH_MAX` rows). ``lsh`` hashes a
        random sketch of the rows: a pair at ``max(threshold, IDENTITY_ERROR)`` or above
        is missed with probability below ``miss_probability``; a pair between
        ``threshold`` and :data:`IDENTITY_ERROR` is returned only if its hashes collide
        (``info["lsh_sure_from"]`` says from where the bound holds). At a correlation of
        0.5 no hashing scheme beats comparing every pair, and at 10,000 entries that is
        50 million comparisons. Every returned correlation is exact.
    seed : int
        Seed of the sketch and the hyperplanes: the same input gives the same answer.
    miss_probability : float
    info : dict, optional
        Filled with the method, the entries, the pairs compared and the LSH parameters.

    Returns
    -------
    list of (i, j, correlation)
        Row indices with i < j, by decreasing correlation.
    """
    sure = max(threshold, IDENTITY_ERROR)
    standardise = _standardiser(centre)

    def lsh(vectors: np.ndarray, info: dict[str, Any]) -> np.ndarray:
        info["lsh_sure_from"] = sure
        return _lsh_candidates(_sketch(vectors, seed), _sketch_threshold(sure), seed,
                               miss_probability, info, bits=_band_bits(len(vectors)),
                               filter_bits=FILTER_BITS, margin_sd=FILTER_MARGIN_SD)

    return correlated_pairs(descriptors, threshold, method, info, lsh,
                            what="identity search", standardise=standardise)


def _standardiser(centre: str | Reference):
    if isinstance(centre, Reference):
        return centre.standardise
    if centre == "reference":
        return load_reference().standardise
    if centre == "cohort":
        return None
    raise ValueError(f"unknown identity centre {centre!r}; use 'reference', 'cohort' or a "
                     "mriprep.splits.reference.Reference")


def shared_deviation(descriptors: np.ndarray, groups: np.ndarray | None = None,
                     centre: str | Reference = "reference") -> float:
    """The mean correlation of the rows' deviations from the average person, over the
    pairs of rows in different ``groups`` (one label per row, e.g. its subject id: two
    scans of one subject are not compared; every pair by default).

    Different people deviate each their own way: about 0 (measured in
    ``benchmarks/bench_identity.py``). A cache whose images all deviate alike, one
    person under most of its ids, or images that all differ from the reference
    population the same way (another contrast, scanner or population), is too uniform
    for a correlation to tell people apart: :data:`UNIFORM_DEVIATION` says from where.

    The sum over pairs comes from the rows' sums, not from an n x n matrix, so that a
    cache of tens of thousands of entries takes memory in proportion to its rows: over
    the pairs of different groups, the dot products sum to half of |sum of all rows|^2
    minus the sum over groups of |sum of the group's rows|^2.
    """
    vectors, usable = normalise_fingerprints(descriptors, _standardiser(centre))
    rows = vectors[usable].astype(np.float64)
    labels = np.arange(len(vectors)) if groups is None else np.asarray(groups)
    _, group_of = np.unique(labels[usable], return_inverse=True)
    sizes = np.bincount(group_of).astype(np.float64)
    pairs = (len(rows) ** 2 - float(sizes @ sizes)) / 2
    if pairs <= 0:
        return 0.0
    order = np.argsort(group_of, kind="stable")
    starts = np.r_[0, np.cumsum(sizes[:-1])].astype(np.intp)
    group_sums = np.add.reduceat(rows[order], starts, axis=0)
    total = rows.sum(axis=0)
    across = (total @ total - float(np.einsum("ij,ij->", group_sums, group_sums))) / 2
    return float(across / pairs)


def _sketch(vectors: np.ndarray, seed: int) -> np.ndarray:
    """Unit rows of a Gaussian random projection to :data:`SKETCH_DIMS` dimensions: the
    hyperplanes then cost 256 instead of thousands of multiplications each."""
    d = vectors.shape[1]
    if d <= SKETCH_DIMS:
        return vectors
    projection = np.random.default_rng([seed, 1]).standard_normal((d, SKETCH_DIMS))
    sketch = vectors @ projection.astype(np.float32)
    sketch /= np.maximum(np.linalg.norm(sketch, axis=1, keepdims=True), 1e-12)
    return sketch


def _sketch_threshold(threshold: float) -> float:
    return threshold - SKETCH_MARGIN_SD * (1.0 - threshold**2) / math.sqrt(SKETCH_DIMS)


def _band_bits(n: int) -> int:
    # Fewer bits per band than the near-duplicate search (log2 n + 4): at a correlation
    # of 0.6 a band of 18 bits rarely agrees, and the bands needed (and hyperplanes)
    # grow as 1/p^bits. With log2(n) - 1 bits, chance pairs per band stay about 2n.
    return max(8, int(math.ceil(math.log2(n))) - 1)
