"""The calibration set: good scans of people who are not the template, and failures.

Every limit of the register stage's checks and of slice masking is set from what this
set measures, and ``make bench`` prints it. A case is one image with what should happen
to it:

* ``good``: a T1 head that must be accepted and registered. Synthetic people (MNI152
  warped nonlinearly, rescaled, recontrasted, with scalp and neck: see
  :mod:`mriprep.demo.anatomy`) and the real Colin27 scans, each in several acquisitions:
  1 mm, 1x1x3 mm tilted by 20 degrees, 0.9x0.9x5 mm coronal stored backwards, 1x1x5 mm
  sagittal with the vertex cut, 0.9x0.9x5 mm axial with the neck cut, in random poses.
* failures that must be refused, each with the causes that name it correctly:
  ``orientation`` (headers rotated by quarter and half turns, an anterior-posterior
  flip, permuted axes), ``field_of_view`` (a 40 mm slab, the top of the head only),
  ``no_brain`` (noise, a water phantom), ``head_size`` (a macaque brain, a human head
  shrunk to macaque size), ``not_t1`` (a T2-like contrast).

The plausibility stage is calibrated on the same set plus
:func:`plausibility_cases` (sheared sforms, voxel sizes in the wrong unit, a blank
volume, a crop from inside the head); :func:`expected_checks` says what it must name.

Rigid truth: every good scan of one anatomy shares it, so registration is scored as
consistency across known poses (the error of predicting one pose's transform from the
reference pose's and the known motion) and, for synthetic people, against the known
rigid part of their warp.

The set is deterministic in its seed. Anatomies are built once per process.
"""

from __future__ import annotations

import dataclasses
import functools
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
from nibabel.affines import voxel_sizes

from mriprep.demo.anatomy import Anatomy, real_anatomy, synthetic_person
from mriprep.demo.real_scans import brain_mask_path, mni_frame, real_scan
from mriprep.demo.scanner import Acquisition, Scan, acquire, random_pose
from mriprep.stages.registration.geometry import rigid_matrix

# What each kind of case must end as; a refusal must name one of these causes.
EXPECTED_CAUSES: dict[str, frozenset[str]] = {
    "good": frozenset(),
    "orientation": frozenset({"orientation"}),
    "field_of_view": frozenset({"field_of_view"}),
    "no_brain": frozenset({"no_brain", "not_t1"}),
    "head_size": frozenset({"head_size", "no_brain"}),
    "not_t1": frozenset({"not_t1", "no_brain"}),
}

# The acquisitions of good scans; the first is each anatomy's reference pose.
ACQUISITIONS: dict[str, Acquisition] = {
    "1mm": Acquisition(),
    "ax3_tilt20": Acquisition((1.0, 1.0, 3.0), "axial", tilt_deg=20.0, coverage_mm=190.0),
    "cor5_lps": Acquisition((0.9, 0.9, 5.0), "coronal", flips=(True, False, True)),
    "sag5_vertex": Acquisition((1.0, 1.0, 5.0), "sagittal", vertex_margin_mm=-4.0),
    "ax5_chin": Acquisition((0.9, 0.9, 5.0), "axial", coverage_mm=175.0),
}

# Header errors: the stored voxels stay, the affine turns about the image centre.
HEADER_ERRORS: dict[str, np.ndarray] = {
    "rot90_lr": rigid_matrix((90, 0, 0), (0, 0, 0)),
    "rot-90_lr": rigid_matrix((-90, 0, 0), (0, 0, 0)),
    "rot90_ap": rigid_matrix((0, 90, 0), (0, 0, 0)),
    "rot90_si": rigid_matrix((0, 0, 90), (0, 0, 0)),
    "rot180_lr": rigid_matrix((180, 0, 0), (0, 0, 0)),
    "rot180_si": rigid_matrix((0, 0, 180), (0, 0, 0)),
    "flip_ap": np.diag([1.0, -1.0, 1.0, 1.0]),
    "permuted": np.array([[0.0, 1, 0, 0], [0, 0, 1, 0], [1, 0, 0, 0], [0, 0, 0, 1]]),
}

MAX_POSE_ROTATION_DEG = 15.0
MAX_POSE_TRANSLATION_MM = 15.0


