"""What the pipeline did to a subject's voxels, seen while the worker holds the data.

A :class:`Capture` watches :func:`mriprep.run.subject.run_stages` step by step. It keeps
the volume as loaded (the native scan, for its mosaic and its quality metrics) and, for
every stage that marks voxels invalid without changing the grid, which voxels and why:
a *cause map* (uint8, codes of :data:`mriprep.qc.mosaic.CAUSES`) on that stage's grid.
Nothing is copied for stages that invalidate nothing. Once the grid changes (resample),
an invalid output voxel takes the cause of any voxel of its interpolation kernel (the
resample stage's own rule), and those that no cause map explains lie outside the
input's field of view; the report draws them so.

The cache stores only the final ``valid`` mask, in which these causes are merged: this is
the one moment they can be told apart.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mriprep.core.volume import Volume

FILLED, INCOMPLETE, ARTIFACT, OTHER = 1, 2, 3, 4
# Stages whose newly invalid voxels have one known cause.
_STAGE_CAUSE = {"sanitize": FILLED}


@dataclass
class CauseLayer:
    """The causes recorded on one grid (voxel-to-world ``affine``). ``output_side``: the
    grid is the output's, after the registration was applied (a stage after resample
    invalidated voxels), so its world is the template's, not the subject's."""

    causes: np.ndarray
    affine: np.ndarray
    output_side: bool = False


@dataclass
class Capture:
    """Collects the cause layers; pass it to ``run_stages`` as ``observe``, with
    ``loaded`` set to the volume as read.

    It never raises into the pipeline: a problem of its own is kept in ``problem`` and
    ends the capture (the subject is processed as if QC were off for the causes).
    """

    loaded: Volume | None = None
    layers: list[CauseLayer] = field(default_factory=list)
    problem: str = ""

    def __call__(self, step: str, before: Volume, after: Volume) -> None:
        if self.problem:
            return
        try:
            self._record(step, before, after)
        except Exception as exc:  # noqa: BLE001 - QC must not fail a subject
            self.problem = f"the causes of invalid voxels were not recorded after {step} " \
                           f"({type(exc).__name__}: {exc})"

    def _record(self, step: str, before: Volume, after: Volume) -> None:
        if before.shape != after.shape or not np.allclose(before.affine, after.affine):
            return  # a new grid: its invalid voxels are explained by the layers so far
        newly = before.valid & ~after.valid
        if not newly.any():
            return
        layer = self._layer(after)
        layer.causes[newly] = _STAGE_CAUSE.get(step, OTHER)
        if step == "mask_slices":
            _split_masked_slices(layer.causes, newly, after)

    def _layer(self, volume: Volume) -> CauseLayer:
        output_side = volume.applied is not None
        for layer in self.layers:
            if layer.causes.shape == volume.shape and layer.output_side == output_side \
                    and np.allclose(layer.affine, volume.affine):
                return layer
        layer = CauseLayer(np.zeros(volume.shape, np.uint8), volume.affine.copy(), output_side)
        self.layers.append(layer)
        return layer


def _split_masked_slices(causes: np.ndarray, newly: np.ndarray, volume: Volume) -> None:
    """Tell incomplete from artifact slices, by the slice lists mask_slices recorded."""
    record = volume.record_of("mask_slices")
    metrics = record.metrics if record is not None else {}
    for axis in range(3):
        found = metrics.get(f"axis_{axis}", {})
        for kind, code in (("incomplete", INCOMPLETE), ("artifact", ARTIFACT)):
            for index in found.get(kind, {}):
                plane = np.moveaxis(causes, axis, 0)[int(index)]
                plane[np.moveaxis(newly, axis, 0)[int(index)]] = code
