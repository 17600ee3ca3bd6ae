"""Label maps against the class table training will use (``mriprep check --lut TABLE``).

Training maps FreeSurfer-numbered label maps to classes with a label table
(:class:`mriprep.training.labels.LabelTable`): rules rewrite some values first
(FastSurfer's ``aparc``/``aseg`` processing, Desikan-only parcels, the corpus callosum),
then each value is looked up. Everything that makes training refuse a map, or a split,
is found here first, on the cache as it is:

``lut-unknown-values`` (error, per label map)
    values the table does not list after the rules, named with their voxels; a
    ``lut-unknown-background`` warning instead when the table counts them as background
    (``LabelTable(unknown="background")``, ``--unknown background``). Negative values
    are always an error: no table lists them.
``lut-cortex-lost`` (error, per label map)
    cortex (3/42) without cortical parcels: the ``aparc`` rules would send all of it to
    background (an ``aseg.mgz``); the table's own message, with its fix.
``lut-absent-classes`` (error, per split)
    classes of the axial/coronal view (and of the sagittal view, where left and right
    merge) that no label map of the split holds: training refuses them
    (:func:`mriprep.training.labels.derived.check_absent_classes`); a
    ``lut-absent-allowed`` warning with ``absent_classes="allow"``. The maps counted are
    those the table can map (unknown values count as background); a map whose cortex
    would be lost is left out, as training leaves it out.
``label-side-swap`` (error, per label map)
    left/right pairs of the table on the wrong side of the head in world coordinates
    (:mod:`mriprep.check.label_sides`): a mirrored map, swapped hemispheres, or swapped
    structures.
``label-off-anatomy`` (warning, per label map)
    labels where the image shows no head, or off the brain's labelled mass
    (:mod:`mriprep.check.label_anatomy`).
``label-misfit`` (warning, per label map)
    the map does not lie on its image: white matter and cortex separate better with the
    map moved by a voxel or two, or hardly at all (another person's map;
    :mod:`mriprep.check.label_fit`).
``label-islands`` (warning, per label map)
    structures with voxels scattered as specks far from their body
    (:mod:`mriprep.check.label_islands`), over the structures training learns: a value
    the table's rules rewrite first (the unknown cortex 1000/2000, vessels, 3/42 under
    ``aparc``) is not judged: the summary's ``islands_not_judged`` counts its voxels, and
    ``lut-rewrites`` names the rule that rewrites them.
``label-volume``, ``label-structure-missing`` (warnings, per label map)
    structures far larger or smaller than the cohort's, or missing where the cohort has
    them, over the classes the table makes (:mod:`mriprep.check.label_volumes`).
``lut-rewrites`` (info, per rule)
    the voxels each rule rewrote over the cohort, and the label maps with the most, so
    that nothing is mapped away unseen.

With a table, its values after the rules are the allowed set: the plain ``label-values``
check, which compares raw values (and would refuse 1000/2000, 251-255 or 3/42, which the
rules rewrite), does not run (:func:`~mriprep.check.cache_check.check_cache` refuses
``allowed_labels`` and a table together).

Each label map is prepared once (the rules are the costly part; docs/benchmarks.md) and
its distinct values looked up in the axial and sagittal views (coronal has the axial
classes; :func:`class_counts`), in reader threads (the rules' NumPy and SciPy work
releases the GIL). The checks that look at where labels lie share one pass that finds
each structure's box (:mod:`mriprep.check.label_boxes`), and each map's spatial findings
come with their voxels (:mod:`mriprep.check.label_regions`), which the check keeps for
the QC report. Nothing else is written:
the derived classes that training keeps (``CACHE/derived``) are neither read nor made.

``check`` sits below ``training`` (docs/design.md, "Layers"), so the table is handed in
(the command line builds it) and used through :class:`ClassTable`, the part of
:class:`~mriprep.training.labels.LabelTable` the check needs.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Callable, Protocol

import numpy as np

from mriprep.cache import Cache, IndexEntry
from mriprep.check.entries import EntryScan, map_in_threads
from mriprep.check.label_anatomy import (STEP as ANATOMY_STEP, AnatomyReading,
                                          anatomy_and_where)
from mriprep.check.label_boxes import labelled_box, structure_boxes
from mriprep.check.label_fit import FitReading, read_fit
from mriprep.check.label_islands import IslandReading, read_islands
from mriprep.check.label_regions import Region, map_regions
from mriprep.check.label_sides import SideReading, read_sides, side_pairs
from mriprep.check.label_volumes import VolumeJudgement, judge_volumes, listed
from mriprep.check.report import by_name
from mriprep.core.errors import InputError, MriprepError
from mriprep.core.findings import Finding, named

# The views whose classes differ: coronal has the axial classes; sagittal merges left
# and right (a class absent there is absent from both sides).
JUDGED_VIEWS = ("axial", "sagittal")
ABSENT_CLASSES = ("error", "allow")
UNKNOWN_SHOWN = 10   # unknown values named (and counted) per label map
MOST_SHOWN = 3       # label maps named per rewrite rule
ABSENT_SHOWN = 40    # absent classes named per split (the report's JSON has them all)


class ClassTable(Protocol):
    """What the check uses of :class:`mriprep.training.labels.LabelTable`."""

    processing: str
    cortex: str
    unknown: str
    lut: Any

    def prepare(self, labels: np.ndarray, subject: str = "") -> Any:
        """A dataclass with ``labels`` (the map after the rules) and ``moved``."""

    def rewritten_values(self) -> frozenset[int]:
        """The values the rules rewrite before the lookup."""

    def lookup(self, prepared: Any, view: str = "axial", subject: str = "") -> Any: ...

    def num_classes(self, view: str = "axial") -> int: ...

    def class_names(self, view: str = "axial") -> tuple[str, ...]: ...

    def describe(self) -> dict: ...


@dataclass
class MapJudgement:
    """What the table made of one label map."""

    key: str
    class_counts: dict[str, np.ndarray] | None = None  # view -> voxels per class
    moved: dict[str, int] = field(default_factory=dict)  # rule -> voxels rewritten
    unknown: dict[int, int] = field(default_factory=dict)  # value -> voxels (first few)
    unknown_values: int = 0
    unknown_voxels: int = 0
    negative: bool = False
    cortex_lost: str | None = None   # the table's reason
    unreadable: str | None = None
    sides: SideReading | None = None  # where its left/right pairs lie
    fit: FitReading | None = None     # how it lies on its image
    anatomy: AnatomyReading | None = None  # labels where the image shows no head
    islands: IslandReading | None = None   # structures scattered far from their body
    voxel_mm3: float = 1.0
    regions: dict[str, Region] = field(default_factory=dict)  # code -> its voxels


def table_source(table: ClassTable) -> str:
    return getattr(table.lut, "source", "") or "(in memory)"


def background_twin(table: ClassTable) -> ClassTable:
    """``table`` counting unknown values as background, so that the check reports them
    instead of stopping at the first; the table's own ``unknown`` then judges them."""
    if table.unknown == "background":
        return table
    return type(table).from_description({**table.describe(), "unknown": "background"},
                                        table_source(table))


