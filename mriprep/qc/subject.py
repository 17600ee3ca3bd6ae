"""One subject's QC: its mosaics and quality metrics, from the worker's data or the cache.

:func:`subject_qc` is the one computation; two callers feed it:

* the worker (:mod:`mriprep.run.subject`), right after the entry is written, with the
  volume as loaded, the :class:`~mriprep.qc.capture.Capture` of what each stage
  invalidated, and the final volume, all still in memory (the run's path: nothing is
  read twice);
* :func:`qc_from_cache`, for an entry whose QC was not made during its run
  (``--no-report``), from the cached tensors, the sidecar and the input file while it
  holds what was cached. The cache keeps only the merged ``valid`` mask; the causes are
  found again by replaying the cheap steps on the input's grid, and where that cannot
  be done the pictures draw invalid voxels in one colour and say so.

Pictures (JPEG, see :mod:`mriprep.qc.mosaic`): ``input`` (the native scan, filled voxels
and masked slices coloured), ``output`` (the cached image and why each invalid voxel is
invalid), ``template`` (the template's brain outline over a registered output) and
``labels`` (the label map over the output). Metrics: the image-quality metrics of
:mod:`mriprep.qc.metrics` on the native scan, the output's invalid fraction, and the
measures each stage of the pipeline declares (:class:`~mriprep.stages.qc_declaration.
QCMetric`: filled voxels, masked slices, registration similarity ...), which ``qc.json``
keeps with their declarations so that the report and ``mriprep check`` read them
without importing a stage.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

import numpy as np
from scipy import ndimage

from mriprep.core.errors import CacheError
from mriprep.core.volume import Volume
from mriprep.qc import mosaic
from mriprep.qc.capture import CauseLayer
from mriprep.qc.causes import OUTSIDE, UNRECORDED, cause_names, not_finite_code
from mriprep.qc.views import PLANES, Points, index_map, on_grid, sample, view_of
from mriprep.qc.structures import label_counts
from mriprep.stages.intensity import foreground_mask

# The quality metrics use every other voxel along each axis: they are medians, means and
# spreads over hundreds of thousands of voxels, and an eighth of the voxels costs an
# eighth of the time.
METRIC_STRIDE = 2


@dataclass(frozen=True)
class OutputData:
    """The cached output of a subject: arrays on its grid, and how that grid relates to
    the native scan (``template_to_subject`` when registered, else the same world)."""

    image: np.ndarray
    valid: np.ndarray
    affine: np.ndarray
    label: np.ndarray | None = None
    template_to_subject: np.ndarray | None = None


@dataclass(frozen=True)
class TemplateBrain:
    mask: np.ndarray
    affine: np.ndarray
    name: str


@dataclass
class SubjectQC:
    """What the report shows of one subject besides its run record."""

    metrics: dict[str, float] = field(default_factory=dict)
    # The stages' declarations of their measures in ``metrics`` (QCMetric.to_json).
    metric_info: dict[str, dict[str, Any]] = field(default_factory=dict)
    images: dict[str, bytes] = field(default_factory=dict)
    # Per picture, the overlay colours it shows (cause names, or label values).
    legends: dict[str, list[str]] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)
    source: str = "run"
    # Where the tissue classes of the metrics were fitted (TissueMasks.source).
    tissue_region: str = ""
    seconds: float = 0.0

    def to_json(self) -> dict[str, Any]:
        return {"metrics": self.metrics, "metric_info": self.metric_info,
                "images": sorted(self.images),
                "legends": self.legends, "notes": self.notes, "source": self.source,
                "tissue_region": self.tissue_region, "seconds": round(self.seconds, 4)}


def subject_qc(
    native: Volume | None,
    layers: Iterable[CauseLayer],
    output: OutputData | None,
    template: TemplateBrain | None,
    records: Iterable[Mapping[str, Any]],
    *,
    unexplained: int = OUTSIDE,
    source: str = "run",
) -> SubjectQC:
    """Mosaics and metrics of one subject; never raises (what fails becomes a note).

    Parameters
    ----------
    native
        The scan as loaded (NaN and extreme values as read), or None when it could not
        be read.
    layers
        The cause maps of what stages invalidated on the native side.
    output
        The cached output, or None for a failed subject.
    template
        The registration template's brain on its grid, when the pipeline registers.
    records
        The stage records as JSON (``stage``, ``metrics``), for mriprep's own metrics.
    unexplained
        How invalid output voxels that no layer explains are drawn: outside the scan (the
        worker knows every cause) or "cause not recorded" (a report made from the cache).
    """
    start = time.perf_counter()
    qc = SubjectQC(source=source)
    layers = list(layers)
    records = list(records)
    focus: list = []
    steps = [
        ("focus", lambda: _focus(layers), True),
        ("input", lambda: _input_picture(native, layers, focus), native is not None),
        ("metrics", lambda: _native_metrics(native, layers, output, template, qc.notes),
         native is not None and output is not None),
        ("output", lambda: _output_pictures(output, layers, template, unexplained, focus),
         output is not None),
        ("pipeline metrics", lambda: _own_metrics(output, records), output is not None),
    ]
    for what, compute, possible in steps:
        if not possible:
            continue
        try:
            done = compute()
        except Exception as exc:  # noqa: BLE001 - a QC problem must not fail the subject
            qc.notes.append(f"{what}: could not be computed ({type(exc).__name__}: {exc})")
            continue
        if what == "focus":
            focus = done
        elif what == "metrics":
            qc.tissue_region, metrics = done
            qc.metrics.update(metrics)
        elif what == "pipeline metrics":
            measures, info = done
            qc.metrics.update(measures)
            qc.metric_info.update(info)
        else:
            for name, (picture, legend) in done.items():
                qc.images[name] = picture
                qc.legends[name] = legend
    if native is None:
        qc.notes.append("input: the scan could not be read, so it is not shown")
    if output is not None:
        if template is None:
            qc.notes.append("template: the pipeline does not register, so no outline")
        if output.label is None:
            qc.notes.append("labels: this subject has no label map")
        elif "labels" in qc.legends:
            qc.notes += _label_table_notes(qc.legends["labels"])
    qc.seconds = time.perf_counter() - start
    return qc


# -- pictures -------------------------------------------------------------------------

def _input_picture(native: Volume, layers: list[CauseLayer],
                   focus: list) -> dict[str, tuple[bytes, list]]:
    data = native.data
    finite = np.isfinite(data)
    view = view_of(*_box_mask(data, finite, native.affine), focus=focus)
    points = {p: [Points(pts) for pts in tiles] for p, tiles in view.all_points().items()}
    to_native = index_map(native.affine)
    tiles = {p: [pts.read(data, to_native, np.nan) for pts in points[p]] for p in PLANES}
    rgb = mosaic.grey(tiles)
    shown: set[int] = set()
    for plane in PLANES:
        for tile, raw, pts in zip(rgb[plane], tiles[plane], points[plane]):
            causes = _layer_causes(layers, pts, None)
            # Voxels not finite as read, in the colour of the stage that fills them, even
            # when the subject failed before that stage recorded them.
            scanned = pts.inside(to_native, data.shape)
            causes[(causes == 0) & scanned & ~np.isfinite(raw)] = not_finite_code()
            shown.update(np.unique(causes[causes > 0]).tolist())
            mosaic.paint_causes(tile, causes)
    return {"input": (mosaic.encode_jpeg(mosaic.compose(rgb)), cause_names(shown))}


def _output_pictures(output: OutputData, layers: list[CauseLayer],
                     template: TemplateBrain | None, unexplained: int, focus: list):
    if output.template_to_subject is not None and focus:
        to_template = np.linalg.inv(output.template_to_subject)
        focus = [tuple(to_template[:3, :3] @ np.asarray(p) + to_template[:3, 3]) for p in focus]
    view = view_of(*_box_mask(output.image, output.valid, output.affine), focus=focus)
    points = {p: [Points(pts) for pts in tiles] for p, tiles in view.all_points().items()}
    to_out = index_map(output.affine)
    image = np.asarray(output.image, dtype=np.float32)  # a uint8 output has no NaN fill
    tiles = {p: [sample(image, to_out, pts.points, 1, np.nan) for pts in points[p]]
             for p in PLANES}
    base = mosaic.grey(tiles)
    pictures = {}

    causes_rgb = {p: [t.copy() for t in ts] for p, ts in base.items()}
    shown: set[int] = set()
    for plane in PLANES:
        for tile, pts in zip(causes_rgb[plane], points[plane]):
            invalid = ~pts.read(output.valid, to_out, True)
            known = _layer_causes(layers, pts, output.template_to_subject, support=True)
            causes = np.where(invalid, np.where(known > 0, known, unexplained), 0)
            shown.update(np.unique(causes[causes > 0]).tolist())
            mosaic.paint_causes(tile, causes.astype(np.uint8))
    pictures["output"] = (mosaic.encode_jpeg(mosaic.compose(causes_rgb)), cause_names(shown))

    if template is not None:
        outline_rgb = {p: [t.copy() for t in ts] for p, ts in base.items()}
        to_template = index_map(template.affine)
        for plane in PLANES:
            for tile, pts in zip(outline_rgb[plane], points[plane]):
                mosaic.paint_outline(tile, pts.read(template.mask, to_template, False))
        pictures["template"] = (mosaic.encode_jpeg(mosaic.compose(outline_rgb)),
                                [f"brain of template {template.name}"])
    if output.label is not None:
        label_rgb = {p: [t.copy() for t in ts] for p, ts in base.items()}
        tiles = {p: [pts.read(output.label, to_out, 0) for pts in points[p]] for p in PLANES}
        # The legend first: whether the table names the map depends on all its values
        # (the map's, so that every page of a cohort names a value alike).
        legend = mosaic.label_legend(np.unique(np.concatenate(
            [np.unique(t) for ts in tiles.values() for t in ts])), label_counts(output.label))
        colours = {entry["value"]: entry["colour"] for entry in legend}
        for plane in PLANES:
            for tile, label in zip(label_rgb[plane], tiles[plane]):
                mosaic.paint_labels(tile, label, colours)
        pictures["labels"] = (mosaic.encode_jpeg(mosaic.compose(label_rgb)), legend)
    return pictures


def _label_table_notes(legend: list[dict]) -> list[str]:
    """What the label legend could not name from the table, counted and named."""
    missing = [str(entry["value"]) for entry in legend if not entry["in_table"]]
    if not missing:
        return []
    if len(missing) == len(legend):
        return [f"labels: the map is not numbered as FreeSurfer numbers labels ("
                f"{mosaic.LABEL_TABLE_NAME} names fewer than half of its values), so its "
                f"{len(missing)} value(s) are shown as numbers"]
    return [f"labels: {len(missing)} value(s) shown are not in {mosaic.LABEL_TABLE_NAME} "
            f"and are shown as numbers: {', '.join(missing)}"]


def _layer_causes(layers: list[CauseLayer], points: Points,
                  world_change: np.ndarray | None, support: bool = False) -> np.ndarray:
    """The recorded cause at each display point (0: none), from every layer.

    ``world_change`` maps the display world (the output's) to the native world; None
    draws the native scan, which shows the native-side layers only. ``support`` reads
    the 8 voxels around each point, not the nearest one: an output voxel is invalid when
    any voxel of its interpolation kernel is, and must take that voxel's cause.
    """
    causes = np.zeros(points.points.shape[:-1], np.uint8)
    for layer in layers:
        if layer.output_side and world_change is None:
            continue
        change = None if layer.output_side else world_change
        to_index = index_map(layer.affine, change)
        found = points.read_support(layer.causes, to_index) if support and not \
            layer.output_side else points.read(layer.causes, to_index, 0)
        causes = np.where(causes > 0, causes, found)
    return causes


# Voxels of one cause within this distance (mm) of each other count as one defect;
# farther apart (two masked slices 27 mm apart), each gets a tile of its own.
_DEFECT_GAP_MM = 8.0
_FOCUS_SAMPLE = 50_000


def _focus(layers: list[CauseLayer]) -> list[tuple[float, float, float]]:
    """The world centre of each defect (a connected group of voxels of one cause, on an
    8 mm lattice), smallest first: a small blob matters more than the slices around it.
    Layers recorded after the registration was applied are left out (their world is the
    output's)."""
    found = []
    for layer in layers:
        if layer.output_side:
            continue
        where = np.flatnonzero(layer.causes)
        codes = layer.causes.ravel()[where]
        for code in np.unique(codes):
            picked = where[codes == code]
            count = picked.size
            picked = picked[:: max(1, picked.size // _FOCUS_SAMPLE)]
            ijk = np.array(np.unravel_index(picked, layer.causes.shape)).T
            world = ijk @ layer.affine[:3, :3].T + layer.affine[:3, 3]
            cells = np.floor((world - world.min(0)) / _DEFECT_GAP_MM).astype(np.intp)
            occupied = np.zeros(cells.max(0) + 1, dtype=bool)
            occupied[tuple(cells.T)] = True
            groups, n = ndimage.label(occupied, structure=np.ones((3, 3, 3)))
            member = groups[tuple(cells.T)]
            for group in range(1, n + 1):
                inside = member == group
                share = int(round(count * inside.mean()))
                found.append((share, tuple(world[inside].mean(axis=0).tolist())))
    return [centre for _, centre in sorted(found)]


def _box_mask(data: np.ndarray, usable: np.ndarray, affine: np.ndarray, step: int = 4):
    """The foreground of a coarse copy, and its affine: all a view's box needs."""
    coarse = data[::step, ::step, ::step]
    ok = usable[::step, ::step, ::step] & np.isfinite(coarse)
    scaled = affine @ np.diag([step, step, step, 1.0])
    return foreground_mask(coarse, ok), scaled


# -- metrics --------------------------------------------------------------------------

def _native_metrics(native: Volume, layers: list[CauseLayer], output: OutputData | None,
                    template: TemplateBrain | None,
                    notes: list[str] | None = None) -> tuple[str, dict[str, float]]:
    """Where the tissue classes were fitted, and the image-quality metrics of the native
    scan, invalid voxels left out; why a metric is n/a goes to ``notes``."""
    from mriprep.qc.metrics import image_quality, tissue_masks

    s = METRIC_STRIDE
    data = native.data[::s, ::s, ::s]
    affine = native.affine @ np.diag([s, s, s, 1.0])
    usable = np.isfinite(data)
    for layer in (layer for layer in layers if not layer.output_side):
        usable &= on_grid(layer.causes, layer.affine, data.shape, affine) == 0
    brain, where = None, "head (no brain mask)"
    if native.label is not None and (native.label > 0).any():
        brain, where = native.label[::s, ::s, ::s] > 0, "label map"
    elif template is not None and output is not None and output.template_to_subject is not None:
        # The template's brain in the subject's world: through the registration.
        brain = on_grid(template.mask, output.template_to_subject @ template.affine,
                        data.shape, affine, False)
        where = "template"
    spacing = tuple(float(v) for v in np.linalg.norm(affine[:3, :3], axis=0))
    masks = tissue_masks(data, usable, brain=brain, source=where, spacing=spacing)
    return masks.source, image_quality(data, usable, masks, notes)


def _own_metrics(output: OutputData, records: list[Mapping[str, Any]]
                 ) -> tuple[dict[str, float], dict[str, dict[str, Any]]]:
    """What the pipeline had to change or doubt: the output's invalid fraction, and the
    measures each stage of ``records`` declares, with their declarations (as JSON)."""
    from mriprep.stages import declared_stage

    metrics = {"invalid_fraction": float(1.0 - np.count_nonzero(output.valid)
                                         / output.valid.size)}
    info: dict[str, dict[str, Any]] = {}
    for record in records:
        stage = declared_stage(str(record.get("stage")))
        if stage is None or stage.qc is None:
            continue
        found = stage.qc.measures(record.get("metrics") or {})
        for metric in stage.qc.metrics:
            # A stage used twice shows its last run's measure, what the output holds.
            if metric.name in found:
                metrics[metric.name] = found[metric.name]
                info[metric.name] = metric.to_json()
    return metrics, info


# -- from the cache -------------------------------------------------------------------

def qc_from_cache(cache, key: str) -> SubjectQC:
    """The QC of a cached entry made after its run (see the module docstring).

    The native scan is shown when the input file still holds what was cached (its
    SHA-256 as recorded). The causes of invalid voxels are found again by replaying the
    pipeline's steps that run on the input's grid (those before the step that hands over
    or applies a transform: reorient, sanitize, mask_slices ...; cheap, and
    deterministic), when the pipeline file still hashes as recorded; else invalid voxels
    are drawn in one colour, "cause not recorded".
    """
    from mriprep.cache.sidecar import read_sidecar
    from mriprep.core.hashing import sha256_file
    from mriprep.inputs.readers import load_volume

    sidecar = read_sidecar(cache, key)
    arrays = {name: cache.load_tensor(key, name) for name in ("image", "valid", "label")
              if name in sidecar.tensor_names}
    if sidecar.affine is None:
        raise CacheError(f"{cache.entry_dir(key) / 'meta.json'} records no affine; rebuild "
                         "the entry with `mriprep run --force`")
    output = OutputData(
        image=np.asarray(arrays["image"], dtype=np.float32), valid=np.asarray(arrays["valid"]),
        affine=sidecar.affine, label=arrays.get("label"),
        template_to_subject=sidecar.template_to_subject)
    records = sidecar.records
    notes = ["made from the cache after the run (the run made no QC for this entry)"]
    native, layers, unexplained = None, [], UNRECORDED
    paths = {role: (Path(f.path), f.sha256) for role, f in sidecar.inputs.items() if f.path}
    image, recorded = paths.get("image", (None, None))
    if image is None or not image.is_file():
        notes.append(f"input: {image} no longer exists, so the native scan is not shown")
    elif sha256_file(image) != recorded:
        notes.append(f"input: {image} has changed since it was cached (another SHA-256), "
                     "so the native scan is not shown")
    else:
        label, label_sha = paths.get("label", (None, None))
        same_label = label is not None and label.is_file() and sha256_file(label) == label_sha
        native = load_volume(image, label if same_label else None, header=sidecar.nifti_form)
        replayed = _replay(native, sidecar.pipeline_source, sidecar.pipeline_hash)
        if isinstance(replayed, str):
            notes.append(replayed)
        else:
            layers, unexplained = replayed, OUTSIDE
    qc = subject_qc(native, layers, output, template_from_records(records), records,
                    unexplained=unexplained, source="cache")
    qc.notes = notes + qc.notes
    return qc


def _replay(native: Volume, source: str | None,
            recorded_hash: str) -> list[CauseLayer] | str:
    """The cause layers of the steps before the first grid or transform step of the
    pipeline ``source`` (as cached: ``recorded_hash``), run again on the native scan; or
    why they cannot be."""
    import dataclasses

    from mriprep.pipelines import load_pipeline
    from mriprep.pipelines.execute import run_stages
    from mriprep.qc.capture import Capture
    from mriprep.stages import get_stage

    try:
        pipeline = load_pipeline(source)
    except Exception as exc:  # noqa: BLE001 - any reason means: not replayable
        return (f"causes of invalid voxels not drawn: the pipeline {source} cannot be "
                f"loaded again ({exc})")
    if pipeline.hash != recorded_hash:
        return (f"causes of invalid voxels not drawn: the pipeline {source} has changed "
                "since this entry was cached")
    prefix = []
    for step in pipeline.steps:
        declared = get_stage(step.name)
        if declared.hands_over_transform or declared.applies_transform:
            break
        prefix.append(step)
    capture = Capture(loaded=native)
    try:
        run_stages(native, dataclasses.replace(pipeline, steps=tuple(prefix)), observe=capture)
    except Exception as exc:  # noqa: BLE001 - a replay problem is a note, not a failure
        return f"causes of invalid voxels not drawn: replaying the pipeline failed ({exc})"
    return capture.problem or capture.layers  # a problem of the capture's own is a note


def template_from_records(records: Iterable[Mapping[str, Any]]) -> TemplateBrain | None:
    """The template brain of the step that registered, from stage records or steps as
    ``{"stage": name, "params": {...}}``; None when no step hands over a transform."""
    from mriprep.inputs.templates import load_template
    from mriprep.stages import all_stages
    from mriprep.stages.registration.template import template_brain_mask

    registering = {s.name: s for s in all_stages() if s.hands_over_transform}
    for record in records:
        declared = registering.get(record.get("stage"))
        if declared is None or not declared.template_fields:
            continue
        params = record.get("params", {})
        fields = declared.template_fields
        template = params.get(fields[0])
        brain = params.get(fields[1]) if len(fields) > 1 else None
        return TemplateBrain(template_brain_mask(template, brain),
                             load_template(template).affine, str(template))
    return None

