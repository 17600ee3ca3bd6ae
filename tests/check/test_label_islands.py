"""``label-islands``: specks far from a structure's body are counted; near specks, big
pieces, tiny structures and grids too coarse for a speck are not judged as scattered."""

from __future__ import annotations

import numpy as np

from mriprep.check.label_islands import MAX_SCATTERED, read_islands


def _ball(shape=(60, 60, 60), centre=(30, 30, 30), radius=8, value=17):
    grid = np.indices(shape)
    inside = sum((g - c) ** 2 for g, c in zip(grid, centre)) <= radius ** 2
    return np.where(inside, value, 0).astype(np.int16)


def test_far_specks_are_scattered_and_named():
    labels = _ball()  # about 2,100 voxels
    body = int((labels == 17).sum())
    for j in range(2, 58, 10):          # 36 specks of 4 voxels, 19 mm or more away
        for k in range(2, 58, 10):
            labels[2:4, j:j + 2, k] = 17
    reading = read_islands(labels, names={17: "Left-Hippocampus"})
    share = reading.scattered[17]
    assert abs(share - 144 / (body + 144)) < 1e-9
    assert share > MAX_SCATTERED
    assert "Left-Hippocampus" in reading.verdict()


def test_near_specks_big_pieces_and_clean_structures_are_not_scattered():
    labels = _ball()
    labels[30, 30, 40] = 17                 # a speck 2 mm off the surface
    labels[2:12, 2:12, 2:12] = 17           # a far piece of 1000 voxels: not a speck
    reading = read_islands(labels)
    assert reading.scattered[17] == 0.0 and reading.verdict() is None
    assert read_islands(_ball()).scattered[17] == 0.0


def test_a_tiny_structure_and_a_coarse_grid_are_not_judged():
    tiny = _ball(radius=2)
    tiny[50, 50, 50] = 17
    assert 17 not in read_islands(tiny).scattered
    labels = _ball()
    labels[2, 2, 2] = 17
    assert read_islands(labels, spacing=(1, 1, 1)).scattered[17] > 0
    assert read_islands(labels, spacing=(3, 3, 3)).scattered == {}  # a voxel > a speck


def test_values_the_table_rewrites_are_not_judged():
    from mriprep.training.labels import dkt_table

    labels = _ball(value=1000)  # ctx-lh-unknown, which the aparc rules fill away
    for j in range(2, 58, 10):
        for k in range(2, 58, 10):
            labels[2:4, j:j + 2, k] = 1000
    assert read_islands(labels).flagged()
    skipped = read_islands(labels, skip=dkt_table().rewritten_values())
    assert 1000 not in skipped.scattered and skipped.verdict() is None
    assert skipped.skipped == {1000: int((labels == 1000).sum())}  # counted, not silent
