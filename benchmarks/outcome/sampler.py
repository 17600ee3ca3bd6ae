"""The shared slice sampler: shuffled batches of 7-slice sagittal stacks from volumes in
memory (arm A, whose MONAI has no 2.5D reader, and the NaN ablation)."""

from __future__ import annotations

import numpy as np
import torch

from benchmarks.outcome.training import BATCH, thick

# FastSurfer's blank-slice filter: a slice whose classes sum to at most this is left out.
BLANK_THRESHOLD = 50


def slice_pool(volumes) -> list[tuple[int, int]]:
    """(volume, slice) of the slices whose classes sum above the blank threshold;
    ``volumes`` are (subject, image, classes[, valid]) with the slice axis first."""
    return [(n, int(k)) for n, (_, _, classes, *_) in enumerate(volumes)
            for k in np.flatnonzero(classes.reshape(len(classes), -1).sum(1) > BLANK_THRESHOLD)]


def slice_batches(volumes, pool: list[tuple[int, int]], seed: int):
    """Endless batches of :data:`BATCH` stacks, reshuffled every pass; ``valid`` where the
    volumes carry one."""
    rng = np.random.default_rng(seed)
    with_valid = len(volumes[0]) > 3
    while True:
        order = rng.permutation(len(pool))
        for start in range(0, len(order) - BATCH + 1, BATCH):
            chosen = [pool[i] for i in order[start:start + BATCH]]
            batch = {
                "image": torch.from_numpy(np.stack([thick(volumes[n][1], k)
                                                    for n, k in chosen]).astype(np.float32)),
                "classes": torch.from_numpy(np.stack([volumes[n][2][k] for n, k in chosen])),
                "subject_id": [volumes[n][0] for n, _ in chosen],
            }
            if with_valid:
                batch["valid"] = torch.from_numpy(np.stack([volumes[n][3][k]
                                                            for n, k in chosen]))
            yield batch
