"""Per-voxel loss weights from a class map, as FastSurfer's training data carries them.

``weight = median-frequency class weight (capped at max_weight)
          + edge_weight where the label gradient is non-zero
          + hires_weight on deep sulci and thin white-matter strands (optional)
          + hires_weight // 2 on the outer cortex border (optional, with cortex_mask)``
then multiplied by a user factor per region (``region_weights``, by label name).

The rules follow FastSurfer's ``create_weight_mask`` with two differences that only show
where FastSurfer fails: the class weights are indexed by class, not by rank among the
classes present (FastSurfer's fails on a map lacking a class below its highest),
and the weights are computed over the whole 3D volume as FastSurfer does, not per slice.

* class weight of a present class: ``median(counts) / count`` over the classes present;
* the gradient is NumPy's (central differences inside, one-sided at the border), so a
  voxel is an edge when its neighbours before and after differ along some axis;
* "deep sulci and strands": cortex voxels (class > ``ctx_thresh``) that a 3x3x3 binary
  closing adds; "cortex border": the outer layer of the brain (labels > 0) a 3x3x3
  erosion removes, on cortex only.

The result is float64, finite and >= 0 by construction. Costs: docs/benchmarks.md.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from scipy import ndimage


@dataclass(frozen=True)
class WeightOptions:
    """FastSurfer ``generate_hdf5`` defaults: max_w 5, edge_w 5, no hires weight."""

    max_weight: float = 5.0
    edge_weight: float = 5.0
    hires_weight: int | None = None
    cortex_mask: bool = False
    gradient: bool = True
    region_weights: dict[str, float] = field(default_factory=dict)


def class_weights(classes: np.ndarray, num_classes: int, max_weight: float) -> np.ndarray:
    """Median-frequency weight of every class (0 for a class that is absent)."""
    return weights_from_counts(np.bincount(classes.ravel(), minlength=num_classes),
                               max_weight)


def weights_from_counts(counts: np.ndarray, max_weight: float) -> np.ndarray:
    """:func:`class_weights` from the voxels per class."""
    counts = np.asarray(counts).astype(np.float64)
    present = counts > 0
    weights = np.zeros(len(counts), dtype=np.float64)
    weights[present] = np.median(counts[present]) / counts[present]
    return np.minimum(weights, max_weight)


def edge_mask(classes: np.ndarray) -> np.ndarray:
    """Where ``numpy.gradient`` of the class map is non-zero along some axis."""
    edge = np.zeros(classes.shape, dtype=bool)
    for axis in range(classes.ndim):
        if classes.shape[axis] < 2:
            continue
        a = np.moveaxis(classes, axis, 0)
        e = np.moveaxis(edge, axis, 0)  # a view: writes land in ``edge``
        e[1:-1] |= a[2:] != a[:-2]
        e[0] |= a[1] != a[0]
        e[-1] |= a[-1] != a[-2]
    return edge


def sulci_and_strands(classes: np.ndarray, ctx_thresh: int) -> np.ndarray:
    cortex = classes > ctx_thresh
    closed = ndimage.binary_closing(cortex, structure=np.ones((3, 3, 3)), iterations=1)
    return closed ^ cortex


def cortex_border(classes: np.ndarray, ctx_thresh: int) -> np.ndarray:
    brain = classes > 0
    border = ndimage.binary_erosion(brain, structure=np.ones((3, 3, 3))) ^ brain
    return border & (classes > ctx_thresh)


def weight_map(classes: np.ndarray, num_classes: int, options: WeightOptions = WeightOptions(),
               *, ctx_thresh: int = 33, region_factors: dict[int, float] | None = None,
               class_weight: np.ndarray | None = None) -> np.ndarray:
    """The weight map of a 3D class map (module docstring); float64.

    ``region_factors`` maps a class to its factor (resolve names with
    :func:`region_factors_for`); ``ctx_thresh`` is the last non-cortical class;
    ``class_weight`` gives the class weights when ``classes`` is a part of the volume
    they are counted over (default: counted over ``classes``).
    """
    classes = np.asarray(classes)
    if class_weight is None:
        class_weight = class_weights(classes, num_classes, options.max_weight)
    weights = class_weight[classes]
    if options.gradient:
        weights += options.edge_weight * edge_mask(classes)
    if options.hires_weight is not None:
        weights += options.hires_weight * sulci_and_strands(classes, ctx_thresh)
        if options.cortex_mask:
            weights += (cortex_border(classes, ctx_thresh) * options.hires_weight) // 2
    for cls, factor in (region_factors or {}).items():
        weights[classes == cls] *= factor
    return weights


def slab_weights(classes: np.ndarray, index: int, class_weight: np.ndarray,
                 options: WeightOptions = WeightOptions(), *, ctx_thresh: int = 33,
                 region_factors: dict[int, float] | None = None) -> np.ndarray:
    """The weights of slice ``index`` (axis 0) of a 3D class map, equal to that slice of
    :func:`weight_map` over the whole map, from the few slices around it.

    Every part of the weight looks at most one voxel away (edges), or two (the hires
    closing: a dilation, then an erosion), so a slab of that margin on each side gives
    the middle slice exactly; at the volume's edge the slab ends where the volume does.
    ``class_weight`` comes from the whole volume's counts (:func:`class_weights`)."""
    if options.hires_weight is None:
        # FastSurfer's default weights need the slice and its two neighbours only.
        middle = np.asarray(classes[index])
        weights = class_weight[middle]
        if options.gradient:
            edge = edge_mask(middle)  # in the plane: the same differences as in 3D
            depth = len(classes)
            if depth > 1:
                before, after = max(index - 1, 0), min(index + 1, depth - 1)
                edge |= np.asarray(classes[after]) != np.asarray(classes[before])
            weights = weights + options.edge_weight * edge
        for cls, factor in (region_factors or {}).items():
            weights[middle == cls] *= factor
        return weights
    margin = 2
    first, stop = max(index - margin, 0), min(index + margin + 1, len(classes))
    slab = np.asarray(classes[first:stop])
    weights = weight_map(slab, len(class_weight), options, ctx_thresh=ctx_thresh,
                         region_factors=region_factors, class_weight=class_weight)
    return weights[index - first]


def region_factors_for(table, view: str, region_weights: dict[str, float]) -> dict[int, float]:
    """``{class: factor}`` of ``view`` from ``{label name: factor}``; a name merged with its
    partner in the sagittal view gives the merged class (a later name wins there)."""
    out = {}
    for name, factor in region_weights.items():
        factor = float(factor)
        if not np.isfinite(factor) or factor < 0:
            raise ValueError(f"region weight of {name!r} is {factor}; give a finite "
                             "factor >= 0 (1.3 adds 30%)")
        out[table.class_of_name(name, view)] = factor
    return out


def cortex_threshold(table, view: str) -> int:
    """The last class before the first ``ctx-`` class of ``view`` (FastSurfer: 33 in the
    axial/coronal DKT classes, 19 in the sagittal)."""
    names = table.class_names(view)
    first = next((i for i, n in enumerate(names) if n.startswith("ctx-")), len(names))
    return first - 1
