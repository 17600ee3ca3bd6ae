"""Robust statistics and foreground masks shared by the stages.

Kept apart from any one stage so that sanitize, mask_slices and normalize agree on what
the foreground of a scan is and compute their percentiles the same (fast, exact) way,
and so that resample and validate list label values the same way.
"""

from __future__ import annotations

import numpy as np

# Below this many values a plain partition is the fastest exact selection.
_DIRECT_SELECTION = 1 << 16
# Values sampled (with a fixed stride) to bracket the wanted ranks.
_SAMPLE_SIZE = 1 << 14
# Label maps whose values span at most this many integers are listed value by value
# (one comparison pass each) rather than by np.unique (hashing every voxel).
_FEW_LABELS = 16
# Half-width of a bracket, in standard deviations of a sample rank's position: the
# sample's ranks are binomial, so a wanted rank escapes its bracket with a probability
# far below 1e-6, and then the selection falls back to a full partition anyway.
_BRACKET_SIGMAS = 6.0


def order_statistics(values: np.ndarray, ranks) -> np.ndarray:
    """The values at ``ranks`` (0-based) of the sorted ``values``, without sorting.

    Exactly ``np.sort(values.ravel())[ranks]``. A plain ``np.partition`` of a whole 1 mm
    volume costs several passes over it; instead a strided sample of ``_SAMPLE_SIZE``
    values brackets each wanted rank, one pass counts the values below the bracket and
    another collects those inside it, and only that small set is partitioned. When a
    rank falls outside its bracket (unlikely, see ``_BRACKET_SIGMAS``), the whole array
    is partitioned: the result never depends on the sample.

    Parameters
    ----------
    values : ndarray
        Any shape and real dtype, no NaN (the comparisons would not order it).
    ranks : sequence of int
        Ranks in ``[0, values.size)``.

    Returns
    -------
    ndarray
        One value per rank, in ``values``' dtype.

    Examples
    --------
    >>> order_statistics(np.array([5.0, 1.0, 4.0, 2.0, 3.0]), [0, 2, 4])
    array([1., 3., 5.])
    """
    values = np.ravel(values)
    ranks = np.asarray(ranks, dtype=np.intp).ravel()
    n = values.size
    if ranks.size and (ranks.min() < 0 or ranks.max() >= n):
        raise IndexError(f"ranks {ranks.tolist()} outside [0, {n})")
    if n <= _DIRECT_SELECTION:
        return np.partition(values, np.unique(ranks))[ranks]
    step = n // _SAMPLE_SIZE
    sample = np.sort(values[::step])
    m = sample.size
    found = {}
    for group in _rank_groups(np.unique(ranks), n, m):
        selected = _select_in_bracket(values, sample, group, n)
        if selected is None:
            selected = np.partition(values, group)[group]
        found.update(zip(group.tolist(), selected))
    return np.array([found[r] for r in ranks.tolist()], dtype=values.dtype)


def _rank_groups(ranks: np.ndarray, n: int, m: int) -> list[np.ndarray]:
    """Ranks whose brackets would overlap share one (e.g. the two around a percentile)."""
    groups: list[list[int]] = []
    for r in ranks.tolist():
        if groups and (r - groups[-1][-1]) * m / n < 2 * _bracket_margin(r, n, m):
            groups[-1].append(r)
        else:
            groups.append([r])
    return [np.asarray(g, dtype=np.intp) for g in groups]


def _bracket_margin(rank: int, n: int, m: int) -> int:
    share = rank / n
    return int(np.ceil(_BRACKET_SIGMAS * np.sqrt(m * share * (1 - share)))) + 2


def _select_in_bracket(values, sample, group, n) -> np.ndarray | None:
    """The values at the ``group`` ranks if the sample brackets them, else None."""
    m = sample.size
    low_pos = int(np.floor(group[0] * m / n)) - _bracket_margin(int(group[0]), n, m)
    high_pos = int(np.ceil(group[-1] * m / n)) + _bracket_margin(int(group[-1]), n, m)
    inside, below = None, 0
    if low_pos > 0:
        inside = values >= sample[low_pos]
        below = n - int(np.count_nonzero(inside))
    if high_pos < m - 1:
        at_most = values <= sample[high_pos]
        inside = at_most if inside is None else np.logical_and(inside, at_most, out=inside)
    candidates = values if inside is None else values[inside]
    local = group - below
    if local[0] < 0 or local[-1] >= candidates.size:
        return None
    return np.partition(candidates, local)[local]


