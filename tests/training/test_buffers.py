"""The reused batch buffers (:mod:`mriprep.training.buffers`) as a loader uses them.

The cache is the shared template cache (``cache_dir`` in ``conftest.py``).
"""

from __future__ import annotations

import numpy as np

from mriprep.cache import Cache
from mriprep.training import MRIDataset, make_dataloader


def test_held_batches_are_never_overwritten_by_reused_buffers(cache_dir):
    ds = MRIDataset(cache_dir, split="train")
    loader = make_dataloader(ds, batch_size=1, shuffle=False, num_workers=2, backend="threads")
    held = list(loader)  # keeps every batch alive while later ones are read
    for ref, batch in zip(Cache(cache_dir).entries("train"), held, strict=True):
        assert batch["subject_id"] == [ref.subject_id]
        expected = Cache(cache_dir).load_tensor(ref.key, "image")
        np.testing.assert_array_equal(batch["image"][0, 0].numpy(), expected)
