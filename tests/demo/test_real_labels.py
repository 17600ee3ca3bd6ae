"""The tissue segmentation that labels the real heads (:mod:`mriprep.demo.real_labels`),
on a small phantom: the classes come out ordered by T1 intensity, and nothing is left
behind in the system's temporary folder."""

from __future__ import annotations

import os
import tempfile

import numpy as np

from mriprep.demo.freesurfer_labels import CSF, GM, WM
from mriprep.demo.real_labels import segment_tissue


def _phantom(rng) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Nested spheres: white matter inside grey matter inside CSF, with noise."""
    grid = np.indices((32, 32, 32)) - 15.5
    radius = np.sqrt((grid**2).sum(0))
    truth = np.select([radius < 6, radius < 10, radius < 13], [WM, GM, CSF], 0).astype(np.uint8)
    level = {0: 0.0, CSF: 30.0, GM: 70.0, WM: 110.0}
    image = np.vectorize(level.get)(truth).astype(np.float32)
    image += rng.normal(0, 4, image.shape).astype(np.float32)
    return image, truth > 0, truth


def test_tissue_classes_follow_t1_intensity_and_atropos_leaves_no_files_behind():
    image, brain, truth = _phantom(np.random.default_rng(0))
    temporary = tempfile.gettempdir()
    before = set(os.listdir(temporary))
    tissue = segment_tissue(image, brain, (1.0, 1.0, 1.0))
    left = set(os.listdir(temporary)) - before
    # Atropos wrote one probability image per class next to a temporary name.
    assert not [name for name in left if name.startswith(("antsr", "mriprep-atropos-"))], left
    assert tempfile.tempdir is None or tempfile.tempdir == temporary
    assert (tissue[~brain] == 0).all()
    for cls in (CSF, GM, WM):
        assert (tissue[truth == cls] == cls).mean() > 0.95, cls
