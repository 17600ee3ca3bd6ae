"""Label-map checks against planted defects (issue 45), measured on synthetic people.

``label-misfit`` (:mod:`mriprep.check.label_fit`): the separation of white matter from
cortex where the map lies, and the gain of the best move of one or two voxels, on clean
maps against the maps moved by 1, 2 and 4 mm along each axis and another person's map
(the next person's labels on this one's grid); thresholds :data:`MAX_GAIN` (moved) and
:data:`MIN_SEPARATION` (another person's). Also on clean maps whose image has a slab of
:data:`SLAB_VOXELS` slices zero-filled across the brain and masked, as the pipeline masks
one: read on the valid voxels, as the check reads them, and blind (every voxel read as
tissue), as it read them before.

``label-off-anatomy`` (:mod:`mriprep.check.label_anatomy`): labelled volume where the
image shows no head, and more than :data:`ENVELOPE_MM` from the brain's labelled mass,
on clean maps (also with the image z-scored, skull-stripped, defaced, and with the
masked slab, and z-scored with a field of view cropped around the head on a grid it does
not fill, each read on the valid voxels and blind) against maps
with a planted 10 mm and 6 mm cube of labels in the background, and in the scalp;
threshold :data:`MAX_OUTSIDE_MM3`.

``label-volume`` and ``label-structure-missing`` (:mod:`mriprep.check.label_volumes`):
each structure's robust z of its log share of the labelled volume across the set's
people, on clean maps against one person's map with a structure grown to twice its
volume (a different structure for each person) and one with no cerebellum, the rest of
the cohort clean; thresholds :data:`VOLUME_Z` with the spread floors
:data:`SPREAD_FLOOR` (structures) and :data:`PARCEL_SPREAD_FLOOR` (cortical parcels),
and the missing rule.

``label-islands`` (:mod:`mriprep.check.label_islands`): each structure's share of voxels
scattered as specks far from its body, on clean maps against maps with 5% of a structure
(the hippocampus, a parcel, the putamen) written as specks at random places of the
brain; threshold :data:`MAX_SCATTERED`.

``label-side-swap`` (:mod:`mriprep.check.label_sides`): each left/right pair's offset,
the right centroid's world x minus the left one's, on clean maps against the same maps
mirrored, with their hemispheres' parcel numbers swapped, and with one structure's
values swapped (the hippocampus). The threshold is 0 mm; the margins are the clean maps'
smallest offset and the swapped pairs' largest. The threshold is anatomical (every
pair lies on its own side of the falx), tuned on nothing. The people are the demo's
synthetic persons (the template warped, several mm as between people, FreeSurfer-numbered
labels with every DKT class), scanned in random poses on their own grids, in two sets:
the people :data:`MAX_GAIN` and :data:`MAX_OUTSIDE_MM3` were chosen on, and others
(:data:`SETS`).

Real heads (:func:`_real_heads`): no real labelled anatomy ships with the packages this
project may use, so Colin27, S1 and ROBEX are labelled here from their own tissue
contrast (:mod:`mriprep.demo.real_labels`: a brain mask, N4 and a 3-class Atropos, then
the synthetic people's FreeSurfer rules in MNI mm) and judged with the thresholds above,
none chosen on them: each check's clean reading against the same defects planted on
them (moves in voxels of their own grids; another person's map is another real head's,
lined up through the MNI frames). Their volumes are judged in one cohort with the tuning
set's people, three maps being under the check's six. ``--real-only`` runs this section
alone.

Cost per entry (:func:`_cost`): each person's scan and label map are preprocessed with
``conform_1mm`` the way a cache worker does it (one thread, ``process_subject`` with the
cache write, no QC pictures: row 14's method), and its cached entry is judged right
after, before the next person (so both sides of a ratio meet the same load), as
``mriprep check --lut dkt`` judges it (:func:`~mriprep.check.label_table.judge_map`:
the tensors read, the five label checks, the table's rules and lookup), and each part
is timed again on its own. The ratio is the judgement's time over the same subject's
preprocessing time, in the same run.

    python benchmarks/bench_labels.py [--people 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scipy import ndimage  # noqa: E402

from mriprep.check.label_anatomy import (  # noqa: E402
    ENVELOPE_MM,
    MAX_OUTSIDE_MM3,
    read_anatomy,
)
from mriprep.check.label_fit import MAX_GAIN, MIN_SEPARATION, read_fit  # noqa: E402
from mriprep.check.label_islands import MAX_SCATTERED, read_islands  # noqa: E402
from mriprep.check.label_sides import read_sides, side_pairs  # noqa: E402
from mriprep.check.label_table import class_counts  # noqa: E402
from mriprep.check.label_volumes import (  # noqa: E402
    PARCEL_SPREAD_FLOOR,
    SPREAD_FLOOR,
    VOLUME_Z,
    judge_volumes,
)
from mriprep.demo.freesurfer_cohort import scanned_person  # noqa: E402
from mriprep.demo.label_defects import (  # noqa: E402
    blob_in_scalp,
    grown,
    hemispheres_swapped,
    removed,
    scattered,
    values_swapped,
)
from mriprep.training.labels import dkt_table  # noqa: E402


def _left_right_axis(affine: np.ndarray) -> int:
    return int(np.argmax(np.abs(affine[0, :3])))


# The people the thresholds were chosen on, and others they never saw.
SETS = (("tuning", 7, 40), ("held-out", 13, 60))
# The zero-filled, masked slab of the clean maps' masked-slab rows: 8 slices, as a
# scanner's missing slab of four 2 mm slices resampled to 1 mm leaves it.
SLAB_VOXELS = 8
# The tight field of view of the off-anatomy rows: a scan cropped this close around the
# labelled brain (voxels), its z-scored values on a grid it does not fill.
TIGHT_MARGIN_VOXELS = 12


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--people", type=int, default=6,
                   help="people per set (default 6; the volume check needs 6)")
    p.add_argument("--real-only", action="store_true",
                   help="only the real heads' section (its volume cohort still takes the "
                        "tuning set's people)")
    args = p.parse_args(argv)
    tuning = []
    for name, seed, first in SETS:
        if args.real_only and name != "tuning":
            continue
        people = [scanned_person(seed, first + i, medial_unknown=True)
                  for i in range(args.people)]
        if name == "tuning":
            tuning = people
        if args.real_only:
            continue
        print(f"== {name} set: {args.people} synthetic people (seed {seed})")
        _side_swap(people)
        _misfit(people)
        _off_anatomy(people)
        _volumes(people)
        _islands(people, seed)
        _cost(people)
    _real_heads(tuning)
    return 0


# The corner cube and the scalp blobs of the synthetic people's section, and the same
# three scattered structures, planted on each real head.
def _air_corner(image: np.ndarray, side: int) -> tuple[slice, ...]:
    """The cube of ``side`` voxels, 4 voxels in from one of the grid's eight corners,
    where the image is darkest: air (ROBEX's grid holds the shoulders in one corner)."""
    corners = []
    for corner in np.ndindex(2, 2, 2):
        box = tuple(slice(4, 4 + side) if c == 0 else slice(n - 4 - side, n - 4)
                    for c, n in zip(corner, image.shape))
        corners.append((float(image[box].mean()), box))
    return min(corners, key=lambda mb: mb[0])[1]


def _real_heads(people) -> None:
    """The label checks on real heads labelled from their own contrast
    (:mod:`mriprep.demo.real_labels`): clean readings against planted defects. The
    volumes are judged in one cohort with ``people`` (synthetic), since three maps are
    under the check's six."""
    from mriprep.check.label_table import background_twin
    from mriprep.demo.real_labels import (
        HEADS,
        labelled_head,
        labels_onto,
        on_1mm_grid,
    )
    from mriprep.demo.real_scans import HOW_TO_GET

    heads = [labelled_head(name) for name in HEADS]
    heads = [h for h in heads if h is not None]
    if len(heads) < len(HEADS):
        print(f"== real heads: {len(heads)} of {len(HEADS)} here; to get them: "
              f"{HOW_TO_GET}")
    if not heads:
        return
    print(f"== real heads ({', '.join(h.name for h in heads)}): labelled from their own "
          "tissue contrast; thresholds as above, none chosen on them")
    table = dkt_table()
    judge = background_twin(table)
    rewritten = judge.rewritten_values()  # not judged by the islands check (check --lut)
    rng = np.random.default_rng(45)
    named = lambda verdict: "named" if verdict else "MISSED"  # noqa: E731
    for head in heads:
        image, labels, affine = head.image, head.labels, head.affine
        spacing = np.sqrt((affine[:3, :3] ** 2).sum(axis=0))
        voxel = float(np.prod(spacing))
        pairs = side_pairs(table.ids, table.names, np.unique(labels))
        print(f"  {head.name}: {image.shape} at {spacing[0]:g} mm, brain "
              f"{head.brain.sum() * voxel / 1e3:.0f} cm^3 ({head.mask_source})")
        sides = read_sides(labels, affine, pairs)
        mirrored = read_sides(np.flip(labels, _left_right_axis(affine)), affine, pairs)
        hemis = read_sides(hemispheres_swapped(labels), affine, pairs)
        one = read_sides(values_swapped(labels, 17, 53), affine, pairs)
        print(f"    side-swap   clean: {len(sides.offsets)} pairs, smallest offset "
              f"{min(sides.offsets.values()):+.1f} mm, "
              f"{'no finding' if sides.verdict() is None else 'FLAGGED'}; mirrored "
              f"(largest {max(mirrored.offsets.values()):+.1f} mm) "
              f"{named(mirrored.verdict())}; hemispheres {named(hemis.verdict())}; "
              f"hippocampi swapped ({one.offsets['Hippocampus']:+.1f} mm) "
              f"{named('Hippocampus' in (one.verdict() or ''))}")
        fit = read_fit(image, labels)
        moved = {mm: [read_fit(image, np.roll(labels, mm, axis=a)) for a in range(3)]
                 for mm in (1, 2, 4)}
        others = {o.name: read_fit(image, labels_onto(o, head)) for o in heads
                  if o is not head}
        print(f"    misfit      clean: gain {fit.gain:.3f}, separation {fit.here:.2f}, "
              f"{'no finding' if fit.verdict() is None else 'FLAGGED'}; "
              + "; ".join(f"moved {mm} voxel(s) gain {min(r.gain for r in rs):.3f}.."
                          f"{max(r.gain for r in rs):.3f} named "
                          f"{sum(r.verdict() is not None for r in rs)}/3"
                          for mm, rs in moved.items()))
        for other, r in others.items():
            print(f"                {other}'s map through the MNI frames: gain "
                  f"{r.gain:.3f}, separation {r.here:.2f}, {named(r.verdict())}")
        clean = read_anatomy(image, labels, voxel)
        brain_values = image[labels > 0].astype(np.float64)
        zscored = read_anatomy((image - brain_values.mean()) / brain_values.std(),
                               labels, voxel)
        stripped = read_anatomy(image * ndimage.binary_dilation(labels > 0), labels, voxel)
        print(f"    off-anatomy clean: outside the head {clean.outside_mm3:.0f}, off the "
              f"brain {clean.off_brain_mm3:.0f} mm^3 (z-scored {zscored.outside_mm3:.0f} / "
              f"{zscored.off_brain_mm3:.0f}, skull-stripped {stripped.outside_mm3:.0f} / "
              f"{stripped.off_brain_mm3:.0f}); findings "
              f"{sum(r.verdict() is not None for r in (clean, zscored, stripped))}/3")
        for side in (10, 6):
            cube = labels.copy()
            cube[_air_corner(image, side)] = 17
            air = read_anatomy(image, cube, voxel)
            scalp = read_anatomy(image, blob_in_scalp(image, labels, side, 17, rng), voxel)
            print(f"                cube of {side} voxels in the air: outside "
                  f"{air.outside_mm3:.0f} mm^3 {named(air.verdict())}; in the scalp: off "
                  f"the brain {scalp.off_brain_mm3:.0f} mm^3 {named(scalp.verdict())}")
        islands = read_islands(labels, spacing, skip=rewritten)
        worst = max(islands.scattered.items(), key=lambda vs: vs[1])
        raw = max(read_islands(labels, spacing).scattered.items(), key=lambda vs: vs[1])
        planted = {v: read_islands(scattered(labels, v, 0.05, rng), spacing)
                   .scattered.get(v, 0.0) for v in SCATTERED}
        print(f"    islands     clean: largest share {worst[1]:.2%} (label {worst[0]}), "
              f"{'no finding' if islands.verdict() is None else 'FLAGGED'} (with the "
              f"values the rules rewrite: {raw[1]:.2%}, label {raw[0]}); 5% scattered "
              + ", ".join(f"{v} {s:.2%} {named(s > MAX_SCATTERED)}"
                          for v, s in planted.items()))
        if not np.allclose(spacing, 1.0):
            # A planted speck is 2 x 2 x 1 voxels: 13.5 mm^3 at 1.5 mm, over the check's
            # speck size; the cache holds such a scan at 1 mm (conform_1mm).
            fine = on_1mm_grid(head)
            islands = read_islands(fine.labels, np.ones(3), skip=rewritten)
            worst = max(islands.scattered.items(), key=lambda vs: vs[1])
            planted = {v: read_islands(scattered(fine.labels, v, 0.05, rng),
                                       np.ones(3)).scattered.get(v, 0.0)
                       for v in SCATTERED}
            print(f"                on a 1 mm grid: clean largest share {worst[1]:.2%} "
                  f"(label {worst[0]}), "
                  f"{'no finding' if islands.verdict() is None else 'FLAGGED'}; 5% "
                  "scattered " + ", ".join(f"{v} {s:.2%} {named(s > MAX_SCATTERED)}"
                                           for v, s in planted.items()))
        counts, voxels = class_counts(judge, judge.prepare(labels))
        print(f"    values      {len(voxels['unknown'])} value(s) outside the DKT table "
              "after its rules")
    _real_volumes(heads, people)


def _class_volumes(table, labels, affine) -> np.ndarray:
    """mm^3 per axial class of a FreeSurfer-numbered map, after the table's rules."""
    counts, _ = class_counts(table, table.prepare(labels))
    return counts["axial"] * float(abs(np.linalg.det(affine[:3, :3])))


def _cohort(people):
    """The DKT table's axial class names and the value of each name, a map's class
    volumes (after the table's rules), and the synthetic people's, by name ``p0``, ..."""
    table = dkt_table()

    def volumes(labels, affine):
        return _class_volumes(table, labels, affine)

    return (table.class_names("axial"), dict(zip(table.lut.names, table.lut.ids)), volumes,
            {f"p{i}": volumes(labels, affine) for i, (_, labels, affine) in enumerate(people)})


def _real_volumes(heads, people) -> None:
    names, values, volumes, clean = _cohort(people)
    clean.update({h.name: volumes(h.labels, h.affine) for h in heads})
    judged = judge_volumes(clean, names)
    worst = sorted(judged.largest_z.items(), key=lambda kv: -kv[1])[:3]
    print(f"  volumes, the real heads in one cohort with {len(people)} synthetic people "
          f"(threshold |z| > {VOLUME_Z}): largest |z| of any structure over the cohort "
          + ", ".join(f"{n} {z:.2f}" for n, z in worst))
    for key in clean:
        flags, missing = judged.flags.get(key), judged.missing.get(key)
        if flags or missing or not key.startswith("p"):
            print(f"    {key}: "
                  + (f"FLAGGED {', '.join(f'{f.structure} z {f.z:+.1f}' for f in flags)}"
                     if flags else "no volume finding")
                  + (f"; MISSING {', '.join(m.structure for m in missing)}"
                     if missing else ""))
    for i, h in enumerate(heads):
        structure = GROWN[i % len(GROWN)]
        flags = judge_volumes({**clean, h.name: volumes(grown(h.labels, values[structure]),
                                                        h.affine)}, names).flags[h.name]
        hit = [f for f in flags if f.structure == structure]
        before = [f.z for f in judged.flags.get(h.name) or [] if f.structure == structure]
        cut = judge_volumes({**clean, h.name: volumes(
            removed(h.labels, [values[n] for n in CEREBELLUM]), h.affine)}, names)
        gone = {m.structure for m in cut.missing[h.name]} >= set(CEREBELLUM)
        # Named with z below 0 is the clean map's own flag (too small), not the growth.
        print(f"    {h.name}, {structure} at 2x: "
              + (f"flagged, z {hit[0].z:+.1f}" if hit else "not flagged")
              + f" (clean: {f'z {before[0]:+.1f}' if before else 'not flagged'}); "
              f"no cerebellum: {'named missing' if gone else 'MISSED'}")


def _side_swap(people) -> None:
    table = dkt_table()
    rows, costs = [], []
    for i, (_, labels, affine) in enumerate(people):
        pairs = side_pairs(table.ids, table.names, np.unique(labels))
        t = time.perf_counter()
        clean = read_sides(labels, affine, pairs)
        costs.append(time.perf_counter() - t)
        mirrored = read_sides(np.flip(labels, _left_right_axis(affine)), affine, pairs)
        hemis = read_sides(hemispheres_swapped(labels), affine, pairs)
        one = read_sides(values_swapped(labels, 17, 53), affine, pairs)
        rows.append((clean, mirrored, hemis, one))
        print(f"  person {i + 1}: {len(clean.offsets)} pairs judged; clean min "
              f"{min(clean.offsets.values()):+.1f} mm; verdicts: clean "
              f"{'none' if clean.verdict() is None else 'FLAGGED'}, mirrored "
              f"{'named' if mirrored.verdict() else 'MISSED'}, hemispheres "
              f"{'named' if hemis.verdict() else 'MISSED'}, hippocampus "
              f"{'named' if 'Hippocampus' in (one.verdict() or '') else 'MISSED'}")
    clean_min = [min(r[0].offsets.values()) for r in rows]
    swapped = [max(r[1].offsets.values()) for r in rows]
    cortex = [max(v for n, v in r[2].offsets.items() if n.startswith("ctx-")) for r in rows]
    hippocampus = [r[3].offsets["Hippocampus"] for r in rows]
    print(f"label-side-swap, {len(people)} people, threshold 0 mm (offset = right "
          "centroid's world x minus the left one's):")
    print(f"  clean maps, smallest offset of any pair   {min(clean_min):+6.1f} .. "
          f"{max(clean_min):+6.1f} mm  (margin {min(clean_min):.1f} mm)")
    print(f"  mirrored maps, largest offset             {min(swapped):+6.1f} .. "
          f"{max(swapped):+6.1f} mm  (margin {-max(swapped):.1f} mm)")
    print(f"  hemispheres swapped, largest cortex pair  {min(cortex):+6.1f} .. "
          f"{max(cortex):+6.1f} mm")
    print(f"  hippocampus values swapped, its offset    {min(hippocampus):+6.1f} .. "
          f"{max(hippocampus):+6.1f} mm")
    print(f"  cost per map (1 mm scan grid, about 10 million voxels): median "
          f"{statistics.median(costs):.3f} s (range {min(costs):.3f}-{max(costs):.3f})")


def _masked_slab(image: np.ndarray, labels: np.ndarray):
    """``image`` with a slab of :data:`SLAB_VOXELS` slices zero-filled across the
    middle of the labelled brain (the last axis), and the ``valid`` mask that marks it,
    as the pipeline leaves a zero-filled slab it masked."""
    occupied = np.flatnonzero((labels > 0).any(axis=(0, 1)))
    start = int(occupied[len(occupied) // 2]) - SLAB_VOXELS // 2
    slab = (slice(None), slice(None), slice(start, start + SLAB_VOXELS))
    masked, valid = image.copy(), np.ones(image.shape, dtype=bool)
    masked[slab], valid[slab] = 0, False
    return masked, valid


def _tight_field(image: np.ndarray, labels: np.ndarray):
    """``image`` z-scored within the labels, as ``t1w_mni_rigid`` caches it, seen only
    within :data:`TIGHT_MARGIN_VOXELS` of the labelled box (a scan cropped around the
    head) and filled with 0 beyond, as normalize fills the voxels a scan never saw; and
    the ``valid`` mask that marks what it saw."""
    inside = image[labels > 0].astype(np.float64)
    zscored = ((image - inside.mean()) / inside.std()).astype(np.float32)
    found = np.argwhere(labels > 0)
    valid = np.zeros(image.shape, dtype=bool)
    valid[tuple(slice(max(0, lo - TIGHT_MARGIN_VOXELS), hi + TIGHT_MARGIN_VOXELS + 1)
                for lo, hi in zip(found.min(axis=0), found.max(axis=0)))] = True
    return np.where(valid, zscored, 0.0).astype(np.float32), valid


def _off_anatomy(people) -> None:
    rows = {"clean": [], "z-scored": [], "skull-stripped": [], "defaced": [],
            "masked slab": [], "slab, blind": [], "tight field": [], "tight, blind": [],
            "cube 10 mm": [], "cube 6 mm": [], "scalp 10 mm": [], "scalp 6 mm": []}
    costs = []
    rng = np.random.default_rng(35)
    for image, labels, affine in people:
        voxel = float(abs(np.linalg.det(affine[:3, :3])))
        t = time.perf_counter()
        rows["clean"].append(read_anatomy(image, labels, voxel))
        costs.append(time.perf_counter() - t)
        inside = image[labels > 0].astype(np.float64)
        rows["z-scored"].append(read_anatomy((image - inside.mean()) / inside.std(), labels,
                                             voxel))
        brain = ndimage.binary_dilation(labels > 0, iterations=1)
        rows["skull-stripped"].append(read_anatomy(image * brain, labels, voxel))
        faceless = image.copy()
        faceless[:, int(image.shape[1] * 0.75):, :int(image.shape[2] * 0.4)] = 0
        rows["defaced"].append(read_anatomy(faceless, labels, voxel))
        slabbed, valid = _masked_slab(image, labels)
        rows["masked slab"].append(read_anatomy(slabbed, labels, voxel, valid))
        rows["slab, blind"].append(read_anatomy(slabbed, labels, voxel))
        cropped, seen = _tight_field(image, labels)
        rows["tight field"].append(read_anatomy(cropped, labels, voxel, seen))
        rows["tight, blind"].append(read_anatomy(cropped, labels, voxel))
        for side, name in ((10, "cube 10 mm"), (6, "cube 6 mm")):
            planted = labels.copy()
            planted[4:4 + side, 4:4 + side, 4:4 + side] = 17
            rows[name].append(read_anatomy(image, planted, voxel))
            scalp = blob_in_scalp(image, labels, side, 17, rng)
            rows[f"scalp {side} mm"].append(read_anatomy(image, scalp, voxel))
    print(f"label-off-anatomy, {len(people)} people, threshold {MAX_OUTSIDE_MM3:.0f} mm^3 "
          f"of labels outside the head, or over {ENVELOPE_MM:g} mm from the brain's mass:")
    for name, readings in rows.items():
        head = [r.outside_mm3 for r in readings]
        brain = [r.off_brain_mm3 for r in readings]
        named = sum(r.verdict() is not None for r in readings)
        print(f"  {name:15s} outside the head {min(head):5.0f} .. {max(head):5.0f}, off "
              f"the brain {min(brain):5.0f} .. {max(brain):5.0f} mm^3; named {named} of "
              f"{len(readings)}")
    print(f"  cost per map: median {statistics.median(costs):.3f} s (range "
          f"{min(costs):.3f}-{max(costs):.3f})")


def _misfit(people) -> None:
    clean, moved, other, costs = [], {1: [], 2: [], 4: []}, [], []
    masked, blind = [], []
    for i, (image, labels, _) in enumerate(people):
        t = time.perf_counter()
        reading = read_fit(image, labels)
        costs.append(time.perf_counter() - t)
        clean.append(reading)
        slabbed, valid = _masked_slab(image, labels)
        masked.append(read_fit(slabbed, labels, valid=valid))
        blind.append(read_fit(slabbed, labels))
        for mm in moved:
            for axis in range(3):
                moved[mm].append(read_fit(image, np.roll(labels, mm, axis=axis)))
        theirs = people[(i + 1) % len(people)][1]
        foreign = np.zeros_like(labels)
        box = tuple(slice(0, min(a, b)) for a, b in zip(labels.shape, theirs.shape))
        foreign[box] = theirs[box]
        other.append(read_fit(image, foreign))

    def span(values):
        return f"{min(values):.3f} .. {max(values):.3f}"

    named = lambda readings: sum(r.verdict() is not None for r in readings)  # noqa: E731
    print(f"label-misfit, {len(people)} people (moved: each axis), thresholds gain > "
          f"{MAX_GAIN}, separation < {MIN_SEPARATION}:")
    print(f"  clean maps            gain {span([r.gain for r in clean])}, separation "
          f"{span([r.here for r in clean])}; named {named(clean)} of {len(clean)}")
    print(f"  masked slab           gain {span([r.gain for r in masked])}, separation "
          f"{span([r.here for r in masked])}; named {named(masked)} of {len(masked)} "
          f"(read blind, every voxel as tissue: separation {span([r.here for r in blind])}; "
          f"named {named(blind)})")
    for mm, readings in moved.items():
        print(f"  moved {mm} mm            gain {span([r.gain for r in readings])}; named "
              f"{named(readings)} of {len(readings)}")
    print(f"  another person's map  gain {span([r.gain for r in other])}, separation "
          f"{span([r.here for r in other])}; named {named(other)} of {len(other)}")
    print(f"  cost per map: median {statistics.median(costs):.3f} s (range "
          f"{min(costs):.3f}-{max(costs):.3f})")


def _islands(people, seed: int) -> None:
    clean, planted, costs = [], [], []
    rng = np.random.default_rng([seed, 45])
    rewritten = dkt_table().rewritten_values()  # left out as check --lut leaves them out
    for image, labels, affine in people:
        spacing = np.sqrt((affine[:3, :3] ** 2).sum(axis=0))
        t = time.perf_counter()
        reading = read_islands(labels, spacing, skip=rewritten)
        costs.append(time.perf_counter() - t)
        clean.append(max(reading.scattered.items(), key=lambda vs: vs[1]))
        for value in SCATTERED:
            planted.append(read_islands(scattered(labels, value, 0.05, rng),
                                        spacing).scattered[value])
    print(f"label-islands, {len(people)} people, threshold {MAX_SCATTERED:.1%} of a "
          "structure scattered as far specks:")
    worst = max(share for _, share in clean)
    print(f"  clean maps: largest share of any structure {min(s for _, s in clean):.2%} .. "
          f"{worst:.2%} (structures: {sorted({v for v, _ in clean})}); named "
          f"{sum(s > MAX_SCATTERED for _, s in clean)} of {len(clean)}")
    print(f"  5% scattered ({', '.join(map(str, SCATTERED))}): {min(planted):.2%} .. "
          f"{max(planted):.2%}; named {sum(s > MAX_SCATTERED for s in planted)} of "
          f"{len(planted)} (margins: x{MAX_SCATTERED / worst:.1f} over the clean maps, "
          f"x{min(planted) / MAX_SCATTERED:.1f} under the planted)")
    print(f"  cost per map: median {statistics.median(costs):.3f} s (range "
          f"{min(costs):.3f}-{max(costs):.3f})")


# Structures scattered in each person: Left-Hippocampus, a parcel (ctx-lh-superiorfrontal),
# Right-Putamen.
SCATTERED = (17, 1028, 51)
# One structure grown to twice its volume per defective person, in turn.
GROWN = ("Left-Hippocampus", "Right-Putamen", "Left-Thalamus", "Right-Caudate",
         "Left-Amygdala", "Right-Pallidum")
CEREBELLUM = ("Left-Cerebellum-White-Matter", "Left-Cerebellum-Cortex",
              "Right-Cerebellum-White-Matter", "Right-Cerebellum-Cortex")


def _volumes(people) -> None:
    names, values, volumes, clean = _cohort(people)
    t = time.perf_counter()
    judged = judge_volumes(clean, names)
    cost = (time.perf_counter() - t) / len(people)
    flagged = sum(bool(f) for f in judged.flags.values())
    missing = sum(bool(m) for m in judged.missing.values())
    worst = sorted(judged.largest_z.items(), key=lambda kv: -kv[1])[:3]
    print(f"label-volume / label-structure-missing, {len(people)} people, threshold "
          f"|z| > {VOLUME_Z} (spread floors in log share: {SPREAD_FLOOR} structures, "
          f"{PARCEL_SPREAD_FLOOR} cortical parcels):")
    print(f"  clean maps: largest |z| of any structure {worst[0][1]:.2f} ("
          + ", ".join(f"{n} {z:.2f}" for n, z in worst) + f"); maps flagged {flagged}, "
          f"with a structure missing {missing}, of {len(clean)}")
    grown_z, cerebellum = [], []
    for i, (_, labels, affine) in enumerate(people[:3]):
        structure = GROWN[i % len(GROWN)]
        cohort = dict(clean)
        cohort[f"p{i}"] = volumes(grown(labels, values[structure]), affine)
        flags = judge_volumes(cohort, names).flags[f"p{i}"]
        hit = [f for f in flags if f.structure == structure]
        grown_z.append(hit[0].z if hit else float("nan"))
        print(f"  person {i + 1}, {structure} at 2x: "
              + (f"named, {hit[0].ratio:.2f}x, z {hit[0].z:+.1f}" if hit else "MISSED")
              + (f"; also flagged: {', '.join(f.structure for f in flags if f not in hit)}"
                 if len(flags) > len(hit) else ""))
        cut = removed(labels, [values[n] for n in CEREBELLUM])
        cohort = dict(clean)
        cohort[f"p{i}"] = volumes(cut, affine)
        judged_cut = judge_volumes(cohort, names)
        named = {m.structure for m in judged_cut.missing[f"p{i}"]}
        cerebellum.append(named >= set(CEREBELLUM))
        print(f"  person {i + 1}, no cerebellum: "
              + ("named missing" if cerebellum[-1] else f"MISSED (named: {sorted(named)})")
              + (f"; volume flags: {', '.join(f.structure for f in judged_cut.flags[f'p{i}'])}"
                 if judged_cut.flags[f"p{i}"] else ""))
    print(f"  grown structures' z {min(grown_z):+.1f} .. {max(grown_z):+.1f} (margin "
          f"{min(grown_z) - VOLUME_Z:.1f} over the threshold; clean margin "
          f"{VOLUME_Z - worst[0][1]:.1f}); missing cerebellum named {sum(cerebellum)} of "
          f"{len(cerebellum)}")
    print(f"  cost per map of the judgement (the class counts come from the table's "
          f"rules and lookup, which the check runs anyway): {cost * 1e3:.2f} ms")


# The issue's bound on the label checks' cost: a share of the subject's preprocessing.
COST_GOAL = 0.10


def _cost(people) -> None:
    import nibabel as nib

    from mriprep.cache import Cache
    from mriprep.check.label_anatomy import anatomy_and_where
    from mriprep.check.label_boxes import labelled_box, structure_boxes
    from mriprep.check.label_table import background_twin, judge_map, valid_mask
    from mriprep.inputs.manifest import ManifestRow
    from mriprep.pipelines import load_pipeline
    from mriprep.qc.structures import label_counts
    from mriprep.run.subject import process_subject
    from mriprep.run.worker_setup import configure_worker

    configure_worker(1)
    pipeline = load_pipeline("conform_1mm")
    table = background_twin(dkt_table())
    rewritten = table.rewritten_values()  # as judge_map leaves them out of the islands
    names = dict(zip(map(int, table.lut.ids), table.lut.names))
    with tempfile.TemporaryDirectory(prefix="bench_labels_") as tmp:
        root = Path(tmp)
        rows = []
        for i, (image, labels, affine) in enumerate(people):
            image_path, label_path = root / f"p{i}_T1w.nii.gz", root / f"p{i}_dseg.nii.gz"
            nib.save(nib.Nifti1Image(image.astype(np.float32), affine), image_path)
            nib.save(nib.Nifti1Image(labels.astype(np.int16), affine), label_path)
            rows.append(ManifestRow(0, f"sub-{i + 1:02d}", "", image_path, label_path))
        # Warm-up into a cache of its own: imports and first calls are not per subject.
        warm = Cache(root / "warm", create=True)
        warmed = process_subject(rows[0], pipeline, str(warm.root), force=True, qc=False)
        if warmed.status != "cached":
            print(f"  {rows[0].subject_id}: not cached ({warmed.status}); cost not measured")
            return
        judge_map(warm, warmed.entry, table, label_counts(warm.load_tensor(warmed.entry.key,
                                                                         "label")))
        cache = Cache(root / "cache", create=True)
        preprocess = []
        parts: dict[str, list[float]] = {}
        totals = []

        def timed(part, compute):
            start = time.perf_counter()
            out = compute()
            parts.setdefault(part, []).append(time.perf_counter() - start)
            return out

        # Each subject is preprocessed and then judged before the next: the two sides of
        # its ratio are measured minutes apart at most, under the same load.
        for row in rows:
            os.sync()  # untimed: the last write's writeback must not land in this one
            result = process_subject(row, pipeline, str(cache.root), force=True, qc=False)
            if result.status != "cached":
                print(f"  {row.subject_id}: not cached ({result.status}); cost not measured")
                return
            preprocess.append(result.seconds)
            entry = result.entry
            counts = timed("count (the tensor pass's)", lambda: label_counts(
                cache.load_tensor(entry.key, "label")))
            start = time.perf_counter()
            judge_map(cache, entry, table, counts)
            totals.append(time.perf_counter() - start)
            labels = timed("read tensors", lambda: np.asarray(cache.load_tensor(entry.key,
                                                                               "label")))
            image = np.asarray(cache.load_tensor(entry.key, "image"))
            boxes = timed("boxes", lambda: structure_boxes(labels))
            pairs = side_pairs(table.lut.ids, table.lut.names, list(counts))
            timed("side swap", lambda: read_sides(labels, entry.affine, pairs,
                                                  labelled_box(boxes)))
            timed("islands", lambda: read_islands(labels, entry.spacing, names, boxes=boxes,
                                                  skip=rewritten))
            valid = timed("valid mask", lambda: valid_mask(cache, entry.key, labels.shape))
            timed("misfit", lambda: read_fit(image, labels, labelled_box(boxes), valid))
            timed("off-anatomy", lambda: anatomy_and_where(image, labels, 1.0, valid))
            prepared = timed("table rules", lambda: table.prepare(labels))
            timed("table lookup", lambda: class_counts(table, prepared))
    checks = [sum(parts[p][i] for p in ("boxes", "side swap", "islands", "valid mask",
                                        "misfit", "off-anatomy"))
              for i in range(len(preprocess))]
    ratio = [c / p for c, p in zip(checks, preprocess)]
    whole = [t / p for t, p in zip(totals, preprocess)]

    def span(values, unit=" s", fmt=".3f"):
        return (f"median {statistics.median(values):{fmt}}{unit} (range "
                f"{min(values):{fmt}}-{max(values):{fmt}})")

    print(f"label checks' cost per cached entry, {len(preprocess)} people through "
          f"conform_1mm (256^3, 1 mm), one thread:")
    print(f"  preprocessing (conform_1mm, cache write, no QC) {span(preprocess)}")
    for part, values in parts.items():
        print(f"  {part:26s} {span(values)}")
    print(f"  the five checks (boxes, side swap, islands, misfit and off-anatomy with "
          f"the valid mask they read; volumes are a cohort's ~1 ms) {span(checks)}: "
          f"{span(ratio, '', '.1%')} of "
          f"preprocessing; under {COST_GOAL:.0%}: "
          f"{'yes' if max(ratio) < COST_GOAL else 'NO'}")
    print(f"  the whole judgement of an entry (check --lut: tensors read, the five "
          f"checks, the table's rules and lookup) {span(totals)}: {span(whole, '', '.1%')} "
          f"of preprocessing; under {COST_GOAL:.0%}: "
          f"{'yes' if max(whole) < COST_GOAL else 'NO'}")


if __name__ == "__main__":
    raise SystemExit(main())
