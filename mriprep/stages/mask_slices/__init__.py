"""Mask slices: find incomplete and artifact slices and mark them invalid.

Two families of bad slices, both real scanner failures:

* **incomplete** slices carry no measurement: zero-filled (dropped k-space lines or
  reconstruction gaps), wholly or over part of the head, constant, dominated by invalid
  voxels (non-finite values the sanitize stage filled), or empty slices at the border
  that cut the head off. These are unambiguous, so they are searched along every axis.
* **artifact** slices hold a measurement that disagrees with their neighbours: a slice
  whose intensity jumps (spike) or drops (signal dropout, as FSL eddy and DSI Studio
  detect it in diffusion data), or whose structure no longer matches its neighbours
  (motion within the slice, ghosting). They are searched along the acquisition (thickest)
  axis, and along every axis when the volume is isotropic and the acquisition axis is
  unknown.

The limits are set on the calibration set (:mod:`mriprep.demo.calibration`: thick-slice
scans of synthetic people and Colin27 in every slicing, with planted bad slices); what
the stage finds and misses there: ``make bench`` (``benchmarks/bench_slices.py``);
docs/benchmarks.md, "Slice masking".

The work is done one topic per module: :mod:`~mriprep.stages.mask_slices.incomplete`
finds incomplete slices and :mod:`~mriprep.stages.mask_slices.artifacts` scores and flags
artifact slices, on the slices :mod:`~mriprep.stages.mask_slices.lattice` cuts; both read
the per-slice statistics, foreground and neighbours of
:mod:`~mriprep.stages.mask_slices.statistics`. This module holds the parameters, chooses
the axes, combines the two detections and marks (and optionally fills) the flagged
slices.
"""

from __future__ import annotations

import numpy as np

from mriprep.core.volume import Volume
from mriprep.stages import StageOutput, stage
from mriprep.stages.intensity import robust_threshold
from mriprep.stages.mask_slices.artifacts import AxisFindings, score_axis
from mriprep.stages.mask_slices.incomplete import find_incomplete
from mriprep.stages.mask_slices.lattice import scoring_lattice, slice_stack
from mriprep.stages.mask_slices.params import MaskSlicesParams
from mriprep.stages.mask_slices.statistics import prepare, slice_profiles
from mriprep.stages.qc_declaration import FLAGGED_SLICES, InvalidCause, QCMetric, StageQC


def artifact_axes(spacing, params: MaskSlicesParams) -> tuple[int, ...]:
    """The axes searched for artifact slices (see :attr:`MaskSlicesParams.axes`)."""
    spacing = np.asarray(spacing, dtype=np.float64)
    thickest = int(np.argmax(spacing))
    if params.axes == "all":
        return (0, 1, 2)
    if params.axes == "acquisition":
        return (thickest,)
    isotropic = spacing.max() <= params.isotropy_tolerance * spacing.min()
    return (0, 1, 2) if isotropic else (thickest,)


def fill_from_neighbours(data: np.ndarray, axis: int, flagged: list[int]) -> np.ndarray:
    """A copy of ``data`` whose ``flagged`` slices along ``axis`` are interpolated linearly
    from the nearest unflagged slices (copied from the one side where only one exists)."""
    out = data.copy()
    x = np.moveaxis(out, axis, 0)
    n = x.shape[0]
    bad = set(flagged)
    good = [i for i in range(n) if i not in bad]
    if not good:
        return out
    for s in flagged:
        below = [i for i in good if i < s]
        above = [i for i in good if i > s]
        if below and above:
            a, b = below[-1], above[0]
            wa = np.float32((b - s) / (b - a))
            x[s] = wa * x[a] + (np.float32(1) - wa) * x[b]
        else:
            x[s] = x[below[-1] if below else above[0]]
    return out


def _slices_by_cause(metrics, shape) -> dict[str, np.ndarray]:
    """Where the incomplete and the artifact slices lie, from the slice lists this
    stage records per axis (``axis_<i>``: ``incomplete`` and ``artifact``)."""
    where = {"incomplete slice": np.zeros(shape, bool), "artifact slice": np.zeros(shape, bool)}
    for axis in range(len(shape)):
        found = metrics.get(f"axis_{axis}", {})
        for kind, cause in (("incomplete", "incomplete slice"), ("artifact", "artifact slice")):
            for index in found.get(kind, {}):
                np.moveaxis(where[cause], axis, 0)[int(index)] = True
    return where


