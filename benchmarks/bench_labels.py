"""Label-map checks against planted defects (issue 45), measured on synthetic people.

``label-misfit`` (:mod:`mriprep.check.label_fit`): the separation of white matter from
cortex where the map lies, and the gain of the best move of one or two voxels, on clean
maps against the maps moved by 1, 2 and 4 mm along each axis and another person's map
(the next person's labels on this one's grid); thresholds :data:`MAX_GAIN` (moved) and
:data:`MIN_SEPARATION` (another person's).

``label-off-anatomy`` (:mod:`mriprep.check.label_anatomy`): labelled volume where the
image shows no head, on clean maps (also with the image z-scored, skull-stripped and
defaced)
against maps with a planted 10 mm and 6 mm cube of labels in the background; threshold
:data:`MAX_OUTSIDE_MM3`.

``label-side-swap`` (:mod:`mriprep.check.label_sides`): each left/right pair's offset,
the right centroid's world x minus the left one's, on clean maps against the same maps
mirrored, with their hemispheres' parcel numbers swapped, and with one structure's
values swapped (the hippocampus). The threshold is 0 mm; the margins are the clean maps'
smallest offset and the swapped pairs' largest. The threshold is anatomical (every
pair lies on its own side of the falx), tuned on nothing. The people are the demo's
synthetic persons (the template warped, several mm as between people, FreeSurfer-numbered
labels with every DKT class), scanned in random poses on their own grids, in two sets:
the people :data:`MAX_GAIN` and :data:`MAX_OUTSIDE_MM3` were chosen on, and others
(:data:`SETS`). No real
labelled anatomy ships with the packages this project may use, so real heads are not in
this table. Also the check's cost per map.

    python benchmarks/bench_labels.py [--people 3]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from scipy import ndimage  # noqa: E402

from mriprep.check.label_anatomy import MAX_OUTSIDE_MM3, read_anatomy  # noqa: E402
from mriprep.check.label_fit import MAX_GAIN, MIN_SEPARATION, read_fit  # noqa: E402
from mriprep.check.label_sides import read_sides, side_pairs  # noqa: E402
from mriprep.demo.freesurfer_cohort import scanned_person  # noqa: E402
from mriprep.training.labels import dkt_table  # noqa: E402


def _left_right_axis(affine: np.ndarray) -> int:
    return int(np.argmax(np.abs(affine[0, :3])))


def _hemispheres(labels: np.ndarray) -> np.ndarray:
    out = labels.copy()
    out[(labels > 1000) & (labels < 2000)] += 1000
    out[labels > 2000] -= 1000
    return out


def _swap(labels: np.ndarray, a: int, b: int) -> np.ndarray:
    out = labels.copy()
    out[labels == a], out[labels == b] = b, a
    return out


# The people the thresholds were chosen on, and others they never saw.
SETS = (("tuning", 7, 40), ("held-out", 13, 60))


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--people", type=int, default=3, help="people per set (default 3)")
    args = p.parse_args(argv)
    for name, seed, first in SETS:
        people = [scanned_person(seed, first + i, medial_unknown=True)
                  for i in range(args.people)]
        print(f"== {name} set: {args.people} synthetic people (seed {seed})")
        _side_swap(people)
        _misfit(people)
        _off_anatomy(people)
    return 0


def _side_swap(people) -> None:
    table = dkt_table()
    rows, costs = [], []
    for i, (_, labels, affine) in enumerate(people):
        pairs = side_pairs(table.ids, table.names, np.unique(labels))
        t = time.perf_counter()
        clean = read_sides(labels, affine, pairs)
        costs.append(time.perf_counter() - t)
        mirrored = read_sides(np.flip(labels, _left_right_axis(affine)), affine, pairs)
        hemis = read_sides(_hemispheres(labels), affine, pairs)
        one = read_sides(_swap(labels, 17, 53), affine, pairs)
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


def _off_anatomy(people) -> None:
    rows = {"clean": [], "z-scored": [], "skull-stripped": [], "defaced": [],
            "cube 10 mm": [], "cube 6 mm": []}
    costs = []
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
        for side, name in ((10, "cube 10 mm"), (6, "cube 6 mm")):
            planted = labels.copy()
            planted[4:4 + side, 4:4 + side, 4:4 + side] = 17
            rows[name].append(read_anatomy(image, planted, voxel))
    print(f"label-off-anatomy, {len(people)} people, threshold {MAX_OUTSIDE_MM3:.0f} mm^3 "
          "of labels outside the head:")
    for name, readings in rows.items():
        values = [r.outside_mm3 for r in readings]
        named = sum(r.verdict() is not None for r in readings)
        print(f"  {name:15s} {min(values):7.0f} .. {max(values):7.0f} mm^3; named {named} "
              f"of {len(readings)}")
    print(f"  cost per map: median {statistics.median(costs):.3f} s (range "
          f"{min(costs):.3f}-{max(costs):.3f})")


def _misfit(people) -> None:
    clean, moved, other, costs = [], {1: [], 2: [], 4: []}, [], []
    for i, (image, labels, _) in enumerate(people):
        t = time.perf_counter()
        reading = read_fit(image, labels)
        costs.append(time.perf_counter() - t)
        clean.append(reading)
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
    for mm, readings in moved.items():
        print(f"  moved {mm} mm            gain {span([r.gain for r in readings])}; named "
              f"{named(readings)} of {len(readings)}")
    print(f"  another person's map  gain {span([r.gain for r in other])}, separation "
          f"{span([r.here for r in other])}; named {named(other)} of {len(other)}")
    print(f"  cost per map: median {statistics.median(costs):.3f} s (range "
          f"{min(costs):.3f}-{max(costs):.3f})")


if __name__ == "__main__":
    raise SystemExit(main())