@dataclass(frozen=True)
class Case:
    """One calibration image: how to build it and what must happen to it."""

    name: str
    kind: str  # a key of EXPECTED_CAUSES
    anatomy: str  # the anatomy it shows ("" for noise and phantoms)
    acquisition: str  # a key of ACQUISITIONS, or what was done instead
    build: Callable[[], Scan] = field(repr=False, compare=False)
    reference: bool = False  # the anatomy's reference pose for consistency
    # What the scan varies, for reports by class (registration_sets.CLASSES); empty for
    # the calibration set's own cases, named by their acquisition.
    variation: str = ""

    @property
    def expected_causes(self) -> frozenset[str]:
        return EXPECTED_CAUSES[self.kind]


@functools.lru_cache(maxsize=8)
def person(seed: int, contrast: str = "t1", head_scale: float | None = None) -> Anatomy:
    """Synthetic person number ``seed`` (built once per process: each takes seconds)."""
    return synthetic_person(np.random.default_rng([seed, 7]), contrast=contrast,
                            head_scale=head_scale, name=f"person-{seed}")


@functools.lru_cache(maxsize=8)
def real_head(name: str) -> Anatomy | None:
    """The real scan ``name`` of :data:`~mriprep.demo.real_scans.REAL_SCANS` as an
    anatomy (read once per process), or None where its source is not installed."""
    path = real_scan(name)
    if path is None:
        return None
    return real_anatomy(path, name, brain_mask_path(name), mni_frame(name))


def calibration_cases(people: int = 4, real: bool = True, seed: int = 0,
                      acquisitions: tuple[str, ...] | None = None,
                      failures: bool = True) -> list[Case]:
    """The calibration set.

    Parameters
    ----------
    people : int
        Synthetic people (good scans in every acquisition, and the failures built from
        them).
    real : bool
        Add the real scans of Debian's mricron-data where installed (see
        :mod:`mriprep.demo.real_scans`); silently none where not.
    seed : int
    acquisitions : tuple of str, optional
        The acquisitions of good scans (default: all of :data:`ACQUISITIONS`).
    failures : bool
        Add the failure cases.
    """
    chosen = tuple(acquisitions or ACQUISITIONS)
    anatomies: list[tuple[str, Callable[[], Anatomy | None]]] = [
        (f"person-{i}", functools.partial(person, seed * 100 + i)) for i in range(people)
    ]
    if real:
        anatomies += [(name, functools.partial(real_head, name))
                      for name in ("colin27", "colin27_brain", "colin27_05mm")
                      if real_scan(name) is not None]
    cases: list[Case] = []
    for a_index, (name, anatomy) in enumerate(anatomies):
        for q_index, acq in enumerate(chosen):
            rng_seed = [seed, a_index, q_index]
            cases.append(Case(
                f"{name}/{acq}", "good", name, acq,
                functools.partial(_scan, anatomy, ACQUISITIONS[acq], rng_seed),
                reference=q_index == 0,
            ))
    if failures:
        cases += _failure_cases(anatomies, seed, real)
    return cases


def _scan(anatomy: Callable[[], Anatomy], acquisition: Acquisition, rng_seed) -> Scan:
    rng = np.random.default_rng(rng_seed)
    pose = random_pose(rng, MAX_POSE_ROTATION_DEG, MAX_POSE_TRANSLATION_MM)
    return acquire(anatomy(), pose, acquisition, rng)