def judge_map(cache: Cache, entry: IndexEntry, table: ClassTable,
              label_counts: dict) -> MapJudgement:
    """Prepare one label map once and look it up in :data:`JUDGED_VIEWS` with ``table``
    (which counts unknown values as background, :func:`background_twin`)."""
    result = MapJudgement(entry.key)
    if entry.spacing is not None:
        result.voxel_mm3 = float(np.prod(entry.spacing))
    negative = {v: c for v, c in label_counts.items() if v < 0}
    if negative:  # no table lists them, and the rules refuse them: judged from the pass
        result.negative = True
        result.unknown = dict(sorted(negative.items())[:UNKNOWN_SHOWN])
        result.unknown_values, result.unknown_voxels = len(negative), sum(negative.values())
        return result
    try:
        labels = np.asarray(cache.load_tensor(entry.key, "label"))
    except (MriprepError, OSError, ValueError) as exc:
        result.unreadable = f"{type(exc).__name__}: {exc}"
        return result
    # One pass finds every structure's box: islands work in them, fit in their union.
    boxes = structure_boxes(labels)
    labelled = labelled_box(boxes)
    pairs: dict[str, tuple[int, int]] = {}
    if entry.affine is not None:
        present = [v for v, c in label_counts.items() if c > 0]
        pairs = side_pairs(table.lut.ids, table.lut.names, present)
        result.sides = read_sides(labels, entry.affine, pairs, labelled)
    result.islands = read_islands(
        labels, entry.spacing if entry.spacing is not None else (1.0, 1.0, 1.0),
        dict(zip(map(int, table.lut.ids), table.lut.names)), boxes=boxes,
        skip=table.rewritten_values())
    try:
        image = cache.load_tensor(entry.key, "image")
        valid = valid_mask(cache, entry.key, labels.shape)
    except (MriprepError, OSError, ValueError, RuntimeError):
        # The tensor pass reports an unreadable image or mask (blosc2 raises RuntimeError
        # on a damaged frame); the fit and the head are not judged without them.
        image = None
    anatomy_where: dict[str, np.ndarray] = {}
    if image is not None and np.shape(image) == labels.shape:
        result.fit = read_fit(image, labels, labelled, valid)
        result.anatomy, anatomy_where = anatomy_and_where(image, labels, result.voxel_mm3,
                                                          valid)
    result.regions = _regions(labels, result, pairs, anatomy_where)
    try:
        prepared = table.prepare(labels)
    except InputError as exc:  # cortex without parcels (negative values are above)
        result.cortex_lost = str(exc)
        return result
    result.moved = dict(prepared.moved)
    result.class_counts, voxels = class_counts(table, prepared)
    values = voxels["unknown"]
    result.unknown_values = len(values)
    result.unknown_voxels = int(sum(voxels["count"][values]))
    result.unknown = {int(v): int(voxels["count"][v]) for v in values[:UNKNOWN_SHOWN]}
    return result


