"""FastSurfer's own conform, run from a checkout, and how ``conform_min`` agrees with it.

FastSurfer is not on PyPI. Where a checkout of its ``FastSurferCNN`` is at hand
(``MRIPREP_FASTSURFER``, which ``.ci/run`` sets, else ``../shared/fastsurfer`` beside
this repository), the tests and ``make bench`` run its ``conform`` itself rather than a
restatement of it. Nothing here is used by the pipeline.

The comparison (:func:`min_agreement`) is over every voxel ``conform_min`` holds valid,
the field of view's outermost layer included, and counts the voxels it holds invalid
where FastSurfer's image is not 0. The edge planes where the output grid meets the
scan's last slice within round-off agree since ``conform_min`` computes its grid and
interpolation as FastSurfer does (``arithmetic: fastsurfer``,
:mod:`mriprep.stages.resample.fastsurfer_path`).
"""

from __future__ import annotations

import contextlib
import functools
import importlib
import io
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

HOW_TO_ENABLE = ("set MRIPREP_FASTSURFER to a FastSurfer checkout (the folder holding "
                 "FastSurferCNN/; .ci/run does) to run FastSurfer's own code")
# run_fastsurfer.sh's default: a smallest voxel side above 0.98 mm is served at 1 mm.
FASTSURFER_TO_1MM_THRESHOLD = 0.98


def fastsurfer_checkout() -> Path | None:
    """The folder holding FastSurfer's ``FastSurferCNN``, or None."""
    beside = Path(__file__).resolve().parents[3] / "shared" / "fastsurfer"
    for folder in (os.environ.get("MRIPREP_FASTSURFER"), beside):
        if folder and (Path(folder) / "FastSurferCNN" / "data_loader" / "conform.py").is_file():
            return Path(folder)
    return None


def fastsurfer_module(name: str):
    """A module of the checkout (``"FastSurferCNN.data_loader.conform"``), or None
    where there is no checkout or its imports do not resolve."""
    checkout = fastsurfer_checkout()
    if checkout is None:
        return None
    if str(checkout) not in sys.path:
        sys.path.append(str(checkout))
    try:
        return importlib.import_module(name)
    except ImportError:
        return None


def fastsurfer_conform_min(data: np.ndarray, affine: np.ndarray,
                           to_1mm_threshold: float | None = FASTSURFER_TO_1MM_THRESHOLD):
    """FastSurfer's ``conform(img, order=1, conform_vox_size="min", ...)`` of an image
    given as a NIfTI: (uint8 voxels, affine). Raises RuntimeError without a checkout."""
    import nibabel as nib

    conform = fastsurfer_module("FastSurferCNN.data_loader.conform")
    if conform is None:
        raise RuntimeError(HOW_TO_ENABLE)
    img = nib.Nifti1Image(data, affine)
    with contextlib.redirect_stdout(io.StringIO()):  # it prints the zooms it chose
        out = conform.conform(img, order=1, conform_vox_size="min",
                              conform_to_1mm_threshold=to_1mm_threshold)
    return np.asarray(out.dataobj), np.asarray(out.affine, dtype=np.float64)


@dataclass(frozen=True)
class MinAgreement:
    """How a ``conform_min`` image agrees with FastSurfer's (module doc)."""

    same_grid: bool        # shape equal and affines within 1e-4 mm
    max_affine_mm: float
    compared: int          # the valid voxels
    equal: float           # share of the compared voxels equal
    within_one: float      # share within one grey level
    max_abs: int
    invalid_nonzero: int   # voxels held invalid where FastSurfer's image is not 0


def min_agreement(ours: np.ndarray, affine: np.ndarray, valid: np.ndarray,
                  theirs: np.ndarray, their_affine: np.ndarray) -> MinAgreement:
    """Compare voxel by voxel on the same grid (module doc); a different grid gives
    ``same_grid`` False and no voxel compared."""
    affine = np.asarray(affine, dtype=np.float64)
    gap = float(np.abs(affine - their_affine).max()) if affine.shape == (4, 4) else np.inf
    if ours.shape != theirs.shape or not gap < 1e-4:
        return MinAgreement(False, gap, 0, 0.0, 0.0, -1, -1)
    diff = np.abs(ours[valid].astype(np.int16) - theirs[valid].astype(np.int16))
    n = max(diff.size, 1)
    return MinAgreement(True, gap, int(diff.size),
                        float(np.count_nonzero(diff == 0) / n),
                        float(np.count_nonzero(diff <= 1) / n),
                        int(diff.max()) if diff.size else 0,
                        int(np.count_nonzero(theirs[~valid])))