def percentiles(values: np.ndarray, q, method: str = "linear") -> np.ndarray:
    """``np.percentile(values.astype(np.float64), q, method=method)``, bit for bit.

    The order statistics come from :func:`order_statistics` in ``values``' own dtype (a
    float32 volume is never copied to float64) and are interpolated in float64 exactly as
    NumPy does.

    Parameters
    ----------
    values : ndarray
        Finite values, any shape, at least one.
    q : sequence of float
        Percentiles in [0, 100].
    method : {"linear", "lower"}
        NumPy's default interpolation, or the lower of the two neighbouring values.

    Returns
    -------
    ndarray of float64, one value per percentile.

    Examples
    --------
    >>> percentiles(np.arange(11, dtype=np.float32), [25.0, 50.0])
    array([2.5, 5. ])
    """
    n = np.size(values)
    if n == 0:
        raise ValueError("percentiles of an empty array")
    quantiles = np.true_divide(np.asarray(q, dtype=np.float64), 100)
    virtual = (n - 1) * quantiles
    previous = np.floor(virtual)
    lower_ranks = previous.astype(np.intp)
    if method == "lower":
        return order_statistics(values, lower_ranks).astype(np.float64)
    if method != "linear":
        raise ValueError(f"method must be 'linear' or 'lower', got {method!r}")
    upper_ranks = np.minimum(lower_ranks + 1, n - 1)
    at_end = virtual >= n - 1
    lower_ranks = np.where(at_end, n - 1, lower_ranks)
    stats = order_statistics(values, np.concatenate([lower_ranks, upper_ranks]))
    a = stats[: quantiles.size].astype(np.float64)
    b = stats[quantiles.size:].astype(np.float64)
    gamma = virtual - previous
    # NumPy's lerp: from the nearer end, so that a weight of 1 returns b exactly.
    difference = b - a
    return np.where(gamma >= 0.5, b - difference * (1 - gamma), a + difference * gamma)


def all_finite(data: np.ndarray) -> bool:
    """Whether every value of ``data`` is finite, in two reductions and no temporary:
    NaN and +/-Inf reach the extremes (a voxel-wise mask is built only when one does)."""
    with np.errstate(invalid="ignore"):  # some builds flag a NaN met by min/max
        return data.size == 0 or bool(np.isfinite(data.min()) and np.isfinite(data.max()))


def robust_threshold(values: np.ndarray) -> float:
    """Foreground threshold of a set of intensities: 10% up the 2-98 percentile range.

    The rule FSL's BET uses to separate head from background; robust to the few bright
    or dark outliers a raw scan contains.
    """
    if values.size == 0:
        return 0.0
    p2, p98 = percentiles(values, [2.0, 98.0])
    return float(p2 + 0.1 * (p98 - p2))


def foreground_mask(data: np.ndarray, usable: np.ndarray) -> np.ndarray:
    """Voxels that are usable and brighter than :func:`robust_threshold` of usable voxels.

    Parameters
    ----------
    data : ndarray
        Intensities; values outside ``usable`` are ignored (they may be NaN).
    usable : ndarray of bool
        Which voxels may be looked at (finite, not replaced, valid).

    Returns
    -------
    ndarray of bool
        The foreground, a subset of ``usable``; empty when nothing is usable.
    """
    foreground = np.zeros(data.shape, dtype=bool)
    values = data[usable]
    if values.size:
        foreground[usable] = values > robust_threshold(values)
    return foreground


def label_values(label: np.ndarray) -> list[int]:
    """The sorted distinct values of an integer label map, as ``np.unique`` gives them.

    Tissue maps and masks hold a few small integers: after a min/max pass each candidate
    value costs one comparison pass, several times faster than hashing every voxel of a
    256^3 grid. Wider ranges (FreeSurfer's aseg) go through ``np.unique``.

    Examples
    --------
    >>> label_values(np.array([[0, 2], [2, 3]], dtype=np.int16))
    [0, 2, 3]
    """
    if label.size == 0:
        return []
    lowest, highest = int(label.min()), int(label.max())
    if highest - lowest >= _FEW_LABELS:
        return np.unique(label).tolist()
    return [v for v in range(lowest, highest + 1) if v in (lowest, highest)
            or bool((label == v).any())]
