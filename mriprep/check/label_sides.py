"""Left and right of a label map, judged in world coordinates (``label-side-swap``).

A label map whose ``Left-*`` structures lie on the head's right side teaches a network
the wrong side, and nothing downstream notices: the values are valid, the volumes
plausible. Here every lateral pair of the label table (``Left-X``/``Right-X``, and
FreeSurfer's cortical parcels ``1000+k``/``2000+k``) is located by its centroid in
world millimetres (the entry's affine: RAS, x to the right), and its *offset* is the
right structure's x minus the left one's. In any brain every offset is positive: even
the medial parcels lie on their own side of the falx. A negative offset is a pair on the
wrong side. What is reversed says what happened:

* (nearly) every pair: the whole map is mirrored against its image, or all its values
  swapped;
* the cortical parcels, not the rest: the two hemispheres' parcel numbers swapped;
* a few pairs: those structures' values swapped.

The threshold is 0 mm; clean maps' smallest offsets and swapped maps' largest are
measured in ``make bench`` (labels). Centroids come from every second voxel along each
axis: a millimetre is far below the offsets that matter, at an eighth of the reads.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import numpy as np

# A pair needs this many (subsampled) voxels on each side to have a centroid worth judging.
MIN_VOXELS = 8
# Share of the judged pairs reversed from which the whole map is called mirrored.
MIRRORED_SHARE = 0.8
_STEP = 2


@dataclass(frozen=True)
class SideReading:
    """The offsets of one label map (pair name -> mm) and what they say."""

    offsets: dict[str, float]

    @property
    def reversed(self) -> list[str]:
        return [name for name, dx in self.offsets.items() if dx < 0]

    def scope(self) -> str | None:
        """What the reversed pairs say was swapped: None (nothing), ``"parcels"`` (the
        hemispheres' parcel numbers), ``"mirrored"`` (the whole map), or ``"pairs"``
        (a few structures, :attr:`reversed`)."""
        wrong = self.reversed
        if not wrong:
            return None
        cortex = [n for n in self.offsets if n.startswith("ctx-")]
        wrong_cortex = [n for n in wrong if n.startswith("ctx-")]
        only_cortex = len(wrong_cortex) == len(wrong)
        if only_cortex and len(cortex) >= 3 and \
                len(wrong_cortex) >= MIRRORED_SHARE * len(cortex):
            return "parcels"
        if len(self.offsets) >= 3 and len(wrong) >= MIRRORED_SHARE * len(self.offsets):
            return "mirrored"
        return "pairs"

    def verdict(self) -> str | None:
        """None when every pair lies on its side, else what was swapped."""
        wrong, scope = self.reversed, self.scope()
        if scope is None:
            return None
        if scope == "parcels":
            cortex = [n for n in self.offsets if n.startswith("ctx-")]
            return (f"{len(wrong)} of its {len(cortex)} cortical parcel pairs lie on "
                    "the wrong side, and no other pair: the hemispheres' parcel numbers "
                    "(1xxx, 2xxx) are swapped")
        if scope == "mirrored":
            return (f"{len(wrong)} of its {len(self.offsets)} left/right pairs lie on the "
                    "wrong side: the whole map is mirrored against its image, or its left "
                    "and right values swapped")
        shown = ", ".join(f"{n} ({self.offsets[n]:+.0f} mm)" for n in wrong[:8])
        return (f"{len(wrong)} left/right pair(s) lie on the wrong side: {shown}"
                + (" ..." if len(wrong) > 8 else ""))


def side_pairs(ids, names, present) -> dict[str, tuple[int, int]]:
    """``{name: (left value, right value)}`` for the table's ``Left-X``/``Right-X`` rows
    and for the cortical parcels ``1000+k``/``2000+k`` both present in the map (a fused
    table lists few right parcels, but the map holds FreeSurfer's numbers)."""
    by_name = {str(n): int(v) for v, n in zip(np.asarray(ids).tolist(), names)}
    pairs = {}
    for name, value in by_name.items():
        match = re.match(r"Left-(.+)", name)
        if match and f"Right-{match.group(1)}" in by_name:
            pairs[match.group(1)] = (value, by_name[f"Right-{match.group(1)}"])
    present = {int(v) for v in present}
    for left in sorted(v for v in present if 1000 < v < 2000):
        if left + 1000 in present:
            label = next((n[len("ctx-lh-"):] for n, v in by_name.items()
                          if v == left and n.startswith("ctx-lh-")), str(left))
            pairs[f"ctx-{label}"] = (left, left + 1000)
    return pairs


def read_sides(labels: np.ndarray, affine: np.ndarray,
               pairs: dict[str, tuple[int, int]],
               labelled: tuple[slice, ...] | None = None) -> SideReading:
    """Each pair's offset in mm (right centroid's world x minus the left one's).
    ``labelled``, the box of the map's labelled voxels when the caller knows it, bounds
    the reads: the same voxels are summed in the same order."""
    labels = np.asarray(labels)
    if labelled is None:
        labelled = tuple(slice(0, n) for n in labels.shape)
    # The sampled grid starts at index 0 of the map; in the box, at its first even index.
    first = [-(-s.start // _STEP) * _STEP for s in labelled]
    sub = labels[tuple(slice(f, s.stop, _STEP) for f, s in zip(first, labelled))]
    flat = sub.ravel()
    where = np.flatnonzero(flat)
    values = flat[where].astype(np.int64)
    if len(values) == 0:
        return SideReading({})
    coords = [c + f // _STEP for c, f in zip(np.unravel_index(where, sub.shape), first)]
    size = int(values.max()) + 1
    count = np.bincount(values, minlength=size)
    # World x of every voxel is linear in its indices: only the x row of the affine.
    x_row = np.asarray(affine, dtype=np.float64)[0]
    world_x = x_row[3] + sum(x_row[a] * _STEP * coords[a] for a in range(3))
    sums = np.bincount(values, weights=world_x, minlength=size)
    offsets = {}
    for name, (left, right) in pairs.items():
        if max(left, right) >= size or min(count[left], count[right]) < MIN_VOXELS:
            continue
        offsets[name] = float(sums[right] / count[right] - sums[left] / count[left])
    return SideReading(offsets)