def _failure_cases(anatomies, seed: int, real: bool) -> list[Case]:
    cases = []
    # Header errors on every anatomy's reference scan, in turn.
    for index, (error, matrix) in enumerate(HEADER_ERRORS.items()):
        name, anatomy = anatomies[index % len(anatomies)]
        base = functools.partial(_scan, anatomy, ACQUISITIONS["1mm"], [seed, 50, index])
        cases.append(Case(f"{name}/header_{error}", "orientation", name, "1mm",
                          functools.partial(wrong_header, base, matrix)))
    cor = functools.partial(_scan, anatomies[0][1], ACQUISITIONS["cor5_lps"], [seed, 51])
    cases.append(Case(f"{anatomies[0][0]}/cor5_header_rot90_lr", "orientation",
                      anatomies[0][0], "cor5_lps",
                      functools.partial(wrong_header, cor, HEADER_ERRORS["rot90_lr"])))
    for index, (name, anatomy) in enumerate(anatomies[:2] + anatomies[-1:]):
        base = functools.partial(_scan, anatomy, ACQUISITIONS["1mm"], [seed, 60, index])
        cases.append(Case(f"{name}/slab40", "field_of_view", name, "1mm",
                          functools.partial(slab_of, base, 0.5, 40.0)))
        cases.append(Case(f"{name}/top_third", "field_of_view", name, "1mm",
                          functools.partial(slab_of, base, 0.83, 70.0)))
    cases.append(Case("noise", "no_brain", "", "noise",
                      functools.partial(noise_scan, [seed, 70])))
    cases.append(Case("phantom", "no_brain", "", "phantom",
                      functools.partial(_phantom, [seed, 71])))
    small = functools.partial(person, seed * 100 + 90, "t1", 0.45)
    cases.append(Case("small-person/05mm", "head_size", "small-person", "0.5mm",
                      functools.partial(_scan, small, Acquisition((0.5, 0.5, 0.5)),
                                        [seed, 72])))
    t2 = functools.partial(person, seed * 100 + 91, "t2")
    for index, acq in enumerate(("1mm", "cor5_lps")):
        cases.append(Case(f"t2-person/{acq}", "not_t1", "t2-person", acq,
                          functools.partial(_scan, t2, ACQUISITIONS[acq], [seed, 73, index])))
    if real and real_scan("macaque") is not None:
        macaque = functools.partial(real_head, "macaque")
        for index, spacing in enumerate((0.5, 1.0)):
            cases.append(Case(f"macaque/{spacing}mm", "head_size", "macaque", f"{spacing}mm",
                              functools.partial(_scan, macaque,
                                                Acquisition((spacing,) * 3), [seed, 74, index])))
    return cases


# What the plausibility stage must say of a case: the checks it may name (any one of
# them is a correct refusal); good scans, wrong headers, phantoms and T2 scans are
# plausible inputs, refused later (by register) if at all.
PLAUSIBILITY_EXPECTED: dict[str, frozenset[str]] = {
    "shear": frozenset({"shear"}),
    "voxel_size": frozenset({"voxel_size", "head_size"}),
    "no_head": frozenset({"no_head"}),
    "head_size": frozenset({"head_size"}),
    "field_of_view": frozenset({"head_size", "no_head"}),
}


def expected_checks(case: Case) -> frozenset[str]:
    """The plausibility checks that may refuse ``case``; empty: it must pass."""
    if case.kind in PLAUSIBILITY_EXPECTED:
        return PLAUSIBILITY_EXPECTED[case.kind]
    if case.name == "noise":
        return PLAUSIBILITY_EXPECTED["no_head"]
    return frozenset()


def plausibility_cases(seed: int = 0) -> list[Case]:
    """Inputs that only the plausibility checks can refuse in a conform pipeline, built
    from synthetic person ``100 * seed``'s 1 mm scan: sheared sforms, voxel sizes in the wrong unit,
    a blank volume, and a 2 mm crop from inside the head (64 mm a side)."""
    name = f"person-{seed * 100}"
    anatomy = functools.partial(person, seed * 100)
    # One acquisition shared by the header errors (they only change the affine).
    base = functools.lru_cache(maxsize=1)(
        functools.partial(_scan, anatomy, ACQUISITIONS["1mm"], [seed, 80]))
    cases = []
    for degrees in (3.0, 10.0):
        shear = np.eye(4)
        shear[0, 1] = np.tan(np.radians(degrees))
        cases.append(Case(f"{name}/sheared_{degrees:g}deg", "shear", name, "1mm",
                          functools.partial(wrong_header, base, shear)))
    for factor, unit in ((10.0, "cm"), (0.1, "0.1mm")):
        cases.append(Case(f"{name}/voxels_in_{unit}", "voxel_size", name, "1mm",
                          functools.partial(wrong_header, base, np.diag([factor] * 3 + [1]))))
    cases.append(Case("blank", "no_head", "", "blank", _blank))
    two_mm = functools.partial(_scan, anatomy, Acquisition((2.0, 2.0, 2.0)), [seed, 81])
    cases.append(Case(f"{name}/crop64_2mm", "field_of_view", name, "2mm",
                      functools.partial(crop_of, two_mm, 64.0)))
    return cases


