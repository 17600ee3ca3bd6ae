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


def test_tissue_classes_follow_t1_intensity_and_atropos_leaves_no_files_behind(
        tmp_path, monkeypatch):
    image, brain, truth = _phantom(np.random.default_rng(0))
    # This test's own temporary folder: other processes' files cannot enter the count.
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    tissue = segment_tissue(image, brain, (1.0, 1.0, 1.0))
    # Atropos wrote one probability image per class beside a temporary name.
    assert os.listdir(tmp_path) == []
    assert tempfile.tempdir == str(tmp_path)
    assert (tissue[~brain] == 0).all()
    for cls in (CSF, GM, WM):
        assert (tissue[truth == cls] == cls).mean() > 0.95, cls