def valid_mask(cache: Cache, key: str, shape: tuple[int, ...]) -> np.ndarray:
    """The entry's ``valid`` mask, which the fit and the head are judged on (a masked
    slab holds a fill, not tissue; the grid beyond the scan's field of view holds the
    pipeline's fill).

    Raises
    ------
    ValueError
        The stored mask is not on the map's grid (the tensor pass reports the entry;
        its fit and head are not judged blind).
    """
    valid = np.asarray(cache.load_tensor(key, "valid"), dtype=bool)
    if valid.shape != tuple(shape):
        raise ValueError(f"entry {key}'s valid mask is {valid.shape}, its label map "
                         f"{tuple(shape)}: rebuild the entry with `mriprep run --force`")
    return valid


def _regions(labels: np.ndarray, judged: MapJudgement, pairs: dict[str, tuple[int, int]],
             anatomy_where: dict[str, np.ndarray]) -> dict[str, Region]:
    """The voxels of the map's spatial findings (:mod:`mriprep.check.label_regions`),
    for the findings :func:`_map_findings` makes of ``judged``."""
    sides = judged.sides
    scope = sides.scope() if sides is not None else None
    swapped = tuple(v for name in sides.reversed for v in pairs[name]) \
        if scope == "pairs" else None
    off = judged.anatomy is not None and judged.anatomy.verdict() is not None
    islands = judged.islands
    return map_regions(
        labels, anatomy=anatomy_where if off else None, anatomy_step=ANATOMY_STEP,
        islands={v: islands.where[v] for v, _ in islands.flagged()}
        if islands is not None else None,
        swapped=swapped, mirrored=scope in ("mirrored", "parcels"),
        misfit=judged.fit is not None and judged.fit.verdict() is not None)


def class_counts(table: ClassTable, prepared: Any) -> tuple[dict[str, np.ndarray], dict]:
    """Voxels per class of each of :data:`JUDGED_VIEWS` for a prepared map, and
    ``{"count": voxels per value, "unknown": values the table does not list}``.

    The lookup maps each value on its own, so it is run on the map's distinct values
    (a :class:`Prepared` holding them) and weighted by their voxel counts: the counts of
    a lookup of the whole volume, without a class volume per view (0.6 s less per
    256^3 map)."""
    count = np.bincount(np.asarray(prepared.labels).ravel())
    present = np.flatnonzero(count)
    distinct = dataclasses.replace(prepared, labels=present.astype(np.int32))
    counts, unknown = {}, ()
    for view in JUDGED_VIEWS:
        mapped = table.lookup(distinct, view)
        counts[view] = np.bincount(mapped.classes, weights=count[present],
                                   minlength=table.num_classes(view)).astype(np.int64)
        unknown = tuple(int(v) for v in mapped.unknown_values)
    return counts, {"count": count, "unknown": list(unknown)}


