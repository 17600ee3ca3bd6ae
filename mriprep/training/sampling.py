"""What is drawn, and in which order: every random draw comes from ``(seed, epoch, index)``.

:func:`draw_seed` is the seed of one epoch's draws; :class:`EpochSampler` yields
:class:`SampleKey` s, an item index and that seed, in a seeded order. So the dataset draws
the same patch centres whichever thread or worker process reads an item;
:mod:`mriprep.training` explains why.
"""

from __future__ import annotations

from typing import Iterator, NamedTuple

import numpy as np
from torch.utils.data import Sampler


class SampleKey(NamedTuple):
    """What a sampler hands the dataset: an item index and the epoch's draw seed."""

    index: int
    draw_seed: int


def draw_seed(seed: int, epoch: int) -> int:
    """The seed of every random draw in one epoch (independent of workers and threads)."""
    return int(np.random.SeedSequence([int(seed), int(epoch)]).generate_state(1)[0])


class EpochSampler(Sampler):
    """Yields :class:`SampleKey` s: a seeded permutation (or order) and the epoch's seed.

    Each ``iter()`` is one epoch, numbered from 0; :meth:`set_epoch` sets the number of
    the next one (to resume a run). Everything drawn depends on ``(seed, epoch)`` only.
    """

    def __init__(self, length: int, shuffle: bool, seed: int = 0):
        self.length = int(length)
        self.shuffle = bool(shuffle)
        self.seed = int(seed)
        self._next_epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self._next_epoch = int(epoch)

    def __len__(self) -> int:
        return self.length

    def __iter__(self) -> Iterator[SampleKey]:
        epoch, self._next_epoch = self._next_epoch, self._next_epoch + 1
        seed = draw_seed(self.seed, epoch)
        if self.shuffle:
            order = np.random.default_rng(seed).permutation(self.length).tolist()
        else:
            order = range(self.length)
        return iter([SampleKey(i, seed) for i in order])
