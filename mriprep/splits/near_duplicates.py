"""Near-duplicate images among many, on small fingerprints, without comparing every pair.

The same scan re-encoded, re-registered or lightly edited no longer matches byte for byte
but stays almost the same image. :func:`find_near_duplicates` takes one fingerprint per
image (e.g. its 8x8x8 block means), centres them on the cohort
(:func:`normalise_fingerprints`) and returns every pair whose correlation reaches the
threshold (:data:`NEAR_DUPLICATE_THRESHOLD` by default), each with its exact correlation:
nothing below the threshold is ever reported. Up to :data:`EXACT_SEARCH_MAX` images every
pair is compared, by blocked matrix products; above, random-hyperplane LSH compares only
the pairs whose hashes collide, and misses a pair at the threshold with a probability the
caller bounds. The same input and seed always give the same pairs.
"""

from __future__ import annotations

import math
from typing import Any, Callable

import numpy as np

# The default of `mriprep check --near-threshold`: the warning threshold of the identity
# search (measured where it is used, mriprep.splits.identity.IDENTITY_WARNING). It was
# 0.95 on 8x8x8 block means, which told neither rescans nor different people apart, then
# 0.5, which named 0.21% of the pairs of different people among 49 (see there).
NEAR_DUPLICATE_THRESHOLD = 0.6
# At the thresholds the checks use (0.6 to 0.7) the hashing needs so many bands that LSH
# grows nearly as n^2 itself: on the identity search, every pair by matrix products was
# the faster at every size measured, up to this one (docs/benchmarks.md, row 37). Past
# it LSH is the fallback, its speed unmeasured and its projections large in memory.
EXACT_SEARCH_MAX = 30_000