def crop_of(base: Callable[[], Scan], side_mm: float) -> Scan:
    """A cube of ``side_mm`` from the centre of a scan's field of view."""
    scan = base()
    spacing = voxel_sizes(scan.affine)
    shape = np.asarray(scan.data.shape)
    half = np.round(side_mm / spacing / 2).astype(int)
    lo = np.maximum(shape // 2 - half, 0)
    box = tuple(slice(a, a + 2 * h) for a, h in zip(lo, half))
    affine = scan.affine.copy()
    affine[:3, 3] += affine[:3, :3] @ lo
    labels = None if scan.labels is None else scan.labels[box].copy()
    return dataclasses.replace(scan, data=scan.data[box].copy(), labels=labels, affine=affine,
                               template_to_subject=None)


def _blank() -> Scan:
    """A volume of zeros: a series that recorded nothing."""
    shape = (176, 208, 176)
    return Scan(np.zeros(shape, np.float32), None, _centred_affine(shape), np.eye(4), None)


def wrong_header(base: Callable[[], Scan], error: np.ndarray) -> Scan:
    """A scan whose affine is turned, flipped, sheared or scaled about the image centre."""
    scan = base()
    centre = scan.affine[:3, :3] @ ((np.asarray(scan.data.shape) - 1) / 2) + scan.affine[:3, 3]
    about = np.eye(4)
    about[:3, :3] = error[:3, :3]
    about[:3, 3] = centre - error[:3, :3] @ centre
    return dataclasses.replace(scan, affine=about @ scan.affine, template_to_subject=None)


def slab_of(base: Callable[[], Scan], centre_fraction: float, thickness_mm: float) -> Scan:
    """A slab of ``thickness_mm`` along the slice axis, centred at a fraction of it."""
    scan = base()
    n = scan.data.shape[2]
    spacing = float(voxel_sizes(scan.affine)[2])
    half = int(round(thickness_mm / spacing / 2))
    lo = max(0, min(n - 2 * half, int(round(centre_fraction * n)) - half))
    affine = scan.affine.copy()
    affine[:3, 3] += affine[:3, 2] * lo
    labels = None if scan.labels is None else scan.labels[:, :, lo:lo + 2 * half]
    return dataclasses.replace(scan, data=scan.data[:, :, lo:lo + 2 * half].copy(),
                               labels=labels, affine=affine, template_to_subject=None)


def noise_scan(rng_seed) -> Scan:
    """Rician noise only, in a head-sized field of view."""
    rng = np.random.default_rng(rng_seed)
    shape = (180, 216, 180)
    data = np.hypot(rng.normal(0, 15, shape), rng.normal(0, 15, shape)).astype(np.float32)
    return Scan(data, None, _centred_affine(shape), np.eye(4), None)


def _phantom(rng_seed) -> Scan:
    """A water bottle: a uniform cylinder with soft edges, a bias field and noise."""
    from scipy import ndimage

    rng = np.random.default_rng(rng_seed)
    shape = (180, 216, 180)
    i, j, k = np.indices(shape, sparse=True)
    inside = ((i - 90) ** 2 + (j - 108) ** 2 < 75**2) & (np.abs(k - 90) < 80)
    data = ndimage.gaussian_filter(np.where(inside, 800.0, 0.0).astype(np.float32), 1.5)
    data *= np.exp(0.1 * (k - 90) / 90.0).astype(np.float32)
    data = np.hypot(data + rng.normal(0, 15, shape), rng.normal(0, 15, shape))
    return Scan(data.astype(np.float32), None, _centred_affine(shape), np.eye(4), None)


def _centred_affine(shape) -> np.ndarray:
    affine = np.eye(4)
    affine[:3, 3] = -(np.asarray(shape) - 1) / 2.0
    return affine


# The steps the shipped pipelines run before registering, with their default parameters:
# a pipeline as data, in the YAML form of mriprep/pipelines/ (plausibility is left out:
# the calibration's failures must reach the registration's own checks).
PREPROCESS_PIPELINE = """
name: calibration_preprocess
description: the calibration's scans as registration receives them
stages: [reorient, sanitize, mask_slices]
"""


@functools.lru_cache(maxsize=1)
def _preprocess_pipeline():
    import yaml

    from mriprep.pipelines import pipeline_from_dict

    return pipeline_from_dict(yaml.safe_load(PREPROCESS_PIPELINE), source="calibration")


def preprocessed(scan: Scan, name: str = ""):
    """A scan as the default pipeline hands it to registration: a Volume after
    :data:`PREPROCESS_PIPELINE` (in memory, no file)."""
    from mriprep.core.volume import Volume
    from mriprep.pipelines.execute import run_stages

    volume = Volume.from_array(scan.data, scan.affine, subject_id=name)
    return run_stages(volume, _preprocess_pipeline())