def _flagged_by_axis(metrics) -> dict[int, list[int]]:
    return {int(name.rpartition("_")[2]): list(found.get("flagged", []))
            for name, found in metrics.items()
            if name.startswith("axis_") and isinstance(found, dict)}


# What the QC report shows of this stage: how many slices it masked, and which ones, in
# two colours by cause.
_QC = StageQC(
    metrics=(QCMetric("masked_slices", "masked slices",
                      "incomplete and artifact slices the mask_slices stage masked",
                      key="n_flagged", unit="slices", better="lower", judge="high",
                      column=True, min_effect=3, bounds=(0, None)),),
    causes=(InvalidCause("incomplete slice", "zero-filled, constant or cut slice, masked",
                         "#ff9900", "orange"),
            InvalidCause("artifact slice", "spike, dropout or motion slice, masked",
                         "#00e5ff", "cyan")),
    locate_causes=_slices_by_cause,
    readings={FLAGGED_SLICES: _flagged_by_axis},
)


@stage("mask_slices", MaskSlicesParams, qc=_QC)
def mask_slices(volume: Volume, params: MaskSlicesParams) -> StageOutput:
    """Flag incomplete and artifact slices; mark them invalid and optionally fill them.

    Parameters
    ----------
    volume : Volume
        Sanitised data (non-finite voxels are ignored, never used).
    params : MaskSlicesParams

    Returns
    -------
    StageOutput
        The volume with flagged slices ``valid=False`` (and filled if ``params.fill``).
        Metrics per axis (``axis_0`` ...): incomplete slices by kind, artifact slices with
        their scores, the robust centre and spread of the scores; plus the searched axes
        and the number of flagged slices.
    """
    data, valid = volume.data, volume.valid
    usable = valid & np.isfinite(data)
    all_usable = bool(usable.all())
    threshold = robust_threshold(data if all_usable else data[usable])
    searched = artifact_axes(volume.spacing, params)
    prepared = prepare(data, usable, threshold)
    profiles = slice_profiles(data, usable)
    findings: dict[int, AxisFindings] = {}
    for axis in range(3):
        incomplete = find_incomplete(data, usable, axis, params, profiles[axis],
                                     prepared.foreground)
        if axis in searched:
            lattice = scoring_lattice(data.shape, volume.affine, axis, params.score_spacing_mm)
            found = score_axis(slice_stack(prepared, axis, lattice), axis, set(incomplete),
                               params)
            found.lattice_step = tuple(st for i, st in enumerate(lattice.steps) if i != axis)
        else:
            found = AxisFindings(axis=axis)
        found.incomplete = incomplete
        findings[axis] = found

    warnings: list[str] = []
    new_valid = valid.copy()
    out = data
    for axis, found in findings.items():
        flagged = found.flagged
        if not flagged:
            continue
        np.moveaxis(new_valid, axis, 0)[flagged] = False
        if params.fill == "neighbours":
            out = fill_from_neighbours(out, axis, flagged)
        n = data.shape[axis]
        warnings.append(
            f"axis {axis}: {len(found.incomplete)} incomplete and {len(found.artifacts)} "
            f"artifact slice(s) of {n} marked invalid: {flagged}"
        )
        if len(flagged) > n // 4:
            warnings.append(
                f"axis {axis}: {len(flagged)} of {n} slices are bad; check the scan "
                "before training on it"
            )
    metrics = {
        "artifact_axes": list(searched),
        "n_flagged": sum(len(f.flagged) for f in findings.values()),
        "n_incomplete": sum(len(f.incomplete) for f in findings.values()),
        "n_artifact": sum(len(f.artifacts) for f in findings.values()),
        "invalid_fraction": 1.0 - np.count_nonzero(new_valid) / new_valid.size,
        **{f"axis_{axis}": f.to_metrics() for axis, f in findings.items()},
    }
    return StageOutput(volume.replace(data=out, valid=new_valid), metrics, warnings)