def check_label_table(
    cache: Cache,
    index: dict[str, IndexEntry],
    scans: dict[str, EntryScan],
    table: ClassTable,
    absent_classes: str = "error",
    workers: int | None = None,
    progress: Callable[[int, int], None] | None = None,
) -> tuple[list[Finding], dict[str, Any], dict[str, dict[str, Region]]]:
    """Judge every label map of the cache with ``table`` (module docstring).

    Parameters
    ----------
    cache : Cache
    index : dict
        Cache key -> :class:`~mriprep.cache.IndexEntry` (well formed).
    scans : dict
        Cache key -> :class:`~mriprep.check.entries.EntryScan`: entries whose label map
        the tensor pass could not read (already reported) are not judged again.
    table : ClassTable
        The label table training will use (its rules, its ``unknown`` policy).
    absent_classes : {"error", "allow"}
        A class no label map of a split holds: ``lut-absent-classes`` error, or
        ``lut-absent-allowed`` warning.
    workers : int, optional
        Threads (default: up to 4, at most the CPU count).
    progress : callable, optional
        Called as ``progress(done, total)`` after each label map.

    Returns
    -------
    findings, summary, regions
        The findings, what the report records of the table and its judgement (JSON),
        and the voxels of each map's spatial findings (key -> code ->
        :class:`~mriprep.check.label_regions.Region`; maps without any left out).
    """
    if absent_classes not in ABSENT_CLASSES:
        raise ValueError(f"absent_classes={absent_classes!r}; choose one of {ABSENT_CLASSES}")
    started = time.perf_counter()
    judge = background_twin(table)
    labelled = [k for k in by_name(index, scans)
                if "label" in index[k].files and scans[k].label_counts is not None]
    judged = _judge_all(cache, index, scans, judge, labelled, workers, progress)
    findings: list[Finding] = []
    for key in labelled:
        findings += _map_findings(index[key], judged[key], table)
    volumes = judge_volumes({k: judged[k].class_counts["axial"] * judged[k].voxel_mm3
                             for k in labelled if judged[k].class_counts is not None},
                            judge.class_names("axial"))
    for key in labelled:
        findings += _volume_findings(index[key], volumes)
    findings += _rewrite_findings(index, judged, labelled)
    absent = _absent_by_split(index, judged, labelled, judge)
    for split, found in sorted(absent.items()):
        findings.append(_absent_finding(split, found, absent_classes, table, index))
    summary = {
        "source": table_source(table),
        "processing": table.processing,
        "cortex": table.cortex,
        "unknown": table.unknown,
        "absent_classes": absent_classes,
        "classes": {view: judge.num_classes(view) for view in ("axial", "coronal",
                                                               "sagittal")},
        "label_maps": len(labelled),
        "without_label_map": sum(1 for e in index.values() if "label" not in e.files),
        "rewrites": _rewrite_totals(judged.values()),
        "islands_not_judged": _islands_not_judged(judged.values(), table),
        "volumes": volumes.summary(),
        "absent": {split: {view: found[view] for view in JUDGED_VIEWS}
                   for split, found in sorted(absent.items())},
        "seconds": round(time.perf_counter() - started, 4),
    }
    regions = {key: judged[key].regions for key in labelled if judged[key].regions}
    return findings, summary, regions


def _judge_all(cache, index, scans, table, keys, workers, progress) -> dict[str, MapJudgement]:
    workers = workers or min(4, os.cpu_count() or 1)

    def one(key: str) -> MapJudgement:
        return judge_map(cache, index[key], table, scans[key].label_counts)

    return map_in_threads(one, keys, workers, progress, "mriprep-check-lut")


def _values(judgement: MapJudgement) -> str:
    shown = ", ".join(f"{v} ({c} voxels)" for v, c in judgement.unknown.items())
    more = judgement.unknown_values - len(judgement.unknown)
    return shown + (f" and {more} more value(s)" if more > 0 else "")