def normalise_fingerprints(
    fingerprints: np.ndarray,
    standardise: Callable[[np.ndarray], np.ndarray] | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Centre fingerprints and scale each to zero mean, unit norm.

    Registered brains share most of their coarse anatomy, so the raw block means of two
    different people correlate highly; only the deviation from an average person
    identifies a scan. Without ``standardise`` that average is the cohort mean (which a
    person making up much of the cohort moves towards themselves);
    ``standardise(rows)`` returns the deviations from a fixed population instead
    (:meth:`mriprep.splits.reference.Reference.standardise`), and a pair's correlation
    then does not depend on the rest of the cohort. Returns the normalised rows
    (float32) and a mask of usable rows (a row equal to the average carries no
    identity). The dot product of two normalised rows is the Pearson correlation of
    their deviations.
    """
    f = np.asarray(fingerprints, dtype=np.float64)
    if standardise is None:
        f = f - f.mean(axis=0, keepdims=True)
    else:
        f = np.array(standardise(f), dtype=np.float64)
    f -= f.mean(axis=1, keepdims=True)
    norms = np.linalg.norm(f, axis=1)
    usable = norms > 1e-9 * max(1.0, float(norms.max(initial=0.0)))
    f[usable] /= norms[usable, None]
    f[~usable] = 0.0
    return f.astype(np.float32), usable


def find_near_duplicates(
    fingerprints: np.ndarray,
    threshold: float = NEAR_DUPLICATE_THRESHOLD,
    *,
    method: str = "auto",
    seed: int = 0,
    miss_probability: float = 1e-4,
    info: dict[str, Any] | None = None,
) -> list[tuple[int, int, float]]:
    """Pairs of rows whose centred fingerprints correlate at or above ``threshold``.

    Parameters
    ----------
    fingerprints : ndarray, shape (n, d)
        One fingerprint per image (e.g. 8x8x8 block means, flattened). At least 3 rows
        are needed for the cohort centring to mean anything.
    threshold : float
        Correlation from which a pair is reported, in (0, 1).
    method : {"auto", "exact", "lsh"}
        ``exact`` compares every pair by a blocked matrix product: O(n^2 d) and exact.
        ``lsh`` hashes the rows with random hyperplanes (SimHash) in bands and only
        looks at rows sharing a bucket in some band; the
        candidates are filtered by the Hamming distance of their full signatures, then
        their correlation is computed exactly, so nothing below the threshold is ever
        reported, and a pair at the threshold is missed with probability below
        ``miss_probability``. ``auto`` is exact up to :data:`EXACT_SEARCH_MAX` rows.
    seed : int
        Seed of the random hyperplanes: the same input gives the same answer.
    miss_probability : float
        LSH only: the chance of missing a pair exactly at the threshold.
    info : dict, optional
        Filled with the method used, the pairs whose correlation was computed, and the
        LSH parameters.

    Returns
    -------
    list of (i, j, correlation)
        Row indices with i < j, by decreasing correlation.

    Examples
    --------
    >>> rng = np.random.default_rng(0)
    >>> prints = rng.standard_normal((50, 512))
    >>> prints[49] = prints[3] + 0.01 * rng.standard_normal(512)
    >>> [(i, j) for i, j, _ in find_near_duplicates(prints, 0.95)]
    [(3, 49)]
    """
    return correlated_pairs(
        fingerprints, threshold, method, info,
        lambda vectors, info: _lsh_candidates(vectors, threshold, seed, miss_probability, info),
        what="near-duplicate")


def correlated_pairs(
    fingerprints: np.ndarray,
    threshold: float,
    method: str,
    info: dict[str, Any] | None,
    lsh: Callable[[np.ndarray, dict[str, Any]], np.ndarray],
    what: str,
    standardise: Callable[[np.ndarray], np.ndarray] | None = None,
) -> list[tuple[int, int, float]]:
    """The search both :func:`find_near_duplicates` and
    :func:`mriprep.splits.identity.find_identity_matches` run: centre and normalise the
    rows (:func:`normalise_fingerprints`, on the cohort or by ``standardise``), compare
    every pair (``exact``) or the candidate pairs ``lsh(vectors, info)`` returns, keep
    those at or above ``threshold``. ``what`` names the search in errors."""
    if not 0 < threshold < 1:
        raise ValueError(f"{what} threshold must be in (0, 1), got {threshold}")
    if method not in ("auto", "exact", "lsh"):
        raise ValueError(f"unknown {what} method {method!r}; use auto, exact or lsh")
    info = info if info is not None else {}
    normalised, usable = normalise_fingerprints(fingerprints, standardise)
    rows = np.flatnonzero(usable)
    vectors = normalised[rows]
    n = len(rows)
    if method == "auto":
        method = "exact" if n <= EXACT_SEARCH_MAX else "lsh"
    info.update(method=method, entries=int(n), threshold=threshold)
    if n < 2:
        info["pairs_compared"] = 0
        return []
    if method == "exact":
        pairs = _exact_pairs(vectors, threshold)
        info["pairs_compared"] = n * (n - 1) // 2
    else:
        candidates = lsh(vectors, info)
        info["pairs_compared"] = int(len(candidates))
        pairs = _verify_pairs(vectors, candidates, threshold)
    found = [(int(rows[i]), int(rows[j]), float(c)) for i, j, c in pairs]
    return sorted(found, key=lambda p: (-p[2], p[0], p[1]))


def _exact_pairs(vectors: np.ndarray, threshold: float, block: int = 1024) -> list:
    pairs = []
    n = len(vectors)
    for start in range(0, n, block):
        stop = min(n, start + block)
        sims = vectors[start:stop] @ vectors[start:].T
        sims[np.tril_indices(stop - start, 0, sims.shape[1])] = -np.inf  # keep j > i
        ii, jj = np.nonzero(sims >= threshold)
        pairs += [(start + i, start + j, sims[i, j]) for i, j in zip(ii.tolist(), jj.tolist())]
    return pairs


def _lsh_candidates(
    vectors: np.ndarray, threshold: float, seed: int, miss_probability: float, info: dict,
    bits: int | None = None, filter_bits: int | None = None, margin_sd: float = 8.0,
) -> np.ndarray:
    """Candidate pairs (i < j) sharing a bucket in some band, whose signatures are not
    too far apart. ``bits`` per band (default log2(n) + 4); ``filter_bits``: how many
    signature bits the Hamming filter compares (default all of them), with a margin of
    ``margin_sd`` standard deviations above a pair at the threshold."""
    n, d = vectors.shape
    # A random hyperplane separates two unit vectors at angle theta with probability
    # theta/pi. With k bits per band, unrelated rows share a bucket with probability about
    # 2^-k, so k = log2(n) + 4 keeps the chance pairs per band near n/16 (real cohorts are
    # not isotropic: fewer bits let too many loosely similar pairs through); enough bands
    # make a pair at the threshold share a bucket in at least one band.
    if bits is None:
        bits = int(min(62, max(8, math.ceil(math.log2(n)) + 4)))
    p_bit = 1.0 - math.acos(threshold) / math.pi
    bands = int(math.ceil(math.log(miss_probability) / math.log1p(-(p_bit**bits))))
    info.update(bits_per_band=bits, bands=bands)
    planes = np.random.default_rng(seed).standard_normal((d, bits * bands)).astype(np.float32)
    signs = (vectors @ planes) > 0
    codes = np.packbits(
        np.pad(signs.reshape(n, bands, bits), ((0, 0), (0, 0), (0, 64 - bits))),
        axis=2,
        bitorder="little",
    ).view(np.uint64)[:, :, 0]
    pair_codes = [p for band in codes.T for p in _bucket_pairs(band)]
    if not pair_codes:
        return np.zeros((0, 2), dtype=np.int64)
    codes_found = np.sort(np.concatenate(pair_codes))  # a sort: faster than np.unique's hash
    unique = codes_found[np.concatenate(([True], codes_found[1:] != codes_found[:-1]))]
    candidates = np.stack([unique // n, unique % n], axis=1)
    # The full signature (bits x bands hyperplanes) estimates each candidate's angle:
    # chance collisions sit near half the bits apart, a pair at the threshold near
    # p_miss = theta/pi. A margin of 8 standard deviations loses no true pair in practice.
    # (the default; 5 loses one in 3 million).
    m = bits * bands if filter_bits is None else min(bits * bands, filter_bits)
    signature = np.packbits(signs[:, :m], axis=1)
    # as 64-bit words, so that the distance is one popcount per word, not per byte
    signature = np.pad(signature, ((0, 0), (0, -signature.shape[1] % 8))).view(np.uint64)
    q = 1.0 - p_bit
    limit = q * m + margin_sd * math.sqrt(m * q * (1 - q)) + 1
    keep = []
    for start in range(0, len(candidates), 1 << 16):
        part = candidates[start : start + (1 << 16)]
        differing = _popcount(signature[part[:, 0]] ^ signature[part[:, 1]]).sum(axis=1)
        keep.append(part[differing <= limit])
    info["lsh_candidates"] = int(len(candidates))
    return np.concatenate(keep)


_BYTE_BITS = np.array([bin(b).count("1") for b in range(256)], dtype=np.uint8)


def _popcount(words: np.ndarray) -> np.ndarray:
    """Set bits per uint64 word (numpy >= 2 counts them natively, much faster than a
    byte table: docs/benchmarks.md, "Identity") or, on older numpy, per byte: summed
    along a row, the same distance."""
    if hasattr(np, "bitwise_count"):
        return np.bitwise_count(words)
    return _BYTE_BITS[words.view(np.uint8)]


def _bucket_pairs(codes: np.ndarray) -> list[np.ndarray]:
    """All pairs of rows sharing a code, each as ``i * n + j`` with i < j.

    After sorting, the rows of a bucket are contiguous: pairing every row with the one
    ``gap`` places later, for gap = 1, 2, ... until no bucket is that large, enumerates
    every pair with vector operations instead of a loop over buckets.
    """
    n = len(codes)
    order = np.argsort(codes, kind="stable")
    ordered = codes[order]
    pairs = []
    for gap in range(1, n):
        same = np.flatnonzero(ordered[gap:] == ordered[:-gap])
        if not same.size:
            break
        a, b = order[same], order[same + gap]
        pairs.append(np.minimum(a, b).astype(np.int64) * n + np.maximum(a, b))
    return pairs


def _verify_pairs(vectors: np.ndarray, candidates: np.ndarray, threshold: float) -> list:
    pairs = []
    for start in range(0, len(candidates), 4096):
        part = candidates[start : start + 4096]
        corr = np.einsum("ij,ij->i", vectors[part[:, 0]], vectors[part[:, 1]])
        for k in np.flatnonzero(corr >= threshold).tolist():
            pairs.append((int(part[k, 0]), int(part[k, 1]), float(corr[k])))
    return pairs
