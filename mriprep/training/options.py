"""The options of :class:`~mriprep.training.dataset.MRIDataset`: its modes and value checks.

:func:`refuse_options_of_other_modes` refuses an option given to a mode it does not
apply to; each ``as_*`` check returns the value in its canonical type (the default for
``None``, where there is one). Every refusal is a ``ValueError`` naming the option, the
value given and what would work.
"""

from __future__ import annotations

import numpy as np

MODES = ("volume", "patch", "slice", "thick_slice")
# Names people reach for that are spelled otherwise here: the error names the working form.
RENAMED_OPTIONS = {
    "thickness": "context (neighbouring slices on each side; FastSurfer's thickness)",
    "blt": "blank_slice_threshold",
    "unknown": "table=LabelTable(unknown='background') (mriprep.training.labels)",
    "processing": "table=LabelTable(processing=...)",
    "lut": "table=LabelTable('my_lut.tsv')",
    "plane": "view",
}
RENAMED_MODES = {
    "slices": "mode='thick_slice' for FastSurfer's thick slices of a view (with classes "
              "and weights), or mode='slice' for slices along an axis of the cache",
    "thick_slices": "mode='thick_slice'", "volumes": "mode='volume'",
    "patches": "mode='patch'",
}
DEFAULT_PATCH_SIZE = (96, 96, 96)


def refuse_renamed(mode: str, options: dict) -> None:
    """A TypeError naming the working spelling of a renamed option or mode."""
    for name in options:
        if name in RENAMED_OPTIONS:
            raise TypeError(f"MRIDataset has no option {name!r}; use {RENAMED_OPTIONS[name]}")
        raise TypeError(f"MRIDataset got an unexpected option {name!r}")
    if mode in RENAMED_MODES:
        raise ValueError(f"MRIDataset: there is no mode {mode!r}; use {RENAMED_MODES[mode]}")


def refuse_options_of_other_modes(mode: str, **options_by_mode: dict) -> None:
    for other, options in options_by_mode.items():
        if other == mode:
            continue
        given = [name for name, value in options.items() if value is not None]
        if given:
            raise ValueError(
                f"MRIDataset: {', '.join(given)} only apply to mode={other!r}, not "
                f"mode={mode!r}; drop them or set mode={other!r}"
            )


def as_patch_size(value) -> tuple[int, int, int]:
    if value is None:
        return DEFAULT_PATCH_SIZE
    size = (value,) * 3 if isinstance(value, int) else tuple(value)
    if len(size) != 3 or not all(isinstance(s, (int, np.integer)) and s >= 1 for s in size):
        raise ValueError(f"MRIDataset: patch_size must be an int or 3 ints >= 1, got {value!r}")
    return tuple(int(s) for s in size)


def as_positive_int(name: str, value) -> int:
    if not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"MRIDataset: {name} must be an int >= 1, got {value!r}")
    return int(value)


def as_fraction(name: str, value) -> float:
    if not isinstance(value, (int, float)) or not 0.0 <= value <= 1.0:
        raise ValueError(f"MRIDataset: {name} must be between 0 and 1, got {value!r}")
    return float(value)


def as_channel_first(value, meta_tensor: bool) -> bool:
    if value is None:
        return meta_tensor
    if not isinstance(value, bool):
        raise ValueError(f"MRIDataset: channel_first must be True or False, got {value!r}")
    if meta_tensor and not value:
        raise ValueError(
            "MRIDataset: meta_tensor=True needs channel_first=True (MONAI's spatial "
            "transforms read every MetaTensor as [C, ...]); drop channel_first=False"
        )
    return value