def _rules(table: ClassTable) -> str:
    return "" if table.processing == "none" else f" after the {table.processing} rules"


def _map_findings(entry: IndexEntry, judgement: MapJudgement,
                  table: ClassTable) -> list[Finding]:
    name, where = entry.finding_name, ((entry.key,), (entry.subject_id,))
    if judgement.unreadable is not None:
        return [Finding("tensor-unreadable",
                        f"{name}: {entry.files['label'].file} cannot be read for the label "
                        f"table check ({judgement.unreadable}); rebuild the entry with "
                        "`mriprep run --force`", *where)]
    found = []
    verdict = judgement.sides.verdict() if judgement.sides is not None else None
    if verdict is not None:
        found.append(Finding(
            "label-side-swap",
            f"{name}: {verdict} (offsets in world x, right minus left; every clean map's "
            "are positive). Check the label map's affine against its image, and the "
            "labelling tool's left/right numbering", *where))
    off = judgement.anatomy.verdict() if judgement.anatomy is not None else None
    if off is not None:
        found.append(Finding(
            "label-off-anatomy", f"{name}: {off}. Check the label map's field of view and "
            "resampling against its image", *where))
    scattered = judgement.islands.verdict() if judgement.islands is not None else None
    if scattered is not None:
        found.append(Finding(
            "label-islands", f"{name}: {scattered}. Look at them in the QC report; "
            "regenerate the map or remove the specks", *where))
    misfit = judgement.fit.verdict() if judgement.fit is not None else None
    if misfit is not None:
        found.append(Finding(
            "label-misfit", f"{name}: {misfit}. Check that the label map belongs to this "
            "image and was resampled with its affine", *where))
    return found + _value_findings(name, where, judgement, table)


def _volume_findings(entry: IndexEntry, volumes: VolumeJudgement) -> list[Finding]:
    name, where = entry.finding_name, ((entry.key,), (entry.subject_id,))
    found = []
    flags = volumes.flags.get(entry.key)
    if flags:
        found.append(Finding(
            "label-volume",
            f"{name}: {len(flags)} structure(s) far from the cohort's volume as a share of "
            f"the labelled volume, over {volumes.maps} label maps: {listed(flags)}. Look "
            "at them in the QC report; fix or regenerate the segmentation, or leave the "
            "entry out", *where))
    missing = volumes.missing.get(entry.key)
    if missing:
        found.append(Finding(
            "label-structure-missing",
            f"{name}: no voxel of {len(missing)} structure(s) that the cohort's maps hold: "
            f"{listed(missing)}. Check the field of view and the segmentation", *where))
    return found


def _value_findings(name: str, where: tuple, judgement: MapJudgement,
                    table: ClassTable) -> list[Finding]:
    if judgement.cortex_lost is not None:
        return [Finding("lut-cortex-lost", f"{name}: {judgement.cortex_lost}", *where)]
    if not judgement.unknown_values:
        return []
    source = table_source(table)
    if judgement.negative:
        return [Finding(
            "lut-unknown-values",
            f"{name}: the label map holds negative values {_values(judgement)}, which no "
            f"label table lists (FreeSurfer labels are >= 0) and training refuses; fix "
            "the label map", *where)]
    if table.unknown == "background":
        return [Finding(
            "lut-unknown-background",
            f"{name}: label values {_values(judgement)} are not in the label table "
            f"{source}{_rules(table)}; training counts them ({judgement.unknown_voxels} "
            "voxels) as background (class 0), as --unknown background "
            "(unknown='background') asks", *where)]
    return [Finding(
        "lut-unknown-values",
        f"{name}: label values {_values(judgement)} are not in the label table "
        f"{source}{_rules(table)}; training refuses the map. Add them to the table, or "
        "count them as background: --unknown background at export and check "
        "(LabelTable(unknown='background') in Python)", *where)]


def _rewrite_totals(judgements) -> dict[str, int]:
    total: dict[str, int] = defaultdict(int)
    for judgement in judgements:
        for rule, count in judgement.moved.items():
            total[rule] += count
    return dict(sorted(total.items(), key=lambda kv: (-kv[1], kv[0])))


