"""Tests of mriprep.splits.near_duplicates: the near-duplicate search shared with
`mriprep check`, exact and LSH, on fingerprints of the MNI152 template's anatomy.
"""

from __future__ import annotations

import numpy as np
import pytest

from mriprep.inputs.templates import load_template
from mriprep.splits.near_duplicates import find_near_duplicates


@pytest.fixture(scope="module")
def cohort_fingerprints():
    """Fingerprints of 3000 distinct synthetic subjects with 30 planted near-duplicates.

    Each is the template's 8x8x8 block means plus a per-subject low-rank deviation.
    """
    data = load_template("mni152").data
    base = data
    for axis, n in enumerate(data.shape):
        base = np.add.reduceat(base, np.linspace(0, n, 9)[:-1].round().astype(int), axis=axis)
    base = base.ravel().astype(np.float64)
    rng = np.random.default_rng(7)
    n = 3000
    modes = rng.standard_normal((40, base.size))
    prints = (
        base + (rng.standard_normal((n, 40)) @ modes) * 2.0 + rng.standard_normal((n, base.size))
    )
    planted = [(i, n - 1 - i) for i in range(30)]
    for i, j in planted:
        prints[j] = prints[i] + 0.5 * rng.standard_normal(base.size)
    return prints, planted


def test_exact_and_lsh_searches_find_the_same_pairs(cohort_fingerprints):
    prints, planted = cohort_fingerprints
    exact_info, lsh_info = {}, {}
    exact = find_near_duplicates(prints, 0.95, method="exact", info=exact_info)
    lsh = find_near_duplicates(prints, 0.95, method="lsh", info=lsh_info)
    assert {(i, j) for i, j, _ in exact} == set(planted)
    assert [(i, j) for i, j, _ in lsh] == [(i, j) for i, j, _ in exact]
    assert [c for *_, c in lsh] == pytest.approx([c for *_, c in exact], abs=1e-5)
    # LSH computed the correlation of a tiny fraction of the 4.5 million pairs
    assert exact_info["pairs_compared"] == 3000 * 2999 // 2
    assert lsh_info["pairs_compared"] < 1000 and lsh_info["method"] == "lsh"


def test_raw_anatomy_alone_is_not_a_duplicate(cohort_fingerprints):
    """Without the cohort centring every registered brain would correlate above 0.95."""
    prints, _ = cohort_fingerprints
    raw = np.corrcoef(prints[:2])[0, 1]
    assert raw > 0.95
    assert find_near_duplicates(prints[:200], 0.95) == []


def test_near_duplicate_arguments_are_validated():
    with pytest.raises(ValueError, match="threshold must be in"):
        find_near_duplicates(np.ones((4, 8)), 1.5)
    with pytest.raises(ValueError, match="unknown near-duplicate method 'fast'"):
        find_near_duplicates(
            np.random.default_rng(0).standard_normal((4, 8)), 0.9, method="fast"
        )


def test_auto_compares_every_pair_up_to_the_exact_limit_and_hashes_above(monkeypatch):
    from mriprep.splits import near_duplicates

    rng = np.random.default_rng(3)
    prints = rng.standard_normal((12, 64))
    monkeypatch.setattr(near_duplicates, "EXACT_SEARCH_MAX", 12)
    info: dict = {}
    find_near_duplicates(prints, 0.9, info=info)
    assert info["method"] == "exact"
    monkeypatch.setattr(near_duplicates, "EXACT_SEARCH_MAX", 11)
    find_near_duplicates(prints, 0.9, info=info)
    assert info["method"] == "lsh"
