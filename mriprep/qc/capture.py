"""What the pipeline did to a subject's voxels, seen while the worker holds the data.

A :class:`Capture` watches :func:`mriprep.pipelines.execute.run_stages` step by step. It
keeps the volume as loaded (the native scan, for its mosaic and its quality metrics) and,
for every stage that marks voxels invalid without changing the grid, which voxels and
why: a *cause map* (uint8, codes of :mod:`mriprep.qc.causes`) on that stage's grid. The
causes are those the stage declares (:class:`~mriprep.stages.qc_declaration.StageQC`),
told apart by its own ``locate_causes`` when it declares several; a stage that declares
none paints "other invalid".
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
from mriprep.qc.causes import OTHER, cause_codes
from mriprep.stages import declared_stage
from mriprep.stages.qc_declaration import StageQC


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
        stage = declared_stage(step)
        declaration = stage.qc if stage is not None and stage.qc is not None else StageQC()
        record = after.provenance[-1] if after.provenance else None
        codes = declaration.cause_codes(record.metrics if record is not None else {},
                                        newly, cause_codes(), OTHER)
        layer = self._layer(after)
        layer.causes[newly] = codes[newly]

    def _layer(self, volume: Volume) -> CauseLayer:
        output_side = volume.applied is not None
        for layer in self.layers:
            if layer.causes.shape == volume.shape and layer.output_side == output_side \
                    and np.allclose(layer.affine, volume.affine):
                return layer
        layer = CauseLayer(np.zeros(volume.shape, np.uint8), volume.affine.copy(), output_side)
        self.layers.append(layer)
        return layer
