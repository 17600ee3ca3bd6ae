"""Where a label map's structures lie: one pass over the map for every label check.

A label map of a 256^3 grid holds its labels in a box much smaller than the grid, and
each structure in a box of its own (docs/benchmarks.md, rows 42 and 45). The checks crop
to the union (:mod:`mriprep.check.label_fit`, and the pieces of
:mod:`mriprep.check.label_islands`), and the islands check measures a structure's specks
inside its own box. Both boxes come from one :func:`scipy.ndimage.find_objects` pass,
made once per map (:func:`mriprep.check.label_table.judge_map`).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
from scipy import ndimage

from mriprep.core.boxes import nonzero_box

Box = tuple[slice, ...]


def structure_boxes(labels: np.ndarray) -> list[Box | None]:
    """Each positive label value's bounding box (``boxes[value - 1]``, None where the
    value is absent), in the map's indices: shared by the checks that crop to a
    structure or to the labelled mass (:func:`labelled_box`).

    The labelled voxels' box is found first, from the map's projections (a reduction
    along one axis, then along the others on what is left); the boxes of the values are
    then found in it, not in the whole grid."""
    values = np.asarray(labels)
    if values.dtype.kind not in "iu":
        values = values.astype(np.int64)
    if values.ndim != 3 or values.size == 0:
        return ndimage.find_objects(values)  # values <= 0 are background to it
    # Non-zero values bound the box: a negative one only widens it (find_objects leaves
    # it out), and the comparison a "> 0" would cost is saved.
    box = nonzero_box(values)
    if box is None:
        return []
    offset = [s.start for s in box]
    return [None if found is None else
            tuple(slice(s.start + o, s.stop + o) for s, o in zip(found, offset))
            for found in ndimage.find_objects(values[box])]


def labelled_box(boxes: Sequence[Box | None]) -> Box | None:
    """The bounding box of every labelled voxel, from :func:`structure_boxes`."""
    found = [b for b in boxes if b is not None]
    if not found:
        return None
    return tuple(slice(min(b[a].start for b in found), max(b[a].stop for b in found))
                 for a in range(len(found[0])))