@functools.lru_cache(maxsize=1)
def header_pipeline():
    """``conform_min`` as compared with FastSurfer: the header's voxel sizes, as
    FastSurfer takes them (the measured resolution is mriprep's addition), and no
    artifact-slice masking, which is mriprep's addition too and changes what it masks
    by design (on ROBEX's head at 0.7 mm it masks one air slice 13% brighter than its
    neighbours in the source scan, and the 0-255 range taken without it then moves most
    voxels by a grey level). Every other stage as shipped."""
    from mriprep.pipelines import load_pipeline, pipeline_from_dict

    config = load_pipeline("conform_min").resolved()
    for step in config["stages"]:
        if step["stage"] == "resample":
            step["params"]["voxel_size_from"] = "header"
    return pipeline_from_dict({
        "name": "conform_min_as_fastsurfer", "output_dtype": "uint8",
        "compression": config["compression"],
        "stages": [{s["stage"]: s["params"]} for s in config["stages"]
                   if s["stage"] != "mask_slices"]})


# Real heads on the grids conform_min serves (straight and tilted 15 degrees), thick
# slices (straight, and tilted 10 degrees at 0.9 x 0.9 x 2 mm), and two scans as stored.
MIN_FIDELITY_CASES = (
    *[f"{head} {size} mm{' tilted' if tilt else ''}" for head in ("colin27", "s1", "robex")
      for size in (0.7, 0.8, 0.9) for tilt in (False, True)],
    *[f"{head} {thick}" for head in ("colin27", "s1", "robex")
      for thick in ("1x1x3 mm", "0.9x0.9x2 mm tilted")],
    "colin27 as stored", "colin27_05mm as stored",
)


def min_fidelity_scan(case: str):
    """(data, affine, the voxel size FastSurfer chooses) of a case of
    :data:`MIN_FIDELITY_CASES`, or None where its real scan is not installed."""
    import nibabel as nib

    from mriprep.demo.calibration import real_head
    from mriprep.demo.real_scans import real_scan
    from mriprep.demo.scanner import Acquisition, acquire, random_pose

    name, rest = case.split(" ", 1)
    if rest == "as stored":
        path = real_scan(name)
        if path is None:
            return None
        img = nib.load(path)
        data = np.asarray(img.dataobj, dtype=np.float32)
        return data, img.affine, float(min(1.0, min(img.header.get_zooms()[:3])))
    anatomy = real_head(name)
    if anatomy is None:
        return None
    tilted = rest.endswith("tilted")
    if rest.startswith("1x1x3"):
        spacing, tilt = (1.0, 1.0, 3.0), 0.0
    elif rest.startswith("0.9x0.9x2"):
        spacing, tilt = (0.9, 0.9, 2.0), 10.0
    else:
        size = float(rest.split()[0])
        spacing, tilt = (size,) * 3, 15.0 if tilted else 0.0
    rng = np.random.default_rng([int(spacing[2] * 10), int(tilt)])
    pose = random_pose(rng, 10.0, 10.0) if tilt else np.eye(4)
    scan = acquire(anatomy, pose, Acquisition(spacing=spacing, tilt_deg=tilt), rng)
    return scan.data, scan.affine, min(spacing)


@dataclass(frozen=True)
class MinComparison:
    """One scan through :func:`header_pipeline` and FastSurfer's conform."""

    volume: object         # mriprep's Volume after the pipeline
    ours: np.ndarray       # its cached uint8 image
    theirs: np.ndarray     # FastSurfer's
    agreement: MinAgreement
    mriprep_s: float
    fastsurfer_s: float


def compare_with_fastsurfer(data: np.ndarray, affine: np.ndarray) -> MinComparison:
    """Run ``conform_min`` as compared (:func:`header_pipeline`) and FastSurfer's own
    conform on one image, and compare them (:func:`min_agreement`); both timed."""
    import time

    from mriprep.core.volume import Volume
    from mriprep.pipelines import run_stages
    from mriprep.run.subject import output_tensors

    start = time.perf_counter()
    volume = run_stages(Volume.from_array(data, affine, subject_id="c"), header_pipeline())
    ours = output_tensors(volume, "uint8")["image"]
    mriprep_s = time.perf_counter() - start
    start = time.perf_counter()
    theirs, their_affine = fastsurfer_conform_min(data, affine)
    fastsurfer_s = time.perf_counter() - start
    agreement = min_agreement(ours, volume.affine, volume.valid, theirs, their_affine)
    return MinComparison(volume, ours, theirs, agreement, mriprep_s, fastsurfer_s)
