"""Batched augmentation on the training device, valid-mask aware, in one interpolation.

    >>> from mriprep.training.augment import Augment, AugmentConfig
    >>> augment = Augment(AugmentConfig(seed=0, flip_prob=0.5), lr_swap=table)
    >>> batch = augment(to_device(batch, "cuda"))     # after the DataLoader

* :mod:`~.config`: :class:`AugmentConfig`, the parameters (a frozen dataclass, YAML in
  and out, to be recorded with a training run);
* :mod:`~.params`: per-sample draws from ``(seed, epoch, sample id)``,
  :class:`SampleParams` (returned per sample, loggable and replayable);
* :mod:`~.geometry`: affine, elastic and mirror composed into one ``grid_sample`` grid;
  image, valid mask, weights and labels through it, with normalised interpolation;
* :mod:`~.intensity`: bias field, gamma, contrast and brightness, Gaussian and Rician
  noise, blur, simulated low resolution along one axis;
* :mod:`~.module`: :class:`Augment`, batches in and out (mriprep, MONAI MetaTensor,
  plain tensors).

Why here and not in loader workers: a random affine plus elastic transform per item on
the CPU costs more than reading the item (see ``docs/benchmarks.md``, augment); on the
batch, on the GPU, it is one ``grid_sample``.
"""

from mriprep.training.augment.config import FLOAT16_MAX, AugmentConfig
from mriprep.training.augment.module import Augment
from mriprep.training.augment.params import SampleParams

__all__ = ["FLOAT16_MAX", "Augment", "AugmentConfig", "SampleParams"]
