import numpy as np
import pytest

from mriprep.core.boxes import nonzero_box


@pytest.mark.parametrize("shape", [(9, 11, 13), (7, 8)])
def test_the_box_is_the_smallest_around_the_non_zero_voxels_grown_and_clipped(shape):
    rng = np.random.default_rng(0)
    for _ in range(50):
        array = np.zeros(shape, np.int16)
        points = [tuple(rng.integers(0, n) for n in shape) for _ in range(rng.integers(1, 4))]
        for p in points:
            array[p] = rng.choice([-3, 1, 7])
        for margin in (0, 2):
            box = nonzero_box(array, margin)
            ijk = np.argwhere(array)
            want = tuple(slice(max(int(lo) - margin, 0), min(int(hi) + 1 + margin, n))
                         for lo, hi, n in zip(ijk.min(0), ijk.max(0), shape))
            assert box == want


def test_an_all_zero_array_has_no_box():
    assert nonzero_box(np.zeros((4, 5, 6))) is None
    assert nonzero_box(np.zeros((4, 5), bool)) is None
