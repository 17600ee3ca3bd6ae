"""``label-off-anatomy`` on a made-up head: labels in the air and labels away from the
brain's labelled mass are each named; a brain in pieces close together is not."""

from __future__ import annotations

import numpy as np

from mriprep.check.label_anatomy import read_anatomy


def _head_and_brain():
    grid = np.indices((80, 80, 80))
    radius = np.sqrt(sum((g - 40.0) ** 2 for g in grid))
    image = np.where(radius < 34, 100.0, 1.0).astype(np.float32)  # scalp to 34 voxels
    labels = np.where(radius < 22, 2, 0).astype(np.int16)          # brain to 22
    return image, labels


def test_a_clean_brain_in_its_head_is_not_named():
    image, labels = _head_and_brain()
    labels[36:44, 36:44, 63:65] = 3  # a piece just off the brain: within its envelope
    reading = read_anatomy(image, labels)
    assert reading.verdict() is None and reading.off_brain_mm3 == 0


def test_labels_in_the_scalp_are_off_the_brain_though_in_the_head():
    image, labels = _head_and_brain()
    labels[68:74, 36:44, 36:44] = 17   # 6 x 8 x 8 voxels, 8 voxels past the brain
    reading = read_anatomy(image, labels)
    assert reading.outside_mm3 == 0
    assert 300 <= reading.off_brain_mm3 <= 400
    assert "from the brain's labelled mass" in reading.verdict()
    assert "no head" not in reading.verdict()


def test_labels_in_the_air_are_named_outside_the_head():
    image, labels = _head_and_brain()
    labels[0:8, 0:8, 0:8] = 17
    verdict = read_anatomy(image, labels).verdict()
    assert "shows no head" in verdict and "from the brain's labelled mass" in verdict