def _islands_not_judged(judgements, table: ClassTable) -> dict[str, int]:
    """The values ``label-islands`` left out because the table's rules rewrite them
    first, by name, with their voxels over the cohort."""
    names = dict(zip(map(int, table.lut.ids), table.lut.names))
    total: dict[str, int] = defaultdict(int)
    for judgement in judgements:
        if judgement.islands is not None:
            for value, voxels in judgement.islands.skipped.items():
                total[f"{value} {names.get(value, '')}".strip()] += voxels
    return dict(sorted(total.items()))


def _rewrite_findings(index, judged, keys) -> list[Finding]:
    mapped = [k for k in keys if judged[k].class_counts is not None]
    findings = []
    for rule, total in _rewrite_totals(judged[k] for k in mapped).items():
        where = sorted((k for k in mapped if rule in judged[k].moved),
                       key=lambda k: (-judged[k].moved[rule], index[k].finding_name))
        most = ", ".join(f"{index[k].finding_name} ({judged[k].moved[rule]})"
                         for k in where[:MOST_SHOWN])
        findings.append(Finding(
            "lut-rewrites",
            f"{rule}: {total} voxels in {len(where)} of {len(mapped)} label maps "
            f"(most: {most})",
            tuple(by_name(index, where)),
            tuple(sorted({index[k].subject_id for k in where}))))
    return findings


def _absent_by_split(index, judged, keys, table) -> dict[str, dict[str, Any]]:
    """Split -> {view: absent class names, "mapped": keys counted, "left_out": keys the
    table cannot map}, for the splits where some class of the axial view is absent."""
    mapped: dict[str, list[str]] = defaultdict(list)
    left_out: dict[str, list[str]] = defaultdict(list)
    for key in keys:
        split = index[key].split or "(none)"
        (mapped if judged[key].class_counts is not None else left_out)[split].append(key)
    absent = {}
    for split, split_keys in mapped.items():
        found: dict[str, Any] = {"mapped": split_keys, "left_out": left_out[split]}
        for view in JUDGED_VIEWS:
            total = sum(judged[k].class_counts[view] for k in split_keys)
            names = table.class_names(view)
            found[view] = [names[c] for c in np.flatnonzero(total == 0) if c > 0]
        if found["axial"]:  # a class absent in sagittal is absent in axial too
            absent[split] = found
    return absent


def _absent_finding(split: str, found: dict[str, Any], policy: str, table: ClassTable,
                    index) -> Finding:
    axial, sagittal, keys = found["axial"], found["sagittal"], found["mapped"]
    subjects = sorted({index[k].subject_id for k in keys})

    def listed(names: list[str]) -> str:
        more = len(names) - ABSENT_SHOWN
        return ", ".join(names[:ABSENT_SHOWN]) + (f" and {more} more" if more > 0 else "")

    left_out = len(found["left_out"])
    counted = (f"{len(keys)} label map{'s' if len(keys) > 1 else ''} ({named(subjects)}"
               + (f"; {left_out} more the table cannot map left out, as the export leaves "
                  "them out" if left_out else "") + ")")
    text = (f"split {split}: {len(axial)} of the {table.num_classes('axial') - 1} classes "
            f"of the axial and coronal views of the label table {table_source(table)} are "
            f"in none of the split's {counted}: {listed(axial)}")
    if sagittal:
        text += (f"; of the sagittal view, where left and right merge, {len(sagittal)} of "
                 f"{table.num_classes('sagittal') - 1}: {listed(sagittal)}")
    else:
        text += "; the sagittal view, where left and right merge, has all its classes"
    if policy == "allow":
        return Finding("lut-absent-allowed",
                       f"{text}; accepted (absent_classes='allow'): the network never "
                       "learns them", tuple(keys), tuple(subjects))
    return Finding(
        "lut-absent-classes",
        f"{text}. Training refuses classes no subject holds: check the segmentations "
        "(aseg.mgz has no cortical parcels), use a table without these classes, or "
        "accept them: --absent-classes allow at export and check "
        "(absent_classes='allow' in MRIDataset)", tuple(keys), tuple(subjects))
